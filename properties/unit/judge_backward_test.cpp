// The judge on backward cases (pass=bwd): what it hands a subject, what it
// compares, its verdicts (pass, fail, vacuous, unsupported) and its reruns: a
// subject that declares a deterministic backward and is not is caught by the
// reruns, whatever its errors; a non-deterministic one has its spread recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/judge/every_row.hpp"
#include "flashcheck/kernels/cpu/plain.hpp"
#include "flashcheck/oracles/cpu_f64_backward.hpp"
#include "flashcheck/oracles/kokkos/kokkos_backward.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

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

// A backward that rounds P and dS to the dtype before its products, as
// tensor-core kernels do (cpu-plain-tc, a CPU stand-in that gave cuDNN's and
// fa2-mma-bwd's dQ to the last digit on these lines, found failing on an H100
// by the sweeps of 2026-11-26): on values=ties cases the baseline's P and dS
// are exact (error 0) and the floor decides. With the operands' rounding in
// the floor (Capabilities::backward_operands_in_dtype) each passes; without
// it each fails, at the ratios seen on the GPU (1.00 to 1.40).
TEST(JudgeBackward, TensorCoreOperandsAreCountedInTheFloorOnTiesCases) {
  const char* lines[] = {
      "b=1 hq=2 hkv=1 sq=17 skv=113 d=64 dtype=bf16 mask=window window=0,1 scale=0.125 values=ties(1) pass=bwd "
      "dout=normal(-1.9,0.6) gseed=148514 dseed=183484",
      "b=1 hq=1 hkv=1 sq=11 skv=97 d=64 dtype=bf16 mask=window window=0,1 scale=0.125 values=ties(1) pass=bwd "
      "dout=normal(-1.9,0.1)",
      "b=1 hq=16 hkv=2 sq=1 skv=2 d=64 dtype=f16 mask=causal_br scale=0.125 values=ties(1) pass=bwd "
      "dout=outliers(0.001,100) dseed=29",
      "b=1 hq=4 hkv=2 sq=20 skv=512 lens_q=2 lens_kv=21 d=64 dtype=bf16 mask=causal_tl scale=0.125 values=ties(1) "
      "pass=bwd dout=uniform(-1,1) gseed=88291 dseed=81068",
  };
  CpuPlain tensor_core(kCpuPlainTcName, "cpu-plain-tc", PlainFlaw::none, /*operands_in_dtype=*/true);
  ASSERT_TRUE(tensor_core.capabilities().backward_operands_in_dtype);
  for (const char* line : lines) {
    SCOPED_TRACE(line);
    const CaseResult judged = judge(tensor_core, parse_problem(line));
    ASSERT_EQ(judged.status, Status::ok) << explain(judged);
    EXPECT_TRUE(judged.passed()) << explain(judged);
    EXPECT_GT(judged.gradient_condition.operand_roundoff, 0);
    GradientCondition f32_operands = judged.gradient_condition;
    f32_operands.operand_roundoff = 0;
    const Verdict without = decide_gradients(judged.subject_gradients, judged.baseline_gradients,
                                             judged.problem.dtype, f32_operands);
    EXPECT_FALSE(without.pass) << "the floor without the operands' rounding: " << without.rule;
    EXPECT_GE(without.worst_ratio, 1.0);
  }
}

TEST(JudgeBackward, AForwardProblemIsNotABackwardOne) {
  CpuPlain plain;
  const Problem forward = parse_problem("b=1 hq=1 sq=4 skv=4 d=8 dtype=f32");
  EXPECT_THROW(judge_backward(plain, forward, generate_inputs(forward), generate_dout(forward)), BadInput);
}

/// cpu-plain's backward with dQ of one query row and dK of one key row
/// (every head; -1: none) moved by `shift`: a damage a sample can leave out.
class DamagedRows final : public Subject {
 public:
  DamagedRows(std::int64_t q_row, std::int64_t kv_row, double shift) : q_row_(q_row), kv_row_(kv_row), shift_(shift) {}
  std::string_view name() const override { return "damaged-rows"; }
  std::string_view description() const override { return "cpu-plain, one dQ row and one dK row moved"; }
  const Capabilities& capabilities() const override { return kCpuPlainCapabilities; }
  RunResult run(const Problem& p, const Inputs& in) override { return inner_.run(p, in); }
  BackwardResult run_backward(const Problem& p, const BackwardInputs& in) override {
    BackwardResult r = inner_.run_backward(p, in);
    for (std::int64_t h = 0; h < p.heads_q && q_row_ >= 0; ++h)
      for (std::int64_t c = 0; c < p.head_dim; ++c) r.gradients.dq.set(0, h, q_row_, c, r.gradients.dq.get(0, h, q_row_, c) + shift_);
    for (std::int64_t h = 0; h < p.heads_kv && kv_row_ >= 0; ++h)
      for (std::int64_t c = 0; c < p.head_dim; ++c) r.gradients.dk.set(0, h, kv_row_, c, r.gradients.dk.get(0, h, kv_row_, c) + shift_);
    return r;
  }

