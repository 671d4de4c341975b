#include "flashcheck/core/paging.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "flashcheck/core/random.hpp"

namespace flashcheck {
namespace {

constexpr std::uint64_t kPageStream = 0x70616765;  // "page"

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

PageTable make_table(const Problem& p, const CounterRng& rng, bool share) {
  PageTable t;
  if (p.page_size <= 0) return t;
  t.page_size = p.page_size;
  t.per_sequence = ceil_div(p.seqlen_kv, p.page_size);
  std::vector<std::int64_t> filled(static_cast<std::size_t>(p.batch)), shared(filled.size(), 0);
  std::int64_t own = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    filled[b] = ceil_div(p.len_kv(b), p.page_size);
    if (share && b > 0 && rng.bits(static_cast<std::uint64_t>(2 * b)) % 2 == 1) {
      const std::int64_t whole = std::min(p.len_kv(0), p.len_kv(b)) / p.page_size;
      shared[b] = static_cast<std::int64_t>(rng.bits(static_cast<std::uint64_t>(2 * b + 1)) %
                                            static_cast<std::uint64_t>(whole + 1));
    }
    own += filled[b] - shared[b];
  }
  const std::int64_t spare = 1 + static_cast<std::int64_t>(rng.bits(0x7370617265) % static_cast<std::uint64_t>(own / 4 + 1));
  t.pages = own + spare;
  // Fisher-Yates over the pool's pages, on the counter generator.
  std::vector<std::int32_t> order(static_cast<std::size_t>(t.pages));
  std::iota(order.begin(), order.end(), 0);
  for (std::int64_t n = t.pages - 1; n > 0; --n) {
    const auto k = static_cast<std::int64_t>(rng.bits(static_cast<std::uint64_t>(0x1000000 + n)) %
                                             static_cast<std::uint64_t>(n + 1));
    std::swap(order[n], order[k]);
  }
  t.entries.assign(static_cast<std::size_t>(p.batch * t.per_sequence), 0);
  std::int64_t next = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t n = 0; n < t.per_sequence; ++n) {
      std::int32_t& entry = t.entries[static_cast<std::size_t>(b * t.per_sequence + n)];
      if (n < shared[b]) entry = t.page(0, n);
      else if (n < filled[b]) entry = order[next++];
      else entry = order[own];  // the first spare
    }
  return t;
}

}  // namespace

PageTable draw_page_table(const Problem& p) { return make_table(p, CounterRng(p.geometry_seed, kPageStream), true); }

PageTable shuffled_page_table(const Problem& p, std::uint64_t salt) {
  return make_table(p, CounterRng(p.geometry_seed ^ mix64(salt + 1), kPageStream + 1), false);
}

std::string page_table_mismatch(const Problem& p, const PageTable& t) {
  if (t.page_size != p.page_size)
    return fmt::format("the page table is for pages of {} keys, the problem's are {}", t.page_size, p.page_size);
  if (!t.paged()) return {};
  if (t.per_sequence * t.page_size < p.seqlen_kv)
    return fmt::format("the page table's {} entries a sequence hold {} keys, fewer than skv={}", t.per_sequence,
                       t.per_sequence * t.page_size, p.seqlen_kv);
  if (static_cast<std::int64_t>(t.entries.size()) != p.batch * t.per_sequence)
    return fmt::format("the page table has {} entries, not b x {} = {}", t.entries.size(), t.per_sequence,
                       p.batch * t.per_sequence);
  for (const std::int32_t entry : t.entries)
    if (entry < 0 || entry >= t.pages) return fmt::format("page table entry {} is outside the pool's {} pages", entry, t.pages);
  return {};
}

}  // namespace flashcheck
