// The CPU oracles on hand-computed cases, the mask conventions, GQA, padding,
// zero lengths, non-finite inputs, and the judge's verdicts.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/judge/every_row.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

namespace flashcheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A problem with f32 storage whose tensors the test fills by hand.
Problem hand_problem(std::int64_t sq, std::int64_t skv, std::int64_t d, MaskKind mask = MaskKind::none) {
  Problem p = make_problem(1, 1, 1, sq, skv, d, DType::f32, mask);
  p.softmax_scale = 1.0;
  return p;
}

Inputs zero_inputs(const Problem& p) {
  return {HostTensor(p.dtype, p.layout, p.batch, p.heads_q, p.seqlen_q, p.head_dim),
          HostTensor(p.dtype, p.layout, p.batch, p.heads_kv, p.seqlen_kv, p.head_dim),
          HostTensor(p.dtype, p.layout, p.batch, p.heads_kv, p.seqlen_kv, p.head_dim_v)};
}

// Softmax-weighted average of values[keys] with logits[keys], by hand.
double weighted(const std::vector<double>& logits, const std::vector<double>& values, const std::vector<int>& keys) {
  double numerator = 0, denominator = 0;
  for (int j : keys) {
    numerator += std::exp(logits[j]) * values[j];
    denominator += std::exp(logits[j]);
  }
  return numerator / denominator;
}

double log_sum_exp(const std::vector<double>& logits, const std::vector<int>& keys) {
  double sum = 0;
  for (int j : keys) sum += std::exp(logits[j]);
  return std::log(sum);
}

TEST(CpuF64Test, TwoKeysByHand) {
  // q = 1, k = (0, 1), v = (2, 4): weights 1/(1+e) and e/(1+e).
  const Problem p = hand_problem(1, 2, 1);
  Inputs in = zero_inputs(p);
  in.q.set(0, 0, 0, 0, 1.0);
  in.k.set(0, 0, 1, 0, 1.0);
  in.v.set(0, 0, 0, 0, 2.0);
  in.v.set(0, 0, 1, 0, 4.0);
  const auto ref = cpu_f64_reference(p, in, all_rows(p));
  const double e = std::numbers::e;
  EXPECT_NEAR(ref.o[0], (2 + 4 * e) / (1 + e), 1e-15);
  EXPECT_NEAR(ref.lse[0], std::log(1 + e), 1e-15);
}

TEST(CpuF64Test, AMaskedNonFiniteKeyLeavesTheLogitConditionFinite) {
  // causal_tl: row 0 sees key 0 only; key 1 holds a NaN and key 2 an Inf, both
  // masked for row 0. Row 0's condition is |q0| |k0| = 6, its O condition
  // |v0| 6 + |O| 6 = 12 (weight 1 on key 0).
  const Problem p = hand_problem(3, 3, 2, MaskKind::causal_tl);
  Inputs in = zero_inputs(p);
  in.q.set(0, 0, 0, 0, 2.0);
  in.k.set(0, 0, 0, 0, -3.0);
  in.k.set(0, 0, 1, 1, std::numeric_limits<double>::quiet_NaN());
  in.k.set(0, 0, 2, 0, kInf);
  in.v.set(0, 0, 0, 0, 1.0);
  const auto ref = cpu_f64_reference(p, in, all_rows(p), /*with_condition=*/true);
  EXPECT_DOUBLE_EQ(ref.lse[0], -6.0);
  EXPECT_DOUBLE_EQ(ref.lse_condition[0], 6.0);
  EXPECT_DOUBLE_EQ(ref.o_condition[0], 12.0);
  EXPECT_TRUE(std::isnan(ref.lse[1]));  // row 1 sees the NaN key
}

TEST(CpuF64Test, ScaleMultipliesTheLogits) {
  Problem p = hand_problem(1, 2, 2);
  p.softmax_scale = 0.5;
  Inputs in = zero_inputs(p);
  in.q.set(0, 0, 0, 0, 2.0);
  in.q.set(0, 0, 0, 1, 1.0);
  in.k.set(0, 0, 0, 0, 1.0);  // logit 0.5 * 2 = 1
  in.k.set(0, 0, 1, 1, 3.0);  // logit 0.5 * 3 = 1.5
  in.v.set(0, 0, 0, 0, -1.0);
  in.v.set(0, 0, 0, 1, 5.0);
  in.v.set(0, 0, 1, 0, 3.0);
  in.v.set(0, 0, 1, 1, 1.0);
  const auto ref = cpu_f64_reference(p, in, all_rows(p));
  EXPECT_NEAR(ref.o[0], weighted({1.0, 1.5}, {-1.0, 3.0}, {0, 1}), 1e-15);
  EXPECT_NEAR(ref.o[1], weighted({1.0, 1.5}, {5.0, 1.0}, {0, 1}), 1e-15);
  EXPECT_NEAR(ref.lse[0], log_sum_exp({1.0, 1.5}, {0, 1}), 1e-15);
}

// Query i has logit (i + 1) * (j + 1) / 8 against key j, and v_j = j.
struct MaskCase {
  std::int64_t sq, skv;
  MaskKind mask;
  std::int64_t left, right;
  std::vector<std::vector<int>> visible;  // per query row, by hand from the spec
};

