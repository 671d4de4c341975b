// Tensor transforms for metamorphic properties: permute, slice, trim, repeat
// and concatenate [batch, heads, seq, dim] tensors along an axis, map their
// elements, and the same moves on AttentionRows (a result that holds every
// row), so that a property states its relation without index loops.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck::testing {

/// An axis of a [batch, heads, seq, dim] tensor.
enum class Axis : std::uint8_t { batch, heads, seq, dim };

/// The index of one element.
struct Element {
  std::int64_t b = 0, h = 0, s = 0, c = 0;
};

/// The extent of `t` along `axis`.
std::int64_t extent(const HostTensor& t, Axis axis);

/// Indices [first, first + count) of `axis`.
HostTensor slice(const HostTensor& t, Axis axis, std::int64_t first, std::int64_t count);
/// The first `length` indices of `axis` (slice from 0).
HostTensor trim(const HostTensor& t, Axis axis, std::int64_t length);
/// Each index of `axis` `times` times in a row: index i of the result is index
/// i / times of `t` (K/V heads repeated for their query-head group).
HostTensor repeat(const HostTensor& t, Axis axis, std::int64_t times);
/// Index i of `axis` of the result is index order[i] of `t`; indices past
/// order.size() are kept.
HostTensor permute(const HostTensor& t, Axis axis, const std::vector<std::int64_t>& order);
/// t's values stored at another descale (an fp8 tensor; rounded, saturating).
HostTensor with_descale(const HostTensor& t, double descale);
/// `first` followed by `second` along `axis` (the other extents, the dtype
/// and the descale equal: with_descale makes an fp8 pair alike).
HostTensor concat(const HostTensor& first, const HostTensor& second, Axis axis);

/// `f(x)` on every element (stored rounded to the dtype; an fp8 tensor's
/// descale grows, by powers of two, until it holds the new values' range).
HostTensor map_elements(const HostTensor& t, const std::function<double(double)>& f);
/// `f(element, x)` on every element: a change confined to some indices (an
/// fp8 tensor keeps its descale, so the other elements keep their bits).
HostTensor map_elements(const HostTensor& t, const std::function<double(const Element&, double)>& f);

/// The norm of the finite elements of the valid (unpadded) rows of sequence b,
/// up to length(b); `nonfinite` when one of them is NaN or infinite, `any`
/// when there is one at all.
struct ValidNorm {
  double norm = 0;
  bool any = false, nonfinite = false;
  /// Not all zero: a finite non-zero element, or a NaN/Inf one.
  bool nonzero() const { return norm > 0 || nonfinite; }
};
ValidNorm valid_norm(const HostTensor& t, const std::function<std::int64_t(std::int64_t)>& length);

// ---- per-sequence row permutations -------------------------------------------

/// Per (batch entry, head), a permutation of its first order[b][h].size() rows
/// (each sequence's valid rows: padding stays in place).
using RowOrder = std::vector<std::vector<std::vector<std::int64_t>>>;

/// A uniformly random permutation per head of the first lengths[b] rows of
/// each batch entry, drawn with *rc::gen (it shrinks and replays).
RowOrder draw_row_order(const std::vector<std::int64_t>& lengths, std::int64_t heads);
/// Row s of (b, h) of the result is row order[b][h][s] of `t`.
HostTensor permute_rows(const HostTensor& t, const RowOrder& order);
AttentionRows permute_rows(const AttentionRows& rows, const RowOrder& order);

/// The valid query and key lengths of every sequence of `problem`.
std::vector<std::int64_t> lengths_q(const Problem& problem);
std::vector<std::int64_t> lengths_kv(const Problem& problem);

// ---- AttentionRows holding every row (all_rows) ---------------------------------

/// Batch entry b of `rows` as the rows of `entry`, its single-sequence problem
/// (the first entry.seqlen_q rows).
AttentionRows batch_entry(const AttentionRows& rows, std::int64_t b, const Problem& entry);
/// Rows [first, first + entry.seqlen_q) of every (b, h) of `rows`, as the rows of `entry`.
AttentionRows row_window(const AttentionRows& rows, std::int64_t first, const Problem& entry);

}  // namespace flashcheck::testing