 private:
  std::int64_t q_row_, kv_row_;
  double shift_;
  CpuPlain inner_;
};

// A backward case sampled at max_rows = 16, and a query row and a key row the
// sample leaves out.
struct SampledBackwardCase {
  Problem problem = parse_problem("b=1 hq=4 hkv=2 sq=300 skv=260 d=16 dtype=bf16 mask=causal_br pass=bwd dseed=5");
  JudgeOptions sampled_only = [] {
    JudgeOptions options;
    options.max_rows = 16;
    options.every_row = EveryRow::off;
    return options;
  }();
  CaseResult sampled;
  std::int64_t unsampled_q = 0, unsampled_kv = 0;
  SampledBackwardCase() {
    CpuPlain plain;
    sampled = judge(plain, problem, sampled_only);
    const auto& q = sampled.rows.rows;
    const auto& kv = sampled.kv_rows.rows;
    unsampled_q = 200;  // past the 40 fully masked rows of causal_br with 300 queries and 260 keys
    while (std::find(q.begin(), q.end(), unsampled_q) != q.end()) ++unsampled_q;
    unsampled_kv = 100;
    while (std::find(kv.begin(), kv.end(), unsampled_kv) != kv.end()) ++unsampled_kv;
  }
};

// JudgeOptions::every_row on a backward case: the verdict rests on every query
// and key row, the record says so, and a damaged dQ row or dK row the sample
// leaves out fails only with it.
void expect_every_row_backward_judgement(EveryRow mode) {
  const SampledBackwardCase c;
  const Problem& p = c.problem;
  ASSERT_TRUE(c.sampled.passed()) << explain(c.sampled);
  EXPECT_FALSE(c.sampled.on_every_row());
  EXPECT_EQ(nlohmann::json(to_record(c.sampled))["rows_basis"], "sampled");

  JudgeOptions every_row = c.sampled_only;
  every_row.every_row = mode;
  CpuPlain plain;
  const CaseResult checked = judge(plain, p, every_row);
  EXPECT_TRUE(checked.passed()) << explain(checked);
  EXPECT_TRUE(checked.on_every_row());
  EXPECT_NE(checked.verdict.rule.find("[every row: kokkos_f64 gradients"), std::string::npos) << checked.verdict.rule;
  EXPECT_EQ(checked.subject_gradients.kv_rows_compared, p.heads_kv * p.seqlen_kv);
  EXPECT_EQ(checked.subject_gradients.dv.errors.count, p.heads_kv * p.seqlen_kv * p.head_dim_v);
  // Every row's conditioning holds the sample's (to f64 rounding: two oracles' sums).
  EXPECT_GE(checked.gradient_condition.dq_terms_max, (1 - 1e-10) * c.sampled.gradient_condition.dq_terms_max);
  EXPECT_GE(checked.gradient_condition.dk_terms_max, (1 - 1e-10) * c.sampled.gradient_condition.dk_terms_max);
  EXPECT_GE(checked.gradient_condition.dv_logit_terms_max,
            (1 - 1e-10) * c.sampled.gradient_condition.dv_logit_terms_max);
  const nlohmann::json record = nlohmann::json(to_record(checked));
  EXPECT_EQ(record["rows_basis"], "every");
  EXPECT_FALSE(record.contains("every_row_unavailable"));

  for (const auto& [q_row, kv_row, name] : {std::tuple{c.unsampled_q, std::int64_t{-1}, "dq"},
                                            std::tuple{std::int64_t{-1}, c.unsampled_kv, "dk"}}) {
    SCOPED_TRACE(name);
    DamagedRows damaged(q_row, kv_row, 1.0);
    const CaseResult missed = judge(damaged, p, c.sampled_only);
    EXPECT_TRUE(missed.passed()) << "the sample should not hold the damaged row: " << explain(missed);
    const CaseResult caught = judge(damaged, p, every_row);
    EXPECT_TRUE(caught.failed()) << explain(caught);
    EXPECT_NE(caught.verdict.rule.find(name), std::string::npos) << caught.verdict.rule;
    EXPECT_EQ(nlohmann::json(to_record(caught))["rows_basis"], "every");
  }
}

// On the host's Kokkos: the device path's code, testable here.
TEST(JudgeBackward, EveryRowRestsTheVerdictOnEveryQueryAndKeyRow) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  expect_every_row_backward_judgement(EveryRow::host);
}

TEST(JudgeBackward, EveryRowOnTheDevice) {
  if (!kokkos_device_available()) GTEST_SKIP() << "no CUDA Kokkos built in, or no GPU";
  expect_every_row_backward_judgement(EveryRow::device);
}