class MaskTest : public testing::TestWithParam<MaskCase> {};

TEST_P(MaskTest, RowsSeeExactlyTheKeysOfTheSpec) {
  const MaskCase& m = GetParam();
  Problem p = hand_problem(m.sq, m.skv, 1, m.mask);
  p.window_left = m.left;
  p.window_right = m.right;
  Inputs in = zero_inputs(p);
  for (std::int64_t i = 0; i < m.sq; ++i) in.q.set(0, 0, i, 0, (i + 1) / 8.0);
  std::vector<double> values;
  for (std::int64_t j = 0; j < m.skv; ++j) {
    in.k.set(0, 0, j, 0, j + 1.0);
    in.v.set(0, 0, j, 0, static_cast<double>(j));
    values.push_back(static_cast<double>(j));
  }
  {
    CpuF64 oracle;
    const auto ref = oracle.reference(p, in, all_rows(p));
    for (std::int64_t i = 0; i < m.sq; ++i) {
      std::vector<double> logits;
      for (std::int64_t j = 0; j < m.skv; ++j) logits.push_back((i + 1) * (j + 1) / 8.0);
      const auto& keys = m.visible[i];
      if (keys.empty()) {
        EXPECT_EQ(ref.o[i], 0.0) << "fully masked row " << i;
        EXPECT_EQ(ref.lse[i], -kInf) << "fully masked row " << i;
      } else {
        EXPECT_NEAR(ref.o[i], weighted(logits, values, keys), 1e-14) << "row " << i;
        EXPECT_NEAR(ref.lse[i], log_sum_exp(logits, keys), 1e-14) << "row " << i;
      }
    }
    // The baseline has its own mask code: it must agree on the same spec.
    const auto base = cpu_lowp_rows(p, in, all_rows(p), DType::f32);
    for (std::int64_t i = 0; i < m.sq; ++i) {
      if (m.visible[i].empty()) {
        EXPECT_EQ(base.lse[i], -kInf);
        EXPECT_EQ(base.o[i], 0.0);
      } else {
        EXPECT_NEAR(base.o[i], ref.o[i], 1e-5 * (1 + std::fabs(ref.o[i]))) << "row " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Masks, MaskTest,
    testing::Values(
        // seqlen_q < seqlen_kv: top-left and bottom-right differ by the offset 1.
        MaskCase{2, 3, MaskKind::causal_tl, -1, -1, {{0}, {0, 1}}},
        MaskCase{2, 3, MaskKind::causal_br, -1, -1, {{0, 1}, {0, 1, 2}}},
        // seqlen_q > seqlen_kv: bottom-right leaves the first row fully masked.
        MaskCase{3, 2, MaskKind::causal_tl, -1, -1, {{0}, {0, 1}, {0, 1}}},
        MaskCase{3, 2, MaskKind::causal_br, -1, -1, {{}, {0}, {0, 1}}},
        MaskCase{3, 3, MaskKind::none, -1, -1, {{0, 1, 2}, {0, 1, 2}, {0, 1, 2}}},
        // Sliding windows, bottom-right aligned.
        MaskCase{4, 4, MaskKind::window, 1, 0, {{0}, {0, 1}, {1, 2}, {2, 3}}},
        MaskCase{3, 5, MaskKind::window, 0, 1, {{2, 3}, {3, 4}, {4}}},
        MaskCase{3, 3, MaskKind::window, 0, 0, {{0}, {1}, {2}}},
        MaskCase{3, 3, MaskKind::window, -1, 0, {{0}, {0, 1}, {0, 1, 2}}},
        MaskCase{3, 3, MaskKind::window, 100, 100, {{0, 1, 2}, {0, 1, 2}, {0, 1, 2}}},
        // A window entirely left of a row's keys: fully masked rows.
        MaskCase{4, 2, MaskKind::window, 0, 0, {{}, {}, {0}, {1}}}));

TEST(CpuF64Test, NoKeysMeansEveryRowIsFullyMasked) {
  const Problem p = make_problem(2, 2, 1, 5, 0, 8, DType::bf16);
  const auto ref = cpu_f64_reference(p, generate_inputs(p), all_rows(p));
  for (double o : ref.o) EXPECT_EQ(o, 0.0);
  for (double lse : ref.lse) EXPECT_EQ(lse, -kInf);
  const Problem no_queries = make_problem(1, 1, 1, 0, 4, 8, DType::bf16);
  EXPECT_TRUE(cpu_f64_reference(no_queries, generate_inputs(no_queries), all_rows(no_queries)).o.empty());
}

TEST(CpuF64Test, GqaEqualsMhaWithRepeatedKeysAndValues) {
  Problem gqa = make_problem(2, 8, 2, 19, 23, 16, DType::bf16, MaskKind::causal_br);
  const Inputs in = generate_inputs(gqa);
  Problem mha = gqa;
  mha.heads_kv = 8;
  Inputs repeated = in;
  repeated.k = HostTensor(mha.dtype, mha.layout, 2, 8, 23, 16);
  repeated.v = HostTensor(mha.dtype, mha.layout, 2, 8, 23, 16);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 8; ++h)
      for (std::int64_t j = 0; j < 23; ++j)
        for (std::int64_t c = 0; c < 16; ++c) {
          repeated.k.set(b, h, j, c, in.k.get(b, h / 4, j, c));
          repeated.v.set(b, h, j, c, in.v.get(b, h / 4, j, c));
        }
  const auto a = cpu_f64_reference(gqa, in, all_rows(gqa));
  const auto b = cpu_f64_reference(mha, repeated, all_rows(mha));
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
}

TEST(CpuF64Test, PaddedEqualsTrimmed) {
  Problem padded = make_problem(3, 2, 2, 9, 11, 8, DType::f16, MaskKind::causal_br);
  padded.lens_q = {4, 9, 0};
  padded.lens_kv = {11, 6, 3};
  const Inputs in = generate_inputs(padded);
  const auto ref = cpu_f64_reference(padded, in, all_rows(padded));
  for (std::int64_t b = 0; b < padded.batch; ++b) {
    Problem trimmed = padded;
    trimmed.batch = 1;
    trimmed.lens_q.clear();
    trimmed.lens_kv.clear();
    trimmed.seqlen_q = padded.lens_q[b];
    trimmed.seqlen_kv = padded.lens_kv[b];
    Inputs cut{HostTensor(trimmed.dtype, trimmed.layout, 1, 2, trimmed.seqlen_q, 8),
               HostTensor(trimmed.dtype, trimmed.layout, 1, 2, trimmed.seqlen_kv, 8),
               HostTensor(trimmed.dtype, trimmed.layout, 1, 2, trimmed.seqlen_kv, 8)};
    for (std::int64_t h = 0; h < 2; ++h) {
      for (std::int64_t i = 0; i < trimmed.seqlen_q; ++i)
        for (std::int64_t c = 0; c < 8; ++c) cut.q.set(0, h, i, c, in.q.get(b, h, i, c));
      for (std::int64_t j = 0; j < trimmed.seqlen_kv; ++j)
        for (std::int64_t c = 0; c < 8; ++c) {
          cut.k.set(0, h, j, c, in.k.get(b, h, j, c));
          cut.v.set(0, h, j, c, in.v.get(b, h, j, c));
        }
    }
    const auto small = cpu_f64_reference(trimmed, cut, all_rows(trimmed));
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < trimmed.seqlen_q; ++i) {
        EXPECT_EQ(small.lse[small.index(0, h, i)], ref.lse[ref.index(b, h, i)]) << "b=" << b << " row " << i;
        for (std::int64_t c = 0; c < 8; ++c) EXPECT_EQ(small.o_row(0, h, i)[c], ref.o_row(b, h, i)[c]);
      }
  }
}

TEST(CpuF64Test, LargestHeadDimsAreSupported) {
  Problem p = make_problem(1, 1, 1, 3, 5, 576, DType::bf16);
  p.head_dim_v = 512;
  const Inputs in = generate_inputs(p);
  const auto ref = cpu_f64_reference(p, in, all_rows(p));
  for (std::int64_t i = 0; i < 3; ++i) {
    std::vector<double> logits(5);
    for (int j = 0; j < 5; ++j) {
      double dot = 0;
      for (int c = 0; c < 576; ++c) dot += in.q.get(0, 0, i, c) * in.k.get(0, 0, j, c);
      logits[j] = p.softmax_scale * dot;
    }
    for (int c = 0; c < 512; c += 97) {
      std::vector<double> column(5);
      for (int j = 0; j < 5; ++j) column[j] = in.v.get(0, 0, j, c);
      const double max_logit = *std::max_element(logits.begin(), logits.end());
      std::vector<double> shifted(5);
      for (int j = 0; j < 5; ++j) shifted[j] = logits[j] - max_logit;
      EXPECT_NEAR(ref.o_row(0, 0, i)[c], weighted(shifted, column, {0, 1, 2, 3, 4}), 1e-12);
    }
  }
}

TEST(CpuF64Test, NonFiniteInputsFollowThePlainFormula) {
  const Problem p = hand_problem(2, 3, 1, MaskKind::causal_tl);
  Inputs in = zero_inputs(p);
  in.q.set(0, 0, 0, 0, 1.0);
  in.q.set(0, 0, 1, 0, 1.0);
  in.k.set(0, 0, 1, 0, 0.5);
  in.v.set(0, 0, 0, 0, 1.0);
  in.v.set(0, 0, 1, 0, 2.0);
  in.v.set(0, 0, 2, 0, std::numeric_limits<double>::quiet_NaN());  // key 2: masked for both rows
  auto ref = cpu_f64_reference(p, in, all_rows(p));
  EXPECT_EQ(ref.o[0], 1.0);  // row 0 sees key 0 only
  EXPECT_TRUE(std::isfinite(ref.o[1])) << "a NaN at a masked key must not leak";
  in.k.set(0, 0, 1, 0, std::numeric_limits<double>::infinity());  // +Inf logit seen by row 1
  ref = cpu_f64_reference(p, in, all_rows(p));
  EXPECT_EQ(ref.o[0], 1.0);
  EXPECT_TRUE(std::isnan(ref.o[1]));
  EXPECT_TRUE(std::isnan(ref.lse[1]));
}

TEST(CpuF64Test, IndependentOfTheThreadCount) {
  const Problem p = make_problem(2, 4, 2, 300, 270, 64, DType::bf16, MaskKind::causal_tl);
  const Inputs in = generate_inputs(p);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = cpu_f64_reference(p, in, all_rows(p));
  omp_set_num_threads(std::max(2, threads));
  const auto many = cpu_f64_reference(p, in, all_rows(p));
  omp_set_num_threads(threads);
  EXPECT_EQ(one.o, many.o);
  EXPECT_EQ(one.lse, many.lse);
}

double normwise(const AttentionRows& got, const AttentionRows& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.o.size(); ++i) {
    num += (got.o[i] - want.o[i]) * (got.o[i] - want.o[i]);
    den += want.o[i] * want.o[i];
  }
  return std::sqrt(num / den);
}

