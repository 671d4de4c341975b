// The paged K/V vocabulary (page=P, issue 25): the field's line, the drawn
// page table, the pool and its logical view, each oracle and cpu-plain read
// through the table, and the two page mutants caught by the judge.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <set>
#include <stdexcept>

#include "flashcheck/core/paging.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/kernels/cpu/fa2_tiles.hpp"
#include "flashcheck/kernels/cpu/plain.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

namespace flashcheck {
namespace {

// Three sequences of 70, 45 and 0 keys in pages of 16, the first two with whole pages to share.
Problem paged_problem(std::uint64_t gseed, Layout layout = Layout::bhsd) {
  Problem p = parse_problem("b=3 hq=4 hkv=2 sq=9 skv=70 lens_q=9,5,3 lens_kv=70,45,0 d=24 dv=8 dtype=bf16 "
                            "mask=causal_br page=16 dseed=5");
  p.geometry_seed = gseed;
  p.layout = layout;
  return p;
}

// Bitwise equality of two row sets' values (NaN where both have the same NaN).
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The contiguous twin of a paged problem, with its logical K and V.
std::pair<Problem, Inputs> contiguous(const Problem& p, const Inputs& in) {
  Problem flat = p;
  flat.page_size = 0;
  return {flat, logical_inputs(p, in)};
}

TEST(Paging, TheFieldIsPrintedAndParsedAndBadValuesAreOneLine) {
  const Problem p = parse_problem("b=1 hq=1 sq=4 skv=40 d=16 dtype=f16 page=16");
  EXPECT_EQ(p.page_size, 16);
  EXPECT_NE(to_line(p).find(" page=16 "), std::string::npos);
  EXPECT_EQ(parse_problem(to_line(p)), p);
  EXPECT_EQ(to_line(parse_problem("b=1 hq=1 sq=4 skv=40 d=16 dtype=f16")).find("page"), std::string::npos);
  for (const auto& [line, reason] : std::vector<std::pair<std::string, std::string>>{
           {"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 page=0", "must be >= 1"},
           {"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 page=-16", "must be >= 1"},
           {"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 page=x", "page"},
           {"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 page=16 pass=bwd", "pass=bwd takes contiguous K/V"}}) {
    try {
      parse_problem(line);
      ADD_FAILURE() << "accepted: " << line;
    } catch (const BadInput& e) {
      EXPECT_EQ(e.field(), "page") << line;
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos) << e.what();
    }
  }
}

// The drawn table: every entry in the pool; the pages a sequence's keys fill
// distinct from every other sequence's, but for prefix pages shared with
// sequence 0; spare pages no key uses; shuffled; the same for the same seed.
TEST(Paging, TheDrawnTableIsShuffledWithSparePagesAndSharedPrefixes) {
  int shared_tables = 0, shuffled_tables = 0;
  for (std::uint64_t gseed = 0; gseed < 64; ++gseed) {
    const Problem p = paged_problem(gseed);
    const PageTable t = draw_page_table(p);
    ASSERT_EQ(page_table_mismatch(p, t), "");
    EXPECT_EQ(t, draw_page_table(p));
    EXPECT_EQ(t.per_sequence, 5);
    std::set<std::int32_t> used;
    std::int64_t sharing = 0;
    for (std::int64_t n = 0; n < 5; ++n) used.insert(t.page(0, n));
    for (std::int64_t n = 0; n < 3; ++n) {  // sequence 1's 45 keys fill 3 pages, 2 whole
      if (t.page(1, n) == t.page(0, n)) {
        ++sharing;
        EXPECT_LT(n, 2) << "only whole pages are shared";
        EXPECT_EQ(sharing, n + 1) << "a shared run is a prefix";
      } else {
        EXPECT_TRUE(used.insert(t.page(1, n)).second) << "a page of sequence 1 is another's";
      }
    }
    EXPECT_GT(t.pages, static_cast<std::int64_t>(used.size())) << "no spare page";
    for (std::int64_t n = 0; n < 5; ++n) EXPECT_EQ(used.count(t.page(2, n)), 0u) << "an empty sequence's entry names a used page";
    shared_tables += sharing > 0;
    bool in_order = true;
    for (std::int64_t n = 0; n < 5; ++n) in_order = in_order && t.page(0, n) == n;
    shuffled_tables += !in_order;
    EXPECT_NE(shuffled_page_table(p, gseed), t);
  }
  EXPECT_GT(shared_tables, 8);
  EXPECT_GT(shuffled_tables, 60);
}

// The pool holds each valid key once and the poison elsewhere (zeros for
// finite values); read back through the table it is the contiguous
// K and V (sequence 1's shared prefix reads sequence 0's keys).
TEST(Paging, ThePoolReadBackThroughTheTableIsTheLogicalKeys) {
  for (const Layout layout : {Layout::bhsd, Layout::bshd}) {
    const Problem p = paged_problem(3, layout);
    Problem flat = p;
    flat.page_size = 0;
    const Inputs generated = generate_inputs(flat), in = generate_inputs(p);
    ASSERT_EQ(in.k.batch(), in.pages.pages);
    ASSERT_EQ(in.k.seqlen(), 16);
    const Inputs logical = logical_inputs(p, in);
    std::int64_t shared = 0;
    while (shared < 2 && in.pages.page(1, shared) == in.pages.page(0, shared)) ++shared;
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
        for (std::int64_t j = 0; j < p.seqlen_kv; ++j)
          for (std::int64_t c = 0; c < p.head_dim; ++c) {
            const double got = logical.k.get(b, hk, j, c);
            if (j >= p.len_kv(b)) EXPECT_EQ(got, 0.0);  // the poison of K's unreached slots
            else if (b == 1 && j < shared * 16) EXPECT_EQ(got, generated.k.get(0, hk, j, c));
            else EXPECT_EQ(got, generated.k.get(b, hk, j, c));
          }
    std::int64_t poisoned_slots = 0;
    for (std::int64_t page = 0; page < in.pages.pages; ++page)
      for (std::int64_t slot = 0; slot < 16; ++slot)
        poisoned_slots += in.v.get(page, 0, slot, 0) == 0.0 && in.k.get(page, 0, slot, 0) == 0.0;
    const std::int64_t valid_slots = 70 + 45 - 16 * shared;
    EXPECT_EQ(poisoned_slots, in.pages.pages * 16 - valid_slots);
    EXPECT_EQ(paged_inputs(p, logical, in.pages).k, in.k);
  }
  // Where the values may be non-finite, so are the subjects' domains: the poison is NaN.
  Problem specials = paged_problem(3);
  specials.values.family = ValueFamily::nan_inf;
  const Inputs in = generate_inputs(specials);
  std::int64_t nan_slots = 0;
  for (std::int64_t page = 0; page < in.pages.pages; ++page)
    for (std::int64_t slot = 0; slot < 16; ++slot)
      nan_slots += std::isnan(in.v.get(page, 0, slot, 0)) && std::isnan(in.k.get(page, 0, slot, 0));
  EXPECT_GE(nan_slots, in.pages.pages * 16 - (70 + 45));
}

// cpu_f64, cpu_lowp, the Kokkos reference, cpu-plain and cpu-fa2-tiles give the paged problem
// the bits of its contiguous twin (the same arithmetic, read through the table).
TEST(Paging, EachOracleAndTheCpuSubjectsReadThroughTheTable) {
  for (const std::uint64_t gseed : {1, 2, 7}) {
    const Problem p = paged_problem(gseed, gseed % 2 ? Layout::bshd : Layout::bhsd);
    const Inputs in = generate_inputs(p);
    const auto [flat, logical] = contiguous(p, in);
    const RowSet rows = all_rows(p);
    const AttentionRows want = cpu_f64_reference(flat, logical, rows);
    EXPECT_TRUE(same_bits(cpu_f64_reference(p, in, rows).o, want.o));
    EXPECT_TRUE(same_bits(cpu_f64_reference(p, in, rows).lse, want.lse));
    EXPECT_TRUE(same_bits(cpu_lowp_rows(p, in, rows, DType::bf16).o, cpu_lowp_rows(flat, logical, rows, DType::bf16).o));
    if (kokkos_available()) {
      EXPECT_TRUE(same_bits(kokkos_reference(p, in, rows, Accumulation::f64).o,
                            kokkos_reference(flat, logical, rows, Accumulation::f64).o));
      EXPECT_TRUE(same_bits(kokkos_baseline(p, in, rows, DType::bf16).o, kokkos_baseline(flat, logical, rows, DType::bf16).o));
    }
    CpuPlain plain;
    CpuFa2Tiles tiles;
    for (Subject* subject : std::initializer_list<Subject*>{&plain, &tiles}) {
      const RunResult paged_run = subject->run(p, in), flat_run = subject->run(flat, logical);
      ASSERT_EQ(paged_run.status, Status::ok) << paged_run.message;
      EXPECT_EQ(paged_run.outputs.o, flat_run.outputs.o) << subject->name();
      EXPECT_TRUE(same_bits(paged_run.outputs.lse, flat_run.outputs.lse)) << subject->name();
      EXPECT_EQ(judge(*subject, p).verdict_kind, VerdictKind::pass) << subject->name();
    }
  }
}

TEST(Paging, InputsWithoutTheirTableAreAnErrorNotAContiguousRead) {
  const Problem p = paged_problem(1);
  Inputs in = generate_inputs(p);
  in.pages = {};
  EXPECT_THROW(cpu_f64_reference(p, in, all_rows(p)), std::invalid_argument);
  EXPECT_THROW(cpu_lowp_rows(p, in, all_rows(p), DType::bf16), std::invalid_argument);
  if (kokkos_available()) EXPECT_THROW(kokkos_reference(p, in, all_rows(p), Accumulation::f64), std::invalid_argument);
  CpuPlain plain;
  CpuFa2Tiles tiles;
  EXPECT_EQ(plain.run(p, in).status, Status::error);
  EXPECT_EQ(tiles.run(p, in).status, Status::error);
  EXPECT_THROW(paged_inputs(p, generate_inputs(contiguous(p, generate_inputs(p)).first), PageTable{}), std::invalid_argument);
}

// The two page flaws: the judge fails them on a paged problem, and they are
// the real kernel on contiguous K/V.
TEST(Paging, ThePageMutantsFailAPagedCaseAndPassAContiguousOne) {
  for (const PlainFlaw flaw : {PlainFlaw::page_table_ignored, PlainFlaw::page_off_by_one}) {
    CpuPlain mutant("m", "", flaw);
    EXPECT_EQ(judge(mutant, paged_problem(2)).verdict_kind, VerdictKind::fail);
    Problem flat = paged_problem(2);
    flat.page_size = 0;
    EXPECT_EQ(judge(mutant, flat).verdict_kind, VerdictKind::pass);
  }
}

TEST(Paging, ASubjectWithoutPagesRefusesThem) {
  Capabilities caps = kCpuPlainCapabilities;
  caps.min_page_size = 0;
  EXPECT_NE(unsupported_reason(caps, paged_problem(1)), std::nullopt);
  caps.min_page_size = 32;
  EXPECT_NE(unsupported_reason(caps, paged_problem(1))->find("at least 32"), std::string::npos);
  caps.min_page_size = 16;
  EXPECT_EQ(unsupported_reason(caps, paged_problem(1)), std::nullopt);
  // Powers of two only (cuDNN's page tables): 16 is one, 17 and 48 are not.
  caps.min_page_size = 1;
  caps.page_size_power_of_two = true;
  EXPECT_EQ(unsupported_reason(caps, paged_problem(1)), std::nullopt);
  for (const std::int64_t size : {17, 48}) {
    Problem odd = paged_problem(1);
    odd.page_size = size;
    EXPECT_NE(unsupported_reason(caps, odd)->find("powers of two"), std::string::npos) << size;
  }
  Problem backward = paged_problem(1);  // built, not parsed: parse_problem refuses it first
  backward.pass = Pass::bwd;
  EXPECT_NE(unsupported_reason(caps, backward)->find("the forward's"), std::string::npos);
}

}  // namespace
}  // namespace flashcheck
