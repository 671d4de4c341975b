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
/// through the table). Every slot no valid key reaches (a spare page, the
/// tail of a sequence's last page) holds a poison, as a serving stack's stale
/// cache holds garbage: NaN in K and V where the problem's values are nan_inf
/// (its subjects take non-finite inputs), so any read past the table shows,
/// weighted or not; else zeros, which a masked key weighted by an exact 0
/// leaves unseen (a tile kernel that loads a page's tail and masks it, as
/// cuDNN does, is right: a NaN there would be outside its declared domain)
/// and a read past the table with any weight dilutes O. Zeros, not a large
/// finite value: the judge's bounds take max |K| and max |V| over the inputs
/// handed to it, and a poison must not widen them.
Inputs paged_inputs(const Problem& problem, const Inputs& contiguous, const PageTable& table);

/// The logical, contiguous K and V of paged inputs, read through the table
/// ([batch, heads_kv, seqlen_kv, dim], the keys past a sequence's length
/// holding paged_inputs' poison), with the table emptied; contiguous inputs
/// as they are.
Inputs logical_inputs(const Problem& problem, const Inputs& inputs);

/// Draws dO for a backward problem ([batch, heads_q, seqlen_q, dv], the
/// problem's dtype and layout) from Problem::dout, with the same seeds and
/// counters that never meet those of Q, K and V.
HostTensor generate_dout(const Problem& problem);

}  // namespace flashcheck
