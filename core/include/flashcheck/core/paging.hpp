// The page table of a paged K/V cache (Problem::page_size): which pool page
// holds each sequence's n-th page of keys.
//
// Serving stacks (vLLM, FlashInfer, FlashAttention's paged KV) keep K and V in
// a pool of fixed-size pages and hand the kernel a table per sequence; the
// bugs live in the table's reading (FlashInfer #3219: scattered pages read as
// zeros), and an in-order table hides a kernel that ignores it. So the table
// drawn here is shuffled, leaves spare pages the sequences never use, and
// shares whole prefix pages between sequences (prefix caching).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashcheck/core/problem.hpp"

namespace flashcheck {

struct PageTable {
  /// Keys a page (Problem::page_size; 0: contiguous K/V, no table).
  std::int64_t page_size = 0;
  /// Pages in the pool (the K and V pool tensors' batch extent).
  std::int64_t pages = 0;
  /// Entries a sequence: ceil(seqlen_kv / page_size), over the padded length.
  std::int64_t per_sequence = 0;
  /// [batch, per_sequence] row-major: the pool page of sequence b's n-th page.
  /// An entry past the pages a sequence's keys fill names a spare page (one
  /// no key lives in), as a serving stack's padding entries do.
  std::vector<std::int32_t> entries;

  bool paged() const { return page_size > 0; }
  std::int32_t page(std::int64_t b, std::int64_t n) const { return entries[static_cast<std::size_t>(b * per_sequence + n)]; }
  /// The pool page and slot of key j of sequence b.
  std::int64_t page_of(std::int64_t b, std::int64_t j) const { return page(b, j / page_size); }
  std::int64_t slot_of(std::int64_t j) const { return j % page_size; }
  bool operator==(const PageTable&) const = default;
};

/// The table of a paged problem, from its geometry seed (an empty table for
/// contiguous K/V): sequence b > 0 shares its first k whole pages with
/// sequence 0 in half the draws (k up to the whole pages both hold), every
/// other page is its own, the pool holds 1 to 1 + pages / 4 spare pages, and
/// the pool's pages are handed out in a shuffled order.
PageTable draw_page_table(const Problem& problem);

/// Another table for `problem`, drawn as draw_page_table's with `salt` mixed
/// into the seed and no page shared: the page-table invariance property's
/// second table.
PageTable shuffled_page_table(const Problem& problem, std::uint64_t salt);

/// Checks a table against its problem (sizes, entries inside the pool); the
/// reason it does not fit, or empty.
std::string page_table_mismatch(const Problem& problem, const PageTable& table);

}  // namespace flashcheck