TEST(CpuLowpTest, ErrorGrowsWithTheWorkingPrecision) {
  Problem p = make_problem(1, 4, 4, 200, 333, 64, DType::f32, MaskKind::causal_br);
  const Inputs in = generate_inputs(p);
  const auto ref = cpu_f64_reference(p, in, all_rows(p));
  const double f32 = normwise(cpu_lowp_rows(p, in, all_rows(p), DType::f32), ref);
  const double f16 = normwise(cpu_lowp_rows(p, in, all_rows(p), DType::f16), ref);
  const double bf16 = normwise(cpu_lowp_rows(p, in, all_rows(p), DType::bf16), ref);
  EXPECT_GT(f32, 0.0);
  EXPECT_LT(f32, 1e-6);
  EXPECT_GT(f16, 10 * f32);
  EXPECT_LT(f16, 2e-3);
  EXPECT_GT(bf16, 4 * f16);
  EXPECT_LT(bf16, 2e-2);
}

TEST(CpuLowpTest, SubjectRefusesProblemsOutsideItsDomain) {
  Subject* subject = Registry::instance().find("smoke-cpu-lowp");
  ASSERT_NE(subject, nullptr);
  const Problem p = make_problem(1, 1, 1, 4, 4, 600, DType::bf16);
  const RunResult result = subject->run(p, generate_inputs(p));
  EXPECT_EQ(result.status, Status::unsupported);
  EXPECT_NE(result.message.find("head_dim 600"), std::string::npos) << result.message;
  EXPECT_EQ(result.outputs.o.size(), 0) << "unsupported must not produce outputs";
}

