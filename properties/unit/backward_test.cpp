// The backward pass end to end on the CPU, before the judge carries it: the
// O and LSE a subject is handed, dO's draw, the baseline's gradients against
// the oracle, and the backward rule on the CPU subjects and their mutants.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/core/metrics.hpp"
#include "flashcheck/core/tolerance.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/kernels/cpu/fa2_tiles.hpp"
#include "flashcheck/kernels/cpu/plain.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/oracles/cpu_f64_backward.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"

namespace flashcheck {
namespace {

Problem backward_problem(const char* line) { return parse_problem(line); }

BackwardInputs hand_over(const Problem& p) { return flashcheck::hand_over(p, generate_inputs(p), generate_dout(p)); }

struct Judged {
  Verdict verdict;
  GradientMetrics subject, baseline;
};

Judged judge_backward(Subject& subject, const Problem& p) {
  const BackwardInputs in = hand_over(p);
  const BackwardResult run = subject.run_backward(p, in);
  EXPECT_EQ(run.status, Status::ok) << run.message;
  const RowSet q = all_rows(p), kv = all_key_rows(p);
  const GradientRows want = cpu_f64_gradients(p, in.inputs, in.dout, q, kv);
  const GradientRows base = cpu_lowp_gradients(p, in.inputs, in.dout, q, kv, p.dtype);
  Judged j;
  j.subject = compare_gradients(p, gather_gradients(p, run.gradients, q, kv), want, p.dtype);
  j.baseline = compare_gradients(p, base, want, p.dtype);
  j.verdict = decide_gradients(j.subject, j.baseline, p.dtype, gradient_condition(p, want));
  return j;
}

const char* kLines[] = {
    "b=2 hq=4 hkv=2 sq=40 skv=37 d=32 dtype=bf16 mask=causal_br pass=bwd dseed=1",
    "b=1 hq=2 hkv=1 sq=70 skv=70 d=64 dtype=f16 pass=bwd dout=normal(0,3) dseed=2",
    "b=2 hq=2 hkv=2 sq=33 skv=50 lens_q=33,9 lens_kv=50,17 d=16 dv=24 dtype=bf16 mask=window window=7,2 pass=bwd dseed=3",
    "b=1 hq=3 hkv=3 sq=20 skv=24 d=8 dtype=f32 mask=causal_tl pass=bwd dseed=4",
    "b=1 hq=8 hkv=1 sq=17 skv=100 d=64 dtype=bf16 layout=bshd pass=bwd values=outliers(0.01,20) dseed=5",
};

TEST(Backward, TheHandedOAndLseAreTheOraclesRoundedAndMaskedRowsGetZeroAndMinusInfinity) {
  const Problem p = backward_problem("b=1 hq=1 sq=6 skv=3 d=8 dtype=bf16 mask=causal_br pass=bwd");
  const Inputs in = generate_inputs(p);
  const AttentionRows ref = cpu_f64_reference(p, in, all_rows(p));
  const Outputs out = backward_outputs(p, ref);
  for (std::int64_t i = 0; i < 3; ++i) {  // rows 0..2 see no key
    EXPECT_EQ(out.lse[i], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(out.o.get(0, 0, i, 0), 0.0);
  }
  for (std::int64_t i = 3; i < 6; ++i) {
    EXPECT_EQ(out.o.get(0, 0, i, 1), round_to(DType::bf16, ref.o_row(0, 0, i)[1]));
    EXPECT_EQ(out.lse[i], static_cast<float>(ref.lse[ref.index(0, 0, i)]));
  }
  EXPECT_THROW(backward_outputs(p, cpu_f64_reference(p, in, sample_rows(p, 2, 1))), std::invalid_argument);
}

TEST(Backward, DoutIsDrawnFromItsOwnFamilyAndSeedsApartFromQkv) {
  Problem p = backward_problem("b=1 hq=2 sq=64 skv=64 d=16 dtype=f32 pass=bwd dout=uniform(-3,-2) dseed=9");
  const HostTensor dout = generate_dout(p);
  ASSERT_EQ(dout.dim(), p.head_dim_v);
  for (std::int64_t n = 0; n < dout.size(); ++n) {
    EXPECT_GE(dout.load(n), -3.0);
    EXPECT_LE(dout.load(n), -2.0);
  }
  EXPECT_EQ(dout, generate_dout(p));  // deterministic
  p.data_seed = 10;
  EXPECT_NE(dout, generate_dout(p));
}

TEST(Backward, TheBaselineIsCloseToTheOracleAndNoCloserThanItsPrecisionAllows) {
  for (const char* line : kLines) {
    const Problem p = backward_problem(line);
    SCOPED_TRACE(line);
    const BackwardInputs in = hand_over(p);
    const RowSet q = all_rows(p), kv = all_key_rows(p);
    const GradientMetrics m = compare_gradients(p, cpu_lowp_gradients(p, in.inputs, in.dout, q, kv, p.dtype),
                                                cpu_f64_gradients(p, in.inputs, in.dout, q, kv), p.dtype);
    for (const TensorMetrics* t : {&m.dq, &m.dk, &m.dv}) {
      EXPECT_EQ(t->census.mismatches, 0);
      // Within a few percent of the reference's scale (the working dtype's
      // roundings of S, P, dP, dS), and not exact in a half precision.
      EXPECT_LE(t->errors.max_abs, 0.05 * std::max(t->errors.ref_max_abs, 1e-30));
      if (p.dtype != DType::f32) {
        EXPECT_GT(t->errors.max_abs, 0.0);
      }
    }
  }
}

TEST(Backward, TheCpuSubjectsPassTheRule) {
  CpuPlain plain;
  CpuFa2Tiles tiles;
  for (Subject* subject : {static_cast<Subject*>(&plain), static_cast<Subject*>(&tiles)})
    for (const char* line : kLines) {
      SCOPED_TRACE(std::string(subject->name()) + ": " + line);
      const Judged j = judge_backward(*subject, backward_problem(line));
      EXPECT_TRUE(j.verdict.pass) << j.verdict.rule;
      EXPECT_GT(j.subject.q_rows_compared, 0);
      std::printf("%s %s: %s\n", std::string(subject->name()).c_str(), line, j.verdict.rule.c_str());
    }
}

TEST(Backward, EveryBackwardMutantFailsTheRuleWhereItsFlawShows) {
  struct Case {
    Subject* subject;
    const char* line;
  };
  CpuPlain scale("s", "", PlainFlaw::bwd_scale_missing_in_ds), gqa("g", "", PlainFlaw::bwd_gqa_not_reduced),
      masked("m", "", PlainFlaw::bwd_masked_keys_in_dk), delta("d", "", PlainFlaw::bwd_delta_low_precision),
      d256("w", "", PlainFlaw::bwd_d256_only_wrong);
  CpuFa2Tiles base2("b", "", TileFlaw::lse_wrong_base), tail("t", "", TileFlaw::nan_at_non_tile_lengths);
  const Case cases[] = {
      {&scale, "b=1 hq=2 sq=30 skv=30 d=32 dtype=bf16 pass=bwd"},
      {&gqa, "b=1 hq=4 hkv=1 sq=30 skv=30 d=32 dtype=bf16 pass=bwd"},
      {&masked, "b=1 hq=2 sq=30 skv=30 d=32 dtype=bf16 mask=causal_tl pass=bwd"},
      {&delta, "b=1 hq=2 sq=30 skv=30 d=128 dtype=bf16 pass=bwd dout=normal(0.5,1)"},
      {&d256, "b=1 hq=1 sq=8 skv=8 d=256 dtype=bf16 pass=bwd"},
      {&base2, "b=1 hq=2 sq=30 skv=30 d=32 dtype=bf16 pass=bwd"},
      {&tail, "b=1 hq=2 sq=30 skv=30 d=32 dtype=bf16 pass=bwd"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.subject->name()) + ": " + c.line);
    const Judged j = judge_backward(*c.subject, backward_problem(c.line));
    EXPECT_FALSE(j.verdict.pass) << j.verdict.rule;
    std::printf("%s caught: %s\n", std::string(c.subject->name()).c_str(), j.verdict.rule.c_str());
  }
}

// Until the judge compares gradients, a backward problem is refused with one
// line naming the field, never judged as a forward one.
TEST(Backward, TheJudgeJudgesTheGradientsNotTheForward) {
  // A backward whose forward is textbook but whose dS misses the scale: the
  // judge's verdict on pass=bwd is the gradients' (judge_backward_test.cpp
  // has the judge's other behaviour).
  CpuPlain flawed("flawed", "dS without the scale", PlainFlaw::bwd_scale_missing_in_ds);
  const CaseResult r = judge(flawed, backward_problem("b=1 hq=2 sq=16 skv=16 d=16 dtype=f16 pass=bwd"));
  ASSERT_TRUE(r.ran()) << r.message;
  EXPECT_TRUE(r.failed());
  EXPECT_NE(r.verdict.rule.find("dq"), std::string::npos) << r.verdict.rule;
  EXPECT_TRUE(judge(flawed, backward_problem("b=1 hq=2 sq=16 skv=16 d=16 dtype=f16")).passed());
}

}  // namespace
}  // namespace flashcheck
