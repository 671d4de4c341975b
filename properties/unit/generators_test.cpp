// The capability-driven generator's shares, measured over a fixed stream of
// draws: vacuous cases (no query row that sees a key), the GQA ratios, the
// long contexts, and RC_PRE's discards inside the generator.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "flashcheck/kernels/cpu/plain.hpp"
#include "flashcheck/generators/generators.hpp"

namespace flashcheck {
namespace {

// The mma.sync family's domain as kernels/common/launch.cuh declares it (kMmaCapabilities)
// (kMmaCapabilities; a CUDA header, so copied here for the host build).
constexpr Capabilities kMmaLikeCapabilities = {
    .dtypes = {DType::f16, DType::bf16},
    .head_dims = {64, 128, 256},
    .head_dim_v_equal = true,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .nonfinite_inputs = false,
    .tile_q = 64,
    .tile_kv = 64,
    .needs_gpu = true,
    .min_compute_capability = 80,
};

// decode's domain (kernels/decode/decode.cuh): at most 16 queries.
constexpr Capabilities kDecodeLikeCapabilities = [] {
  Capabilities caps = kMmaLikeCapabilities;
  caps.max_seqlen_q = 16;
  caps.tile_q = 4;
  caps.tile_kv = 96;
  return caps;
}();

struct Draws {
  std::vector<Problem> problems;
  int discarded = 0;  // draws the generator itself discarded (RC_PRE inside it)
};

// `count` draws at RapidCheck sizes 0..100, as the sweep draws them (one
// random key per draw), counting the generator's own discards.
Draws draw(const rc::Gen<Problem>& gen, int count) {
  Draws draws;
  for (int k = 0; draws.problems.size() < static_cast<std::size_t>(count); ++k) {
    if (draws.discarded > 20 * count + 1000) throw std::runtime_error("the generator discards nearly every draw");
    const rc::Random random(rc::Random::Key{7, static_cast<std::uint64_t>(k), 0x67656e73ull, 0});
    try {
      draws.problems.push_back(gen(random, k * 37 % 101).value());
    } catch (const rc::detail::CaseResult&) {
      ++draws.discarded;
    } catch (const rc::GenerationFailure&) {
      ++draws.discarded;
    }
  }
  return draws;
}

double vacuous_share(const std::vector<Problem>& problems) {
  int vacuous = 0;
  for (const Problem& p : problems) vacuous += visible_rows(p) == 0;
  return static_cast<double>(vacuous) / static_cast<double>(problems.size());
}

struct Domain {
  const char* name;
  const Capabilities* caps;
};
const Domain kDomains[] = {{"cpu-plain", &kCpuPlainCapabilities}, {"mma", &kMmaLikeCapabilities},
                           {"decode", &kDecodeLikeCapabilities}};

TEST(Generators, VacuousShareIsAtMostFivePercent) {
  for (const Domain& domain : kDomains) {
    const Draws draws = draw(gen_problem_in(*domain.caps), 2000);
    const double share = vacuous_share(draws.problems);
    const double discard_rate = static_cast<double>(draws.discarded) / (draws.discarded + 2000.0);
    std::printf("%-10s vacuous share %.1f%%, generator discards %.1f%% (of %d draws)\n", domain.name, 100 * share,
                100 * discard_rate, draws.discarded + 2000);
    EXPECT_LE(share, 0.05) << domain.name;
    EXPECT_LE(discard_rate, 0.10) << domain.name;
  }
}

TEST(Generators, VacuousOnlyDrawsOnlyEmptyOrFullyMaskedShapes) {
  for (const Domain& domain : kDomains) {
    const Draws draws = draw(gen_problem_in(*domain.caps, {.vacuous_only = true}), 500);
    EXPECT_EQ(vacuous_share(draws.problems), 1.0) << domain.name;
    EXPECT_LE(draws.discarded, 50) << domain.name;
    std::map<std::string, int> shapes;
    for (const Problem& p : draws.problems)
      ++shapes[p.padded() ? "padded" : p.seqlen_q == 0 ? (p.seqlen_kv == 0 ? "both" : "sq=0") : "skv=0"];
    for (const char* shape : {"padded", "both", "sq=0", "skv=0"})
      EXPECT_GE(shapes[shape], 500 / 10) << domain.name << " " << shape;  // each about 1 in 4
  }
  // A domain without empty sequences (cuDNN) has no vacuous shape at all.
  Capabilities no_empty = kMmaLikeCapabilities;
  no_empty.empty_sequences = false;
  EXPECT_THROW(draw(gen_problem_in(no_empty, {.vacuous_only = true}), 1), std::runtime_error)
      << "every draw is discarded";
}

std::map<std::string, int> gqa_counts(const std::vector<Problem>& problems, const Capabilities& caps) {
  std::map<std::string, int> counts;
  for (const Problem& p : problems)
    for (const std::string& label : coverage_labels(p, caps))
      if (label.rfind("gqa=", 0) == 0) ++counts[label];
  return counts;
}

TEST(Generators, GqaRatiosAreDrawnEvenly) {
  for (const Domain& domain : kDomains) {
    const Draws draws = draw(gen_problem_in(*domain.caps), 2000);
    const auto counts = gqa_counts(draws.problems, *domain.caps);
    for (const char* label : {"gqa=1", "gqa=2", "gqa=4", "gqa=8", "gqa=mqa"}) {
      const double share = counts.count(label) ? counts.at(label) / 2000.0 : 0.0;
      std::printf("%-10s %-8s %.1f%%\n", domain.name, label, 100 * share);
      EXPECT_GE(share, 0.15) << domain.name << " " << label;  // 20% each
      EXPECT_LE(share, 0.25) << domain.name << " " << label;
    }
  }
}

TEST(Generators, GroupedHeadsOnlyDrawsTrueGroupingEvenly) {
  std::map<std::string, int> counts;
  for (int k = 0; k < 2000; ++k) {
    const rc::Random random(rc::Random::Key{7, static_cast<std::uint64_t>(k), 0x67716121ull, 0});
    const auto [heads_q, heads_kv] = gen_grouped_heads(kMmaLikeCapabilities, true)(random, 50).value();
    ASSERT_LT(heads_kv, heads_q);
    ASSERT_EQ(heads_q % heads_kv, 0);
    Problem p;
    p.heads_q = heads_q, p.heads_kv = heads_kv;
    ++counts[coverage_labels(p)[2]];
  }
  for (const char* label : {"gqa=2", "gqa=4", "gqa=8", "gqa=mqa"}) {
    EXPECT_GE(counts[label], 2000 * 0.20) << label;  // 25% each
    EXPECT_LE(counts[label], 2000 * 0.30) << label;
  }
  Capabilities no_gqa = kCpuPlainCapabilities;
  no_gqa.gqa = false;
  const rc::Random random(rc::Random::Key{7, 1, 2, 3});
  const auto [heads_q, heads_kv] = gen_grouped_heads(no_gqa)(random, 50).value();
  EXPECT_EQ(heads_q, heads_kv);
}

// Every drawn problem passes validate()'s memory limit on a host of 8 GiB
// (the default limit is half of physical memory): the properties never meet
// a generated problem refused for its size on a small CI machine.
TEST(Generators, EveryDrawnProblemFitsTheMemoryLimitOfAn8GiBHost) {
  for (const Domain& domain : kDomains) {
    double largest = 0;
    std::string largest_line;
    for (bool long_contexts : {false, true})
      for (const Problem& p : draw(gen_problem_in(*domain.caps, {.long_contexts = long_contexts}), 1000).problems)
        if (estimated_memory_bytes(p) > largest) {
          largest = estimated_memory_bytes(p);
          largest_line = to_line(p);
        }
    std::printf("%-10s largest memory estimate %.2f GiB: %s\n", domain.name, largest / (1 << 30), largest_line.c_str());
    EXPECT_LE(largest, 4.0 * (1 << 30)) << largest_line;
  }
}

TEST(Generators, LongContextsOnlyWhenAskedAndWithinTheDomain) {
  for (const Domain& domain : kDomains) {
    const Draws without = draw(gen_problem_in(*domain.caps), 1000);
    for (const Problem& p : without.problems) ASSERT_LE(std::max(p.seqlen_q, p.seqlen_kv), 1025) << to_line(p);
    const Draws with = draw(gen_problem_in(*domain.caps, {.long_contexts = true}), 4000);
    int long_cases = 0;
    std::int64_t longest_kv = 0;
    for (const Problem& p : with.problems) {
      ASSERT_FALSE(unsupported_reason(*domain.caps, p)) << to_line(p);
      if (std::max(p.seqlen_q, p.seqlen_kv) >= 4096) {
        ++long_cases;
        longest_kv = std::max(longest_kv, p.seqlen_kv);
        if (p.seqlen_q <= 16) EXPECT_GE(p.seqlen_kv, 32768) << to_line(p);
        else EXPECT_EQ(p.seqlen_q, p.seqlen_kv) << to_line(p);
        if (!domain.caps->needs_gpu) {
          EXPECT_LE(p.seqlen_q, 4096) << to_line(p);
        }
        EXPECT_LE(p.storage_bytes() * 3, double(1 << 30)) << to_line(p);
      }
    }
    const double share = long_cases / 4000.0;
    std::printf("%-10s long contexts %.2f%%, longest seqlen_kv %lld\n", domain.name, 100 * share,
                static_cast<long long>(longest_kv));
    // 1 in 40 for a GPU subject, 1 in 400 for a CPU one (which computes every row).
    EXPECT_GE(share, domain.caps->needs_gpu ? 0.01 : 0.0005) << domain.name;
    EXPECT_LE(share, domain.caps->needs_gpu ? 0.05 : 0.01) << domain.name;
    EXPECT_EQ(longest_kv, 262144) << domain.name;
    EXPECT_LE(vacuous_share(with.problems), 0.05) << domain.name;
  }
}

TEST(Generators, NearOverflowValuesKeepTheAccumulatorInRange) {
  // |V| * seqlen_kv stays under f32's maximum for every key count drawn, so a
  // one-pass kernel (Capabilities::accumulator_max) never meets its declared limit.
  for (const std::int64_t keys : {1, 2048, 131072, 262144}) {
    for (const DType dtype : {DType::f16, DType::bf16}) {
      for (int k = 0; k < 300; ++k) {
        const rc::Random random(rc::Random::Key{7, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(keys), 9});
        const ValueDist dist = gen_values_for(dtype, dtype, 64, false, keys)(random, 50).value();
        if (dist.family != ValueFamily::near_overflow) continue;
        Problem p = make_problem(1, 1, 1, 1, keys, 64, dtype);
        p.values = dist;
        const double magnitude = *stated_input_magnitude(p);
        EXPECT_LT(magnitude * static_cast<double>(keys), std::numeric_limits<float>::max()) << to_string(dist);
      }
    }
  }
}

TEST(Generators, RetypingAProblemKeepsItsValuesMagnitudes) {
  // near_overflow(1000, 0.5) drawn for f16 is half of f16's maximum; stored in
  // f32 it must stay there, not become half of f32's.
  Problem p = make_problem(1, 1, 1, 4, 64, 16, DType::f16);
  p.values = ValueDist{ValueFamily::near_overflow, {1000.0, 0.5}};
  const Problem q = retyped(p, DType::f32);
  EXPECT_EQ(q.dtype, DType::f32);
  EXPECT_DOUBLE_EQ(*stated_input_magnitude(q), *stated_input_magnitude(p));
  EXPECT_DOUBLE_EQ(q.values.params[0], 1000.0);
  // Other families are not fractions of the dtype's range: unchanged.
  p.values = ValueDist{ValueFamily::normal, {0.5, 2.0}};
  EXPECT_EQ(retyped(p, DType::f32).values.params, p.values.params);
}

TEST(Generators, CoverageLabelsNameOneClassPerDimension) {
  Problem p = make_problem(2, 8, 2, 65, 0, 64, DType::bf16, MaskKind::causal_br);
  const auto labels = coverage_labels(p, kMmaLikeCapabilities);
  const std::vector<std::string> want = {"dtype=bf16", "mask=causal_br", "gqa=4", "len_q=tile+1", "len_kv=0",
                                         "padded=no", "values=normal", "scale=default", "vacuous=yes", "pass=fwd",
                                         "mods=none", "page=none"};
  EXPECT_EQ(labels, want);
  p.heads_kv = 1;
  p.seqlen_kv = 131072;
  p.softmax_scale = 1.0;
  EXPECT_EQ(coverage_labels(p, kMmaLikeCapabilities)[2], "gqa=mqa");
  EXPECT_EQ(coverage_labels(p, kMmaLikeCapabilities)[4], "len_kv=long");
  EXPECT_EQ(coverage_labels(p, kMmaLikeCapabilities)[7], "scale=other");
  p.softcap = 30;
  EXPECT_EQ(coverage_labels(p, kMmaLikeCapabilities)[10], "mods=softcap");
  p.alibi = true;
  EXPECT_EQ(coverage_labels(p, kMmaLikeCapabilities)[10], "mods=softcap+alibi");
  p.page_size = 7;
  EXPECT_EQ(coverage_labels(p, kMmaLikeCapabilities)[11], "page=<16");
  p.page_size = 16;
  EXPECT_EQ(coverage_labels(p, kMmaLikeCapabilities)[11], "page=16+");
}

// A paged K/V cache is drawn where the domain takes one and the limits ask
// (about 1 forward draw of 3, in the domain's page sizes), never elsewhere,
// and never in a backward problem.
TEST(Generators, PagesAreDrawnOnlyWhereDeclaredAndAsked) {
  const auto count = [](const Capabilities& caps, const DomainLimits& limits) {
    int paged = 0;
    for (const Problem& p : draw(gen_problem_in(caps, limits), 300).problems) {
      paged += p.page_size > 0;
      if (p.page_size > 0) {
        EXPECT_EQ(p.pass, Pass::fwd);
        EXPECT_GE(p.page_size, caps.min_page_size);
        EXPECT_EQ(p.page_size % caps.page_size_multiple, 0);
      }
    }
    return paged;
  };
  const int asked = count(kCpuPlainCapabilities, {.backward_share = 0.3, .paged = true});
  EXPECT_GT(asked, 300 / 8);
  EXPECT_LT(asked, 300 / 2);
  Capabilities sixteen = kCpuPlainCapabilities;
  sixteen.min_page_size = 16;
  sixteen.page_size_multiple = 16;
  EXPECT_GT(count(sixteen, {.paged = true}), 300 / 8);
  Capabilities powers = kCpuPlainCapabilities;
  powers.page_size_power_of_two = true;
  for (const Problem& p : draw(gen_problem_in(powers, {.paged = true}), 300).problems)
    EXPECT_EQ(p.page_size & (p.page_size - 1), 0) << to_line(p);
  EXPECT_EQ(count(kCpuPlainCapabilities, {}), 0);
  EXPECT_EQ(count(kMmaLikeCapabilities, {.paged = true}), 0);
}

// The score modifications are drawn where the domain declares them and the
// limits ask (each in about 1 draw of 4), never elsewhere.
TEST(Generators, SoftcapAndAlibiAreDrawnOnlyWhereDeclaredAndAsked) {
  const auto count = [](const Capabilities& caps, const DomainLimits& limits) {
    std::pair<int, int> drawn{0, 0};
    for (const Problem& p : draw(gen_problem_in(caps, limits), 400).problems) {
      drawn.first += p.softcap > 0;
      drawn.second += p.alibi;
    }
    return drawn;
  };
  const auto asked = count(kCpuPlainCapabilities, {.softcap = true, .alibi = true});
  EXPECT_GT(asked.first, 400 / 8);
  EXPECT_LT(asked.first, 400 / 2);
  EXPECT_GT(asked.second, 400 / 8);
  EXPECT_LT(asked.second, 400 / 2);
  EXPECT_EQ(count(kCpuPlainCapabilities, {}), (std::pair<int, int>{0, 0}));
  EXPECT_EQ(count(kMmaLikeCapabilities, {.softcap = true, .alibi = true}), (std::pair<int, int>{0, 0}));
}

TEST(Generators, ComputeDtypeRangeIsRespectedAndRefused) {
  // wmma-tiles' domain (kernels/fp32/wmma_tiles.cu): f32 storage computed in f16.
  Capabilities wmma = kCpuPlainCapabilities;
  wmma.dtypes = {DType::f32};
  wmma.compute_dtype = DType::f16;
  const Problem issue = parse_problem("b=1 hq=4 sq=100 skv=100 d=64 dtype=f32 values=near_overflow(3000,0.9)");
  const auto reason = unsupported_reason(wmma, issue);
  ASSERT_TRUE(reason.has_value());
  EXPECT_NE(reason->find("beyond the range of f16"), std::string::npos) << *reason;
  EXPECT_FALSE(unsupported_reason(kCpuPlainCapabilities, issue)) << "f32 computed in f32 holds it";
  const Draws draws = draw(gen_problem_in(wmma), 1000);
  EXPECT_LE(draws.discarded, 100);
  for (const Problem& p : draws.problems) ASSERT_FALSE(unsupported_reason(wmma, p)) << to_line(p);
}

}  // namespace
}  // namespace flashcheck