// A subject that runs smoke-cpu-lowp and then damages its output, for the judge.
class DamagedLowp final : public CpuLowp {
 public:
  enum class Damage { scale_o, nan_at_one_position, drop_lse_sign };
  explicit DamagedLowp(Damage damage) : damage_(damage) {}
  std::string_view name() const override { return "damaged-lowp"; }
  RunResult run(const Problem& problem, const Inputs& inputs) override {
    RunResult result = CpuLowp::run(problem, inputs);
    auto& o = result.outputs.o;
    if (damage_ == Damage::scale_o)
      for (std::int64_t i = 0; i < o.size(); ++i) o.store(i, o.load(i) * 1.05);
    if (damage_ == Damage::nan_at_one_position) o.set(0, 0, problem.seqlen_q - 1, 0, std::nan(""));
    if (damage_ == Damage::drop_lse_sign)
      for (float& lse : result.outputs.lse) lse = std::fabs(lse);
    return result;
  }

 private:
  Damage damage_;
};

TEST(JudgeTest, CpuLowpPassesAndDamagedOutputsFail) {
  const Problem p = parse_problem("b=1 hq=4 hkv=2 sq=64 skv=80 d=32 dtype=bf16 mask=causal_tl values=normal(0.5,1)");
  CpuLowp lowp;
  const CaseResult good = judge(lowp, p);
  EXPECT_TRUE(good.passed()) << good.verdict.rule;
  EXPECT_GT(good.baseline_metrics.o.errors.max_abs, 0.0) << "a bf16 baseline cannot be exact here";
  EXPECT_GT(good.subject_metrics.o.errors.ref_rms, 0.0) << "the reference must not be all zeros";

  DamagedLowp scaled(DamagedLowp::Damage::scale_o);
  const CaseResult bad = judge(scaled, p);
  EXPECT_FALSE(bad.passed());
  EXPECT_NE(bad.verdict.rule.find("o.max_abs"), std::string::npos) << bad.verdict.rule;
  EXPECT_GT(bad.subject_metrics.o.over_bound, 0);

  DamagedLowp nan(DamagedLowp::Damage::nan_at_one_position);
  const CaseResult census = judge(nan, p);
  EXPECT_FALSE(census.passed());
  EXPECT_NE(census.verdict.rule.find("census"), std::string::npos) << census.verdict.rule;
  EXPECT_NE(census.verdict.rule.find("row=63"), std::string::npos) << census.verdict.rule;

  DamagedLowp lse(DamagedLowp::Damage::drop_lse_sign);
  Problem negative_lse = p;
  // With one key, LSE is that key's logit: about half of the rows are negative.
  negative_lse.values = ValueDist{ValueFamily::normal, {0.0, 1.0}};
  negative_lse.seqlen_kv = 1;
  const CaseResult lse_bad = judge(lse, negative_lse);
  EXPECT_FALSE(lse_bad.passed());
  EXPECT_NE(lse_bad.verdict.rule.find("lse"), std::string::npos) << lse_bad.verdict.rule;
}