// Asked for the device where none can run: the sampled verdict stays, and the
// record says why.
TEST(JudgeBackward, EveryRowOnNoDeviceKeepsTheSampleAndSaysWhy) {
  if (kokkos_device_available()) GTEST_SKIP() << "the device reference runs here";
  const SampledBackwardCase c;
  JudgeOptions device = c.sampled_only;
  device.every_row = EveryRow::device;
  CpuPlain plain;
  const CaseResult fallback = judge(plain, c.problem, device);
  EXPECT_TRUE(fallback.passed()) << explain(fallback);
  EXPECT_EQ(fallback.rows, c.sampled.rows);
  EXPECT_EQ(fallback.kv_rows, c.sampled.kv_rows);
  EXPECT_FALSE(fallback.on_every_row());
  EXPECT_NE(fallback.every_row_unavailable.find("cannot run on a GPU"), std::string::npos)
      << fallback.every_row_unavailable;
  EXPECT_EQ(nlohmann::json(to_record(fallback))["rows_basis"], "sampled");
}

// A failure on the sampled rows stands when every row is judged. The
// regression line of the flushed subnormal P (properties/gpu/regressions.problems):
// with every key row compared, the dominant key's terms (P = 1) set dK's
// floor, under which the other keys' flushed dK hides; the sample, without
// that key, sees it.
TEST(JudgeBackward, ASampledFailureStandsWhenEveryRowIsJudged) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const Problem p = parse_problem(
      "b=1 hq=1 hkv=1 sq=1 skv=32768 d=64 dtype=bf16 mask=window window=32771,1 values=dominant(87.3465) pass=bwd "
      "dout=normal(-2,0.1)");
  CpuPlain flushed("flushed", "cpu-plain with a subnormal P flushed to 0", PlainFlaw::bwd_p_flushed);
  JudgeOptions sampled;
  sampled.every_row = EveryRow::off;
  const CaseResult on_sample = judge(flushed, p, sampled);
  ASSERT_TRUE(on_sample.failed()) << explain(on_sample);
  ASSERT_FALSE(on_sample.on_every_row());
  // The premise: judged on every key row from the start, the flaw passes.
  JudgeOptions all_rows_options = sampled;
  all_rows_options.max_rows = p.seqlen_kv;
  const CaseResult on_every = judge(flushed, p, all_rows_options);
  EXPECT_TRUE(on_every.passed()) << "the rule now sees the flaw on every row; this test's premise is gone: "
                                 << explain(on_every);

  JudgeOptions every = sampled;
  every.every_row = EveryRow::host;
  const CaseResult stood = judge(flushed, p, every);
  EXPECT_TRUE(stood.failed()) << explain(stood);
  EXPECT_FALSE(stood.on_every_row());
  EXPECT_EQ(stood.verdict.rule, on_sample.verdict.rule);
  EXPECT_NE(stood.every_row_unavailable.find("that failure stands"), std::string::npos) << stood.every_row_unavailable;
  EXPECT_EQ(nlohmann::json(to_record(stood))["rows_basis"], "sampled");
  // cpu-plain itself passes, judged on every row.
  CpuPlain plain;
  const CaseResult control = judge(plain, p, every);
  EXPECT_TRUE(control.passed()) << explain(control);
  EXPECT_TRUE(control.on_every_row());
}

// The cross-check of the every-row gradient reference: Kokkos' and cpu_f64's
// gradients agree, also where every V row is the same, so that dP_ij = D_i,
// dS cancels to rounding noise and dQ and dK are noise of their terms (the
// allowed difference's share of the terms); one element moved by a
// millionth of the largest sum of dK's terms (its largest value where dS
// does not cancel) is a disagreement.
TEST(JudgeBackward, TheEveryRowCrossCheckAgreesToF64AndSeesAMillionth) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const Problem p = parse_problem("b=2 hq=4 hkv=2 sq=70 skv=90 d=16 dtype=bf16 mask=window window=20,3 pass=bwd dseed=9");
  Inputs same_values = generate_inputs(p);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_kv; ++h)
      for (std::int64_t j = 1; j < p.seqlen_kv; ++j)
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) same_values.v.set(b, h, j, c, same_values.v.get(b, h, 0, c));
  const RowSet q_rows = sample_rows(p, 12, 1), kv_rows = sample_key_rows(p, 12, 2);
  for (const Inputs& in : {generate_inputs(p), same_values}) {
    const HostTensor dout = generate_dout(p);
    const GradientRows every =
        kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), {}, KokkosSpace::host, /*with_condition=*/true);
    GradientRows sampled = cpu_f64_gradients(p, in, dout, q_rows, kv_rows);
    const GradientCondition condition = gradient_condition(p, every);
    const GradientCrossCheck check = cross_check_gradients(p, every, sampled, condition);
    EXPECT_TRUE(check.agrees()) << check.worst << " ratio " << check.worst_ratio << " normwise " << check.worst_normwise;
    EXPECT_GT(check.worst_ratio, 0);  // something was compared
    sampled.dk[sampled.dk.size() / 2] += 1e-6 * condition.dk_terms_max;
    const GradientCrossCheck moved = cross_check_gradients(p, every, sampled, condition);
    EXPECT_FALSE(moved.agrees()) << moved.worst_ratio;
    EXPECT_STREQ(moved.worst, "dk");
  }
}

}  // namespace
}  // namespace flashcheck
