// The judge on backward cases (pass=bwd): what it hands a subject, what it
// compares, its verdicts (pass, fail, vacuous, unsupported) and its reruns: a
// subject that declares a deterministic backward and is not is caught by the
// reruns, whatever its errors; a non-deterministic one has its spread recorded.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/kernels/cpu/plain.hpp"

namespace flashcheck {
namespace {

/// cpu-plain's backward, moved by `step` (relative) more on every call: a
/// stand-in for dQ summed with atomics in a varying order.
class Drifting final : public Subject {
 public:
  Drifting(bool declares_deterministic, double step) : step_(step) {
    caps_ = kCpuPlainCapabilities;
    caps_.backward_deterministic = declares_deterministic;
  }
  std::string_view name() const override { return "drifting"; }
  std::string_view description() const override { return "cpu-plain, moving on every call"; }
  const Capabilities& capabilities() const override { return caps_; }
  RunResult run(const Problem& p, const Inputs& in) override { return inner_.run(p, in); }
  BackwardResult run_backward(const Problem& p, const BackwardInputs& in) override {
    BackwardResult r = inner_.run_backward(p, in);
    const double factor = 1 + step_ * calls_++;
    for (std::int64_t n = 0; n < r.gradients.dq.size(); ++n) r.gradients.dq.store(n, r.gradients.dq.load(n) * factor);
    return r;
  }
  int calls_ = 0;

 private:
  double step_;
  Capabilities caps_;
  CpuPlain inner_;
};

const char* kLine = "b=1 hq=4 hkv=2 sq=24 skv=40 d=16 dtype=bf16 mask=causal_br pass=bwd dseed=3";
// f32 outputs, so that a drift of a few f32 roundings survives the store.
const char* kF32Line = "b=1 hq=4 hkv=2 sq=24 skv=40 d=16 dtype=f32 mask=causal_br pass=bwd dseed=3";

TEST(JudgeBackward, ACorrectBackwardPassesOnEveryRowAndItsRerunsAreBitwiseTheSame) {
  CpuPlain plain;
  JudgeOptions options;
  options.backward_reruns = 2;
  const CaseResult r = judge(plain, parse_problem(kLine), options);
  ASSERT_TRUE(r.ran()) << r.message;
  EXPECT_TRUE(r.passed()) << explain(r);
  EXPECT_TRUE(r.on_every_row());
  EXPECT_EQ(r.kv_rows.size(), 40);
  EXPECT_EQ(r.reruns, 2);
  EXPECT_EQ(r.rerun_spread, 0.0);
  EXPECT_GT(r.subject_gradients.dq.errors.count, 0);
  EXPECT_GT(r.subject_gradients.dk.errors.count, 0);
  EXPECT_GT(r.subject_gradients.dv.errors.count, 0);
  EXPECT_EQ(r.subject_gradients.kv_rows_compared, 2 * 40);
}

TEST(JudgeBackward, LargeProblemsAreComparedOnSampledQueryAndKeyRows) {
  CpuPlain plain;
  JudgeOptions options;
  options.max_rows = 32;
  const CaseResult r = judge(plain, parse_problem("b=1 hq=2 sq=300 skv=200 d=8 dtype=f16 pass=bwd"), options);
  ASSERT_TRUE(r.ran()) << r.message;
  EXPECT_TRUE(r.passed()) << explain(r);
  EXPECT_FALSE(r.on_every_row());
  EXPECT_LT(r.rows.size(), 300);
  EXPECT_LT(r.kv_rows.size(), 200);
  EXPECT_GE(r.kv_rows.size(), 16);
}

TEST(JudgeBackward, ASubjectDeclaredDeterministicThatIsNotFailsOnTheReruns) {
  // A drift of a few f32 roundings is far inside the rule: only the reruns see it.
  Drifting drifting(/*declares_deterministic=*/true, 1e-6);
  JudgeOptions once;
  once.backward_reruns = 0;
  EXPECT_TRUE(judge(drifting, parse_problem(kF32Line), once).passed());
  const CaseResult r = judge(drifting, parse_problem(kF32Line));
  ASSERT_TRUE(r.ran());
  EXPECT_TRUE(r.failed());
  EXPECT_NE(r.verdict.rule.find("determinism"), std::string::npos) << r.verdict.rule;
  EXPECT_NE(r.verdict.rule.find("dQ"), std::string::npos) << r.verdict.rule;
  const CaseRecord record = to_record(r);
  EXPECT_EQ(record.verdict, CaseVerdict::fail);
  EXPECT_EQ(record.judged->reruns, 1);
}

TEST(JudgeBackward, ANonDeterministicSubjectHasItsSpreadRecordedAndEachRerunJudged) {
  Drifting small(/*declares_deterministic=*/false, 1e-7);
  JudgeOptions options;
  options.backward_reruns = 3;
  const CaseResult r = judge(small, parse_problem(kF32Line), options);
  EXPECT_TRUE(r.passed()) << explain(r);
  EXPECT_GT(r.rerun_spread, 0.0);
  EXPECT_EQ(r.reruns, 3);
  // A spread beyond the rule: a later rerun fails it.
  Drifting large(/*declares_deterministic=*/false, 0.5);
  const CaseResult bad = judge(large, parse_problem(kLine), options);
  EXPECT_TRUE(bad.failed());
  EXPECT_NE(bad.verdict.rule.find("rerun 1 of a non-deterministic backward"), std::string::npos) << bad.verdict.rule;
}

TEST(JudgeBackward, NothingComparedIsVacuousAndAForwardOnlySubjectIsUnsupported) {
  CpuPlain plain;
  const CaseResult empty = judge(plain, parse_problem("b=1 hq=2 sq=8 skv=0 d=8 dtype=bf16 pass=bwd"));
  ASSERT_TRUE(empty.ran()) << empty.message;
  EXPECT_EQ(empty.verdict_kind, VerdictKind::vacuous);
  CpuPlain fully_masked;
  const CaseResult masked = judge(fully_masked, parse_problem("b=1 hq=1 sq=4 skv=2 d=8 dtype=f32 mask=causal_br "
                                                              "pass=bwd"));
  // rows 0 and 1 see no key, rows 2 and 3 do: compared, not vacuous
  EXPECT_TRUE(masked.passed()) << explain(masked);

  class ForwardOnly final : public Subject {
   public:
    std::string_view name() const override { return "forward-only"; }
    std::string_view description() const override { return "cpu-plain without a backward"; }
    const Capabilities& capabilities() const override { return caps_; }
    RunResult run(const Problem& p, const Inputs& in) override { return inner_.run(p, in); }

   private:
    Capabilities caps_ = [] {
      Capabilities c = kCpuPlainCapabilities;
      c.backward = false;
      return c;
    }();
    CpuPlain inner_;
  } forward_only;
  const CaseResult refused = judge(forward_only, parse_problem(kLine));
  EXPECT_EQ(refused.status, Status::unsupported);
  EXPECT_NE(refused.message.find("pass=bwd"), std::string::npos) << refused.message;
}

TEST(JudgeBackward, AForwardProblemIsNotABackwardOne) {
  CpuPlain plain;
  const Problem forward = parse_problem("b=1 hq=1 sq=4 skv=4 d=8 dtype=f32");
  EXPECT_THROW(judge_backward(plain, forward, generate_inputs(forward), generate_dout(forward)), BadInput);
}

}  // namespace
}  // namespace flashcheck