TEST(JudgeTest, UnsupportedProblemsAreNotRun) {
  CpuLowp lowp;
  const CaseResult result = judge(lowp, make_problem(1, 1, 1, 4, 4, 577, DType::f16));
  EXPECT_EQ(result.status, Status::unsupported);
  EXPECT_FALSE(result.passed());
  EXPECT_EQ(nlohmann::json(to_record(result))["verdict"], "unsupported");
}

TEST(JudgeTest, LargeProblemsAreCheckedOnSampledRows) {
  CpuLowp lowp;
  JudgeOptions options;
  options.max_rows = 64;
  const CaseResult result = judge(lowp, make_problem(1, 2, 2, 1000, 300, 16, DType::f16, MaskKind::causal_br), options);
  EXPECT_TRUE(result.passed()) << result.verdict.rule;
  EXPECT_GE(result.rows.size(), 64);
  EXPECT_LT(result.rows.size(), 1000);
  const auto record = nlohmann::json(to_record(result));
  EXPECT_EQ(record["rows_checked"], result.rows.size());
  EXPECT_EQ(record["verdict"], "pass");
  EXPECT_EQ(record["reproducer"].get<std::string>().rfind("flashcheck run --subject smoke-cpu-lowp --problem '", 0), 0u);
}

}  // namespace
}  // namespace flashcheck

namespace flashcheck {
namespace {

TEST(KokkosTest, ATileOfMinusInfinityLogitsWeighsZero) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  // Key 0's logit is -inf for row 0 (k = -inf, q = 1) and finite keys follow:
  // the plain formula gives key 0 weight 0. A one-key tile holding only that
  // key must not turn the row into NaN (exp(-inf - -inf)).
  Problem p = make_problem(1, 1, 1, 2, 3, 1, DType::f32);
  p.softmax_scale = 1;
  Inputs in = zero_inputs(p);
  in.q.set(0, 0, 0, 0, 1.0);
  in.q.set(0, 0, 1, 0, -1.0);  // row 1: key 0's logit is +inf: NaN by the plain formula
  in.k.set(0, 0, 0, 0, -std::numeric_limits<double>::infinity());
  in.k.set(0, 0, 1, 0, 1.0);
  in.k.set(0, 0, 2, 0, 2.0);
  for (std::int64_t j = 0; j < 3; ++j) in.v.set(0, 0, j, 0, j + 1.0);
  const auto plain = cpu_f64_reference(p, in, all_rows(p));
  for (std::int64_t tile : {1, 2, 64}) {
    const auto online = kokkos_reference(p, in, all_rows(p), Accumulation::f64, {1, tile});
    EXPECT_NEAR(online.o[0], plain.o[0], 1e-15) << "tile " << tile;
    EXPECT_NEAR(online.lse[0], plain.lse[0], 1e-15) << "tile " << tile;
    EXPECT_TRUE(std::isnan(online.o[1]) && std::isnan(plain.o[1])) << "tile " << tile;
  }
  // Every visible logit -inf: both give the plain formula's NaN.
  in.k.set(0, 0, 1, 0, -std::numeric_limits<double>::infinity());
  in.k.set(0, 0, 2, 0, -std::numeric_limits<double>::infinity());
  const auto all_minus_inf = kokkos_reference(p, in, all_rows(p), Accumulation::f64, {1, 1});
  const auto plain_minus_inf = cpu_f64_reference(p, in, all_rows(p));
  EXPECT_TRUE(std::isnan(all_minus_inf.o[0]) && std::isnan(plain_minus_inf.o[0]));
  EXPECT_TRUE(std::isnan(all_minus_inf.lse[0]) && std::isnan(plain_minus_inf.lse[0]));
}

TEST(KokkosTest, FloatAccumulationFollowsTheTileOrder) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const Problem p = make_problem(1, 2, 2, 64, 300, 64, DType::f32, MaskKind::causal_br);
  const Inputs in = generate_inputs(p);
  const auto exact = cpu_f64_reference(p, in, all_rows(p));
  const auto tile16 = kokkos_reference(p, in, all_rows(p), Accumulation::f32, {16, 16});
  const auto tile64 = kokkos_reference(p, in, all_rows(p), Accumulation::f32, {16, 64});
  const double error16 = normwise(tile16, exact), error64 = normwise(tile64, exact);
  EXPECT_GT(error16, 1e-9) << "f32 accumulation cannot be exact here";
  EXPECT_LT(error16, 1e-5);
  EXPECT_LT(error64, 1e-5);
  EXPECT_NE(tile16.o, tile64.o) << "the key tile must change the f32 arithmetic order";
  EXPECT_LT(normwise(kokkos_reference(p, in, all_rows(p), Accumulation::f64, {16, 16}), exact), 1e-14);
}

