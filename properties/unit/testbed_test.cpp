// flashcheck::testing's pieces on their own: the tensor transforms against
// hand-indexed elements, the LSE merge against the whole, and the reference
// cache's hits, misses, bound and exactness.
#include <gtest/gtest.h>

#include <cmath>

#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/testing/reference_cache.hpp"
#include "flashcheck/testing/relations.hpp"
#include "flashcheck/testing/transforms.hpp"

namespace flashcheck::testing {
namespace {

// A [2, 3, 5, 4] tensor whose element (b, h, s, c) is 1000 b + 100 h + 10 s + c (exact in f32).
HostTensor numbered(Layout layout = Layout::bhsd) {
  HostTensor t(DType::f32, layout, 2, 3, 5, 4);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t s = 0; s < 5; ++s)
        for (std::int64_t c = 0; c < 4; ++c) t.set(b, h, s, c, 1000.0 * b + 100.0 * h + 10.0 * s + c);
  return t;
}

TEST(Transforms, SliceTrimRepeatPermuteConcatMoveTheIndices) {
  for (const Layout layout : {Layout::bhsd, Layout::bshd}) {
    const HostTensor t = numbered(layout);
    const HostTensor rows = slice(t, Axis::seq, 1, 3);
    ASSERT_EQ(rows.seqlen(), 3);
    EXPECT_EQ(rows.get(1, 2, 0, 3), t.get(1, 2, 1, 3));
    EXPECT_EQ(rows.get(0, 1, 2, 0), t.get(0, 1, 3, 0));
    const HostTensor entry = trim(slice(t, Axis::batch, 1, 1), Axis::seq, 2);
    ASSERT_EQ(entry.batch(), 1);
    ASSERT_EQ(entry.seqlen(), 2);
    EXPECT_EQ(entry.get(0, 2, 1, 1), t.get(1, 2, 1, 1));
    const HostTensor heads = repeat(t, Axis::heads, 2);
    ASSERT_EQ(heads.heads(), 6);
    for (std::int64_t h = 0; h < 6; ++h) EXPECT_EQ(heads.get(1, h, 4, 2), t.get(1, h / 2, 4, 2));
    const HostTensor reversed = permute(t, Axis::dim, {3, 2, 1, 0});
    EXPECT_EQ(reversed.get(0, 0, 0, 0), t.get(0, 0, 0, 3));
    EXPECT_EQ(reversed.get(1, 1, 1, 2), t.get(1, 1, 1, 1));
    const HostTensor partly = permute(t, Axis::seq, {1, 0});  // rows past the order stay
    EXPECT_EQ(partly.get(0, 0, 0, 0), t.get(0, 0, 1, 0));
    EXPECT_EQ(partly.get(0, 0, 4, 0), t.get(0, 0, 4, 0));
    const HostTensor joined = concat(slice(t, Axis::seq, 0, 2), slice(t, Axis::seq, 2, 3), Axis::seq);
    EXPECT_TRUE(joined == t);
    const HostTensor mapped = map_elements(t, [](const Element& e, double x) { return e.h == 1 ? -x : x; });
    EXPECT_EQ(mapped.get(1, 1, 2, 3), -t.get(1, 1, 2, 3));
    EXPECT_EQ(mapped.get(1, 2, 2, 3), t.get(1, 2, 2, 3));
  }
  EXPECT_THROW(slice(numbered(), Axis::seq, 3, 3), std::out_of_range);
  EXPECT_THROW(concat(numbered(), slice(numbered(), Axis::heads, 0, 1), Axis::seq), std::invalid_argument);
}

TEST(Transforms, RowOrderPermutesEachSequenceAlone) {
  const HostTensor t = numbered();
  const RowOrder order = {{{2, 0, 1}, {0, 1, 2}, {1, 0, 2}}, {{4, 3, 2, 1, 0}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}}};
  const HostTensor moved = permute_rows(t, order);
  EXPECT_EQ(moved.get(0, 0, 0, 1), t.get(0, 0, 2, 1));
  EXPECT_EQ(moved.get(0, 0, 3, 1), t.get(0, 0, 3, 1));  // past the sequence's 3 rows: kept
  EXPECT_EQ(moved.get(1, 0, 1, 0), t.get(1, 0, 3, 0));
}

