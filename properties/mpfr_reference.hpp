// Attention and its gradients at 256 bits with MPFR, for checking the f64
// oracles' own accuracy on small problems. Plain two-pass formulas; every
// operation rounds to 256 bits, so the result is exact to far below f64
// resolution.
#pragma once

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

inline constexpr int kMpfrBits = 256;

/// Whether this build has MPFR.
bool mpfr_available();

/// O and LSE for every row, rounded to f64 at the end. Also returns, per row
/// and column, sum_j p_j |V[j, c]| (the condition of the weighted sum), for
/// the error bound. Throws std::runtime_error without MPFR.
struct MpfrAttention {
  AttentionRows rows;
  std::vector<double> abs_weighted;  // [b][h][row][c], like rows.o
};
MpfrAttention mpfr_attention(const Problem& problem, const Inputs& inputs);

/// dQ, dK and dV on every row (all_rows, all_key_rows) for the upstream
/// gradient `dout`, by the formulas of issue 22 in straightforward loops:
///   P = softmax(S) over the visible keys; O = P V; D_i = rowsum(dO_i o O_i);
///   dP = dO V^T; dS = P o (dP - D); dQ = scale dS K; dK = scale dS^T Q
///   (summed over the query heads of a GQA group); dV = P^T dO (likewise).
/// Every sum is kept at kMpfrBits and rounded to f64 once, at the end. Fully
/// masked and padding rows contribute nothing and have dQ = 0. Small
/// problems only (every (row, key) pair of every head at 256 bits). Throws
/// std::runtime_error without MPFR.
GradientRows mpfr_gradients(const Problem& problem, const Inputs& inputs, const HostTensor& dout);

}  // namespace flashcheck