TEST(KokkosTest, CrossCheckFindsADifferenceOnASampledRow) {
  const Problem p = make_problem(1, 2, 2, 40, 40, 8, DType::f32, MaskKind::causal_tl);
  const Inputs in = generate_inputs(p);
  const auto every = cpu_f64_reference(p, in, all_rows(p));
  const RowSet sample{{0, 17, 39}};
  auto sampled = cpu_f64_reference(p, in, sample);
  EXPECT_TRUE(cross_check(p, every, sampled).agrees());
  sampled.o_row(0, 1, 1)[3] += 1e-6;  // row 17 of head 1
  EXPECT_GT(cross_check(p, every, sampled).o_normwise, 1e-9);
  EXPECT_FALSE(cross_check(p, every, sampled).agrees());
  sampled.o_row(0, 1, 1)[3] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(cross_check(p, every, sampled).nonfinite_mismatches, 1);
  const RowSet missing{{0, 17}};  // the every-row side lacks a sampled row: never agree
  EXPECT_FALSE(cross_check(p, cpu_f64_reference(p, in, missing), cpu_f64_reference(p, in, sample)).agrees());
}

TEST(KokkosTest, DeviceAgreesWithTheHostOnEveryRow) {
  if (!kokkos_device_available()) GTEST_SKIP() << "no CUDA Kokkos built in, or no GPU";
  const Problem p = make_problem(2, 4, 2, 300, 517, 128, DType::bf16, MaskKind::causal_br);
  const Inputs in = generate_inputs(p);
  const auto device = kokkos_reference(p, in, all_rows(p), Accumulation::f64, {}, KokkosSpace::device);
  const auto host = kokkos_reference(p, in, all_rows(p), Accumulation::f64, {}, KokkosSpace::host);
  const auto sampled = cpu_f64_reference(p, in, sample_rows(p, 64, 3));
  EXPECT_TRUE(cross_check(p, device, sampled).agrees()) << cross_check(p, device, sampled).o_normwise;
  EXPECT_LT(normwise(device, host), 1e-13);
}

// The Kokkos baseline is cpu_lowp's arithmetic written again: on Serial (the
// same libm, IEEE f32 without contraction) it must agree bit for bit.
TEST(KokkosTest, BaselineIsCpuLowpOperationForOperation) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  struct Case {
    Problem problem;
    DType working;
  };
  Problem varlen = make_problem(2, 4, 2, 37, 45, 24, DType::f16, MaskKind::window);
  varlen.window_left = 9;
  varlen.window_right = 3;
  varlen.lens_q = {37, 5};
  varlen.lens_kv = {45, 20};
  varlen.layout = Layout::bshd;
  Problem modified = make_problem(2, 6, 3, 33, 40, 16, DType::bf16, MaskKind::causal_br);  // softcap and ALiBi
  modified.softcap = 5;
  modified.alibi = true;
  modified.softmax_scale = 0.5;
  modified.lens_q = {33, 12};
  modified.lens_kv = {40, 30};
  Problem capped = make_problem(1, 3, 3, 21, 50, 8, DType::f16, MaskKind::none);
  capped.softcap = 1;
  Problem fp8 = make_problem(2, 4, 2, 30, 41, 32, DType::e4m3, MaskKind::causal_br);  // S in f32, P in e4m3, O bf16
  fp8.lens_kv = {41, 17};
  fp8.softcap = 5;
  Problem fp8_e5m2 = make_problem(1, 2, 1, 19, 64, 16, DType::e5m2, MaskKind::none);
  fp8_e5m2.alibi = true;
  const Case cases[] = {
      {fp8, DType::e4m3},
      {fp8_e5m2, DType::e5m2},
      {make_problem(1, 2, 2, 64, 80, 32, DType::bf16, MaskKind::causal_br), DType::bf16},
      {make_problem(1, 2, 1, 50, 50, 16, DType::f32, MaskKind::causal_tl), DType::f32},
      {make_problem(1, 2, 1, 50, 50, 16, DType::f32, MaskKind::none), DType::bf16},  // a narrower working dtype
      {varlen, DType::f16},
      {modified, DType::bf16},
      {modified, DType::f32},
      {capped, DType::f16},
  };
  for (const Case& c : cases) {
    validate(c.problem);
    const Inputs in = generate_inputs(c.problem);
    const auto want = cpu_lowp_rows(c.problem, in, all_rows(c.problem), c.working);
    const auto got = kokkos_baseline(c.problem, in, all_rows(c.problem), c.working);
    EXPECT_EQ(got.o, want.o) << to_line(c.problem);
    EXPECT_EQ(got.lse, want.lse) << to_line(c.problem);
  }
}

// On the GPU, expf and logf are CUDA's (within 2 ULP of glibc's): the device
// baseline is then not bitwise cpu_lowp, but its error against the f64 oracle
// must be the same size.
TEST(KokkosTest, DeviceBaselineHasCpuLowpsError) {
  if (!kokkos_device_available()) GTEST_SKIP() << "no CUDA Kokkos built in, or no GPU";
  const Problem p = make_problem(1, 4, 2, 256, 300, 64, DType::bf16, MaskKind::causal_br);
  const Inputs in = generate_inputs(p);
  const auto exact = cpu_f64_reference(p, in, all_rows(p));
  const double host = normwise(cpu_lowp_rows(p, in, all_rows(p), DType::bf16), exact);
  const double device = normwise(kokkos_baseline(p, in, all_rows(p), DType::bf16, KokkosSpace::device), exact);
  EXPECT_GT(host, 0);
  EXPECT_GT(device, 0.8 * host);
  EXPECT_LT(device, 1.25 * host);
}