namespace flashcheck {
namespace {

// A domain with a pool (cuDNN's, which compiles a graph per geometry): the
// properties draw at most that many geometries, every one inside the domain
// and substantive, the data new in each case; the sweep draws freely.
TEST(Generators, APoolBoundsTheGeometriesThePropertiesDraw) {
  Capabilities caps = kMmaLikeCapabilities;
  caps.geometry_pool = 8;
  caps.aligned_masks_need_sq_le_skv = true;
  const Draws pooled = draw(gen_problem_in(caps), 300);
  std::map<std::string, int> geometries;
  std::map<std::uint64_t, int> data_seeds;
  for (Problem p : pooled.problems) {
    EXPECT_FALSE(unsupported_reason(caps, p)) << to_line(p);
    EXPECT_GT(visible_rows(p), 0) << to_line(p);
    if (p.mask == MaskKind::causal_br || p.mask == MaskKind::window) EXPECT_LE(p.seqlen_q, p.seqlen_kv) << to_line(p);
    ++data_seeds[p.data_seed];
    p.data_seed = p.geometry_seed = 0;
    ++geometries[to_line(p)];
  }
  EXPECT_LE(geometries.size(), 8u);
  EXPECT_GE(geometries.size(), 4u);  // drawn from the whole pool, not one entry
  EXPECT_GT(data_seeds.size(), 200u);
  // The sweep: no pool.
  const Draws free = draw(gen_problem_in(caps, {.use_geometry_pool = false}), 300);
  std::map<std::string, int> free_geometries;
  for (Problem p : free.problems) {
    p.data_seed = p.geometry_seed = 0;
    ++free_geometries[to_line(p)];
  }
  EXPECT_GT(free_geometries.size(), 100u);
}

// A domain whose bottom-right aligned masks need Sq <= Skv never gets another.
TEST(Generators, AlignedMasksKeepSqAtMostSkvWhereTheDomainSaysSo) {
  Capabilities caps = kMmaLikeCapabilities;
  caps.aligned_masks_need_sq_le_skv = true;
  const Draws draws = draw(gen_problem_in(caps), 400);
  int aligned = 0;
  for (const Problem& p : draws.problems) {
    EXPECT_FALSE(unsupported_reason(caps, p)) << to_line(p);
    if (p.mask == MaskKind::causal_br || p.mask == MaskKind::window) {
      ++aligned;
      EXPECT_LE(p.seqlen_q, p.seqlen_kv) << to_line(p);
    }
  }
  EXPECT_GT(aligned, 100);
  EXPECT_LT(draws.discarded, 40) << "the lengths are swapped, not discarded";
  Problem p = parse_problem("b=1 hq=1 sq=9 skv=8 d=64 dtype=bf16 mask=causal_br");
  EXPECT_TRUE(unsupported_reason(caps, p).has_value());
}

// UnsupportedIsRefused draws here: each draw is outside the domain and well
// formed, and the generator seldom discards (Gpu_cudnn's discarded 5 of 15 on
// the H100 machine: a zero-length key sequence with its padded lengths kept).
TEST(Generators, OutsideProblemsAreWellFormedAndSeldomDiscarded) {
  Capabilities cudnn_like = kMmaLikeCapabilities;
  cudnn_like.dtypes = {DType::f16, DType::bf16};
  cudnn_like.empty_sequences = false;
  cudnn_like.nonfinite_inputs = false;
  cudnn_like.aligned_masks_need_sq_le_skv = true;
  cudnn_like.geometry_pool = 24;
  std::vector<Domain> domains(std::begin(kDomains), std::end(kDomains));
  domains.push_back({"cudnn-like", &cudnn_like});
  for (const Domain& domain : domains) {
    const Draws draws = draw(gen_problem_outside(*domain.caps), 400);
    for (const Problem& p : draws.problems) {
      EXPECT_TRUE(unsupported_reason(*domain.caps, p).has_value()) << domain.name << ": " << to_line(p);
      EXPECT_NO_THROW(validate(p)) << domain.name << ": " << to_line(p);
    }
    const double discard_rate = static_cast<double>(draws.discarded) / (draws.discarded + 400.0);
    std::printf("%-10s outside: generator discards %.1f%% (of %d draws)\n", domain.name, 100 * discard_rate,
                draws.discarded + 400);
    EXPECT_LE(discard_rate, 0.05) << domain.name;
  }
}

}  // namespace
}  // namespace flashcheck
