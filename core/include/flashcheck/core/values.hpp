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

/// Draws Q, K and V for a problem, each rounded to the problem's dtype. A
/// paged problem's K and V are drawn as its contiguous twin's and stored in
/// the pool of draw_page_table(problem) (paged_inputs).
Inputs generate_inputs(const Problem& problem);

/// Contiguous K and V (a problem's, with page_size ignored) stored in the
/// pool of `table`: each sequence's valid keys go to their page's slots, the
/// first sequence to reach a shared page writing it (a sharing sequence then
/// reads those keys as the first one's: the logical K/V are the pool's, read
/// through the table); every slot no valid key reaches (a spare page, the
/// tail of a sequence's last page) holds NaN, as a serving stack's unwritten
/// cache may, so that a read past the table is seen.
Inputs paged_inputs(const Problem& problem, const Inputs& contiguous, const PageTable& table);

/// The logical, contiguous K and V of paged inputs, read through the table
/// ([batch, heads_kv, seqlen_kv, dim], the keys past a sequence's length
/// NaN), with the table emptied; contiguous inputs as they are.
Inputs logical_inputs(const Problem& problem, const Inputs& inputs);

/// Draws dO for a backward problem ([batch, heads_q, seqlen_q, dv], the
/// problem's dtype and layout) from Problem::dout, with the same seeds and
/// counters that never meet those of Q, K and V.
HostTensor generate_dout(const Problem& problem);

}  // namespace flashcheck