// The every-row judge (the GPU path, here on Serial: the same code): a row the
// judge's sample left out is judged, and a damage there is caught.
TEST(KokkosTest, EveryRowJudgeCatchesARowTheSampleLeftOut) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const Problem p = parse_problem("b=1 hq=2 hkv=1 sq=300 skv=320 d=32 dtype=bf16 mask=causal_br values=normal(0.5,1)");
  const Inputs in = generate_inputs(p);
  CpuLowp lowp;
  JudgeOptions options;
  options.max_rows = 16;
  options.keep_outputs = true;
  const CaseResult sampled = judge(lowp, p, in, options);
  ASSERT_TRUE(sampled.passed()) << sampled.verdict.rule;
  ASSERT_LT(sampled.rows.size(), p.seqlen_q);

  CaseResult every = sampled;
  ASSERT_TRUE(judge_every_row(every, in, sampled.outputs, sampled.reference, KokkosSpace::host));
  EXPECT_EQ(every.rows, all_rows(p));
  EXPECT_TRUE(every.passed()) << every.verdict.rule;
  EXPECT_EQ(every.subject_metrics.o.errors.count, p.heads_q * p.seqlen_q * p.head_dim_v);
  EXPECT_NE(every.verdict.rule.find("every row"), std::string::npos) << every.verdict.rule;

  std::int64_t unsampled = 0;  // a row the sample does not hold
  while (std::find(sampled.rows.rows.begin(), sampled.rows.rows.end(), unsampled) != sampled.rows.rows.end()) ++unsampled;
  Outputs damaged = sampled.outputs;
  for (std::int64_t c = 0; c < p.head_dim_v; ++c) damaged.o.set(0, 1, unsampled, c, damaged.o.get(0, 1, unsampled, c) * 1.05);
  CaseResult caught = sampled;
  ASSERT_TRUE(judge_every_row(caught, in, damaged, sampled.reference, KokkosSpace::host));
  EXPECT_FALSE(caught.passed()) << "row " << unsampled << " damaged: " << caught.verdict.rule;

  AttentionRows wrong_oracle = sampled.reference;
  wrong_oracle.o[5] += 1e-3;
  CaseResult disagreement = sampled;
  ASSERT_TRUE(judge_every_row(disagreement, in, sampled.outputs, wrong_oracle, KokkosSpace::host));
  EXPECT_FALSE(disagreement.passed());
  EXPECT_NE(disagreement.verdict.rule.find("oracles disagree"), std::string::npos) << disagreement.verdict.rule;

  CaseResult unchanged = every;  // already every row: nothing to do
  EXPECT_FALSE(judge_every_row(unchanged, in, sampled.outputs, every.reference, KokkosSpace::host));
}

// cpu-lowp with one row of O (batch 0, head 1) scaled by 1.05: a damage that
// a sample which leaves the row out cannot see.
class DamagedRow final : public Subject {
 public:
  explicit DamagedRow(std::int64_t row) : row_(row) {}
  std::string_view name() const override { return "damaged-row"; }
  std::string_view description() const override { return "cpu-lowp with one row of O scaled by 1.05"; }
  const Capabilities& capabilities() const override { return lowp_.capabilities(); }
  RunResult run(const Problem& problem, const Inputs& inputs) override {
    RunResult run = lowp_.run(problem, inputs);
    if (run.status == Status::ok)
      for (std::int64_t c = 0; c < problem.head_dim_v; ++c)
        run.outputs.o.set(0, 1, row_, c, run.outputs.o.get(0, 1, row_, c) * 1.05);
    return run;
  }

 private:
  CpuLowp lowp_;
  std::int64_t row_;
};

// A case sampled at max_rows = 16: its problem, inputs, and a row the sample
// leaves out.
struct SampledCase {
  Problem problem = parse_problem("b=1 hq=2 hkv=1 sq=300 skv=320 d=32 dtype=bf16 mask=causal_br values=normal(0.5,1)");
  Inputs inputs = generate_inputs(problem);
  JudgeOptions sampled_only = [] {
    JudgeOptions options;
    options.max_rows = 16;
    return options;
  }();
  CaseResult sampled;
  std::int64_t unsampled = 0;
  SampledCase() {
    CpuLowp lowp;
    sampled = judge(lowp, problem, inputs, sampled_only);
    const auto& rows = sampled.rows.rows;
    while (std::find(rows.begin(), rows.end(), unsampled) != rows.end()) ++unsampled;
  }
};

