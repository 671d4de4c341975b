// Input generation: every value family of the Problem vocabulary, deterministic
// from the problem's seeds and independent of the number of threads.
//
// The value at a logical position (tensor, b, h, s, c) depends only on the
// data seed, the geometry seed (for structure: which key dominates, which rows
// repeat, where NaN/Inf go) and that position, never on the layout, so the same
// problem in BHSD and BSHD holds the same numbers.
#pragma once

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

/// Draws Q, K and V for a problem, each rounded to the problem's dtype.
Inputs generate_inputs(const Problem& problem);

/// Draws dO for a backward problem ([batch, heads_q, seqlen_q, dv], the
/// problem's dtype and layout) from Problem::dout, with the same seeds and
/// counters that never meet those of Q, K and V.
HostTensor generate_dout(const Problem& problem);

}  // namespace flashcheck
