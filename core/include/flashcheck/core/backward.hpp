// The backward pass's vocabulary: what a backward subject is handed, what it
// returns, and where the forward outputs it is handed come from.
//
// The convention (written once, here): a backward subject is judged on its
// backward alone. It is handed the f64 oracle's forward, O rounded once to the
// problem's dtype and LSE rounded to f32 (what a forward kernel stores), so
// that a subject's forward errors never enter its gradients' verdict, and every
// subject of a case gets the same O and LSE. Fully masked rows and padding
// rows are handed O = 0 and LSE = -inf (the forward's convention); their
// gradients are 0, and they contribute nothing to dK and dV.
#pragma once

#include <limits>
#include <string>

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

/// What a backward subject is handed.
struct BackwardInputs {
  Inputs inputs;     // Q, K, V
  Outputs forward;   // O and LSE, as backward_outputs makes them
  HostTensor dout;   // dO: [batch, heads_q, seqlen_q, dv], the problem's dtype and layout
};

/// What a backward subject returns, in the problem's dtype and layout:
/// dQ [batch, heads_q, seqlen_q, d], dK [batch, heads_kv, seqlen_kv, d] and
/// dV [batch, heads_kv, seqlen_kv, dv], dK and dV summed over the query heads
/// of their GQA group (the subject's job).
struct Gradients {
  HostTensor dq, dk, dv;
};

/// Gradients for a problem, every element poisoned with NaN (so that an
/// element a subject never writes cannot pass).
Gradients make_gradients(const Problem& problem);

/// The O and LSE a backward subject is handed, from the f64 oracle's forward
/// on every row (`reference` must hold all_rows): O rounded once to the dtype,
/// LSE to f32; fully masked and padding rows O = 0, LSE = -inf.
Outputs backward_outputs(const Problem& problem, const AttentionRows& reference);

/// A subject's gradients at the rows of two RowSets (dQ at query rows, dK and
/// dV at key rows), in f64, for comparison with the gradient oracle.
GradientRows gather_gradients(const Problem& problem, const Gradients& gradients, const RowSet& q_rows,
                              const RowSet& kv_rows);

}  // namespace flashcheck