// JudgeOptions::every_row through judge(): the verdict rests on every row and
// the record says so; a damage on a row the sample leaves out fails only with it.
void expect_every_row_judgement(EveryRow mode) {
  const SampledCase c;
  const Problem& p = c.problem;
  ASSERT_TRUE(c.sampled.passed()) << c.sampled.verdict.rule;
  ASSERT_LT(c.sampled.rows.size(), p.seqlen_q);
  EXPECT_FALSE(c.sampled.on_every_row());
  EXPECT_EQ(nlohmann::json(to_record(c.sampled))["rows_basis"], "sampled");
  EXPECT_FALSE(nlohmann::json(to_record(c.sampled)).contains("every_row_unavailable"));

  JudgeOptions every_row = c.sampled_only;
  every_row.every_row = mode;
  CpuLowp lowp;
  const CaseResult checked = judge(lowp, p, c.inputs, every_row);
  EXPECT_TRUE(checked.passed()) << checked.verdict.rule;
  EXPECT_TRUE(checked.on_every_row());
  EXPECT_EQ(checked.subject_metrics.o.errors.count, p.heads_q * p.seqlen_q * p.head_dim_v);
  const nlohmann::json record = nlohmann::json(to_record(checked));
  EXPECT_EQ(record["rows_basis"], "every");
  EXPECT_EQ(record["rows_checked"], p.seqlen_q);
  EXPECT_FALSE(record.contains("every_row_unavailable"));

  DamagedRow damaged(c.unsampled);
  const CaseResult missed = judge(damaged, p, c.inputs, c.sampled_only);
  EXPECT_TRUE(missed.passed()) << "the sample should not hold row " << c.unsampled << ": " << missed.verdict.rule;
  const CaseResult caught = judge(damaged, p, c.inputs, every_row);
  EXPECT_TRUE(caught.failed()) << "row " << c.unsampled << " damaged: " << caught.verdict.rule;
  EXPECT_EQ(nlohmann::json(to_record(caught))["verdict"], "fail");
  EXPECT_EQ(nlohmann::json(to_record(caught))["rows_basis"], "every");
  ASSERT_TRUE(caught.subject_metrics.o.first_over_bound.has_value());
  EXPECT_EQ(caught.subject_metrics.o.first_over_bound->at.row, c.unsampled);
}

// On the host's Kokkos (Serial): the device path's code, testable here.
TEST(KokkosTest, JudgeRestsOnEveryRowWhenAsked) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  expect_every_row_judgement(EveryRow::host);
}

TEST(KokkosTest, JudgeRestsOnEveryRowOnTheDevice) {
  if (!kokkos_device_available()) GTEST_SKIP() << "no CUDA Kokkos built in, or no GPU";
  expect_every_row_judgement(EveryRow::device);
}

// Asked for the device where none can run: the sampled verdict stays, and the
// record says why.
TEST(KokkosTest, EveryRowOnNoDeviceKeepsTheSampleAndSaysWhy) {
  if (kokkos_device_available()) GTEST_SKIP() << "the device reference runs here";
  const SampledCase c;
  DamagedRow damaged(c.unsampled);
  JudgeOptions device = c.sampled_only;
  device.every_row = EveryRow::device;
  const CaseResult fallback = judge(damaged, c.problem, c.inputs, device);
  EXPECT_TRUE(fallback.passed()) << fallback.verdict.rule;  // the sample does not see the damage
  EXPECT_EQ(fallback.rows, c.sampled.rows);
  EXPECT_FALSE(fallback.on_every_row());
  const nlohmann::json said = nlohmann::json(to_record(fallback));
  EXPECT_EQ(said["rows_basis"], "sampled");
  ASSERT_TRUE(said.contains("every_row_unavailable"));
  EXPECT_NE(said["every_row_unavailable"].get<std::string>().find("cannot run on a GPU"), std::string::npos)
      << said["every_row_unavailable"];
}

// A failure on the sampled rows stands when every row is asked for: every row
// is judged to find more, never to clear what the sample found (the rule's
// floors scale with the largest terms among the rows compared).
TEST(KokkosTest, ASampledFailureStandsWhenEveryRowIsAskedFor) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const SampledCase c;
  DamagedRow damaged(c.sampled.rows.rows.back());  // a row the sample holds
  const CaseResult on_sample = judge(damaged, c.problem, c.inputs, c.sampled_only);
  ASSERT_TRUE(on_sample.failed()) << on_sample.verdict.rule;
  JudgeOptions every_row = c.sampled_only;
  every_row.every_row = EveryRow::host;
  const CaseResult stood = judge(damaged, c.problem, c.inputs, every_row);
  EXPECT_TRUE(stood.failed()) << stood.verdict.rule;
  EXPECT_EQ(stood.verdict.rule, on_sample.verdict.rule);
  EXPECT_EQ(stood.rows, c.sampled.rows);
  const nlohmann::json said = nlohmann::json(to_record(stood));
  EXPECT_EQ(said["rows_basis"], "sampled");
  EXPECT_NE(said.value("every_row_unavailable", "").find("that failure stands"), std::string::npos) << said.dump();
}

TEST(KokkosTest, RejectsImpossibleTiles) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const Problem p = make_problem(1, 1, 1, 4, 4, 8, DType::f32);
  const Inputs in = generate_inputs(p);
  EXPECT_THROW(kokkos_reference(p, in, all_rows(p), Accumulation::f64, {16, 0}), std::invalid_argument);
  EXPECT_THROW(kokkos_reference(p, in, all_rows(p), Accumulation::f64, {16, 4096}), std::invalid_argument);
}

}  // namespace
}  // namespace flashcheck