// Two key halves merged through LSE equal the whole, in f64 (to rounding).
TEST(Relations, MergeByLseOfKeyHalvesIsTheWhole) {
  Problem p = make_problem(1, 2, 2, 7, 12, 8, DType::f32);
  p.values = ValueDist{ValueFamily::normal, {0.5, 1.0}};
  const Inputs in = generate_inputs(p);
  Problem first = p, second = p;
  first.seqlen_kv = 5;
  second.seqlen_kv = 7;
  const auto half = [&](const Problem& q, std::int64_t from) {
    const Inputs part{in.q, slice(in.k, Axis::seq, from, q.seqlen_kv), slice(in.v, Axis::seq, from, q.seqlen_kv)};
    return cpu_f64_reference(q, part, all_rows(q));
  };
  const Merged merged = merge_by_lse(p, half(first, 0), half(second, 5));
  const AttentionRows whole = cpu_f64_reference(p, in, all_rows(p));
  for (std::size_t n = 0; n < whole.o.size(); ++n) EXPECT_NEAR(merged.rows.o[n], whole.o[n], 1e-12);
  for (std::size_t n = 0; n < whole.lse.size(); ++n) EXPECT_NEAR(merged.rows.lse[n], whole.lse[n], 1e-12);
  EXPECT_GT(merged.weight_sensitivity, 0);
}

TEST(ReferenceCache, HitsOnTheSameCaseOnlyAndStaysBounded) {
  ReferenceCache cache;
  const Problem p = make_problem(1, 2, 1, 9, 11, 16, DType::bf16, MaskKind::causal_br);
  const Inputs in = generate_inputs(p);
  const AttentionRows direct = cpu_f64_reference(p, in, all_rows(p), /*with_condition=*/true);
  const AttentionRows first = cache.reference(p, in, all_rows(p));
  const AttentionRows again = cache.reference(p, in, all_rows(p));
  EXPECT_EQ(cache.stats().misses, 1);
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_EQ(again.o, direct.o);
  EXPECT_EQ(again.lse, direct.lse);
  EXPECT_EQ(again.o_condition, direct.o_condition);
  // One element of V changed, or another seed in the problem: another case.
  Inputs changed = in;
  changed.v.set(0, 0, 3, 5, changed.v.get(0, 0, 3, 5) + 1);
  cache.reference(p, changed, all_rows(p));
  Problem reseeded = p;
  reseeded.data_seed += 1;
  cache.reference(reseeded, in, all_rows(p));
  EXPECT_EQ(cache.stats().misses, 3);
  // Baselines per working dtype, beside the reference.
  cache.baseline(p, in, all_rows(p), DType::bf16);
  cache.baseline(p, in, all_rows(p), DType::f32);
  cache.baseline(p, in, all_rows(p), DType::bf16);
  EXPECT_EQ(cache.stats().hits, 2);
  EXPECT_EQ(cache.stats().entries, 3);
  // A sample of rows is computed, not kept.
  const RowSet two{{0, 8}};
  cache.reference(p, in, two);
  EXPECT_EQ(cache.stats().entries, 3);
  // The bound: evicting down to it, least recently used first.
  const std::int64_t full = cache.stats().bytes;
  cache.set_capacity_bytes(full / 2);
  EXPECT_LE(cache.stats().bytes, full / 2);
  EXPECT_GT(cache.stats().evictions, 0);
  cache.reference(p, in, all_rows(p));  // p was used last: kept
  EXPECT_EQ(cache.stats().hits, 3);
  cache.set_capacity_bytes(0);
  EXPECT_EQ(cache.stats().entries, 0);
  EXPECT_EQ(cache.stats().bytes, 0);
  cache.reference(p, in, all_rows(p));  // computed, not kept
  EXPECT_EQ(cache.stats().entries, 0);
}

}  // namespace
}  // namespace flashcheck::testing
