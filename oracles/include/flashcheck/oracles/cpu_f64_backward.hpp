// cpu_f64's backward: the float64 gradients of attention.
//
// For O = softmax(S) V with S = scale Q K^T (masked keys absent), and the
// upstream gradient dO:
//   P = softmax(S);  dV = P^T dO;  dP = dO V^T;  D_i = rowsum(dO_i o O_i);
//   dS = P o (dP - D);  dQ = scale dS K;  dK = scale dS^T Q.
// D_i is taken as sum_j P_ij dP_ij, which equals rowsum(dO_i o O_i) for the
// exact O: the oracle is the gradient of the function of Q, K, V, not of a
// rounded O (a subject that is handed the rounded O pays for it in its error,
// and so does the same-precision baseline it is measured against).
//
// The products go through BLAS dgemm, blocked over query rows as the forward
// is, the blocks in parallel (OpenMP). dK and dV are summed over every query
// row and over the query heads of a GQA group, in a fixed order (the blocks'
// partial sums are added block by block), so that the result does not depend
// on the thread count. Masks, varlen and padding are read from the Problem
// as cpu_f64's forward reads them (oracles/cpu_f64_rows.hpp); nothing is
// shared with kernels/. Fully masked query rows have zero gradients and contribute
// nothing; masked keys are absent, never multiplied by zero (non-finite
// inputs follow IEEE arithmetic through the visible entries only).
#pragma once

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

/// The f64 gradients on `q_rows` (dQ) and `kv_rows` (dK, dV) for the upstream
/// gradient `dout` ([batch, heads_q, seqlen_q, dv], any dtype and layout).
GradientRows cpu_f64_gradients(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                               const RowSet& q_rows, const RowSet& kv_rows);

}  // namespace flashcheck
