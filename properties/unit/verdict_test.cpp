// The judge's verdicts beside pass and fail: `vacuous` (nothing compared) and
// `deviation` (outside the rule, inside a limit the subject declares), in the
// CaseResult, the record and `flashcheck run`'s output and exit code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/core/record.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck {
namespace {

// cpu-lowp's arithmetic with a declared accumulator limit, made to overflow
// as a one-pass f32 kernel does (every O element -inf) when `overflow` is set.
class OverflowingSubject final : public Subject {
 public:
  OverflowingSubject(bool declares, bool overflow) : overflow_(overflow) {
    caps_ = kCpuLowpCapabilities;
    if (declares) caps_.accumulator_max = std::numeric_limits<float>::max();
  }
  std::string_view name() const override { return "overflowing"; }
  std::string_view description() const override { return "cpu-lowp whose O overflows to -inf"; }
  const Capabilities& capabilities() const override { return caps_; }
  RunResult run(const Problem& problem, const Inputs& inputs) override {
    RunResult result = inner_.run(problem, inputs);
    if (overflow_)
      for (std::int64_t b = 0; b < problem.batch; ++b)
        for (std::int64_t h = 0; h < problem.heads_q; ++h)
          for (std::int64_t s = 0; s < problem.seqlen_q; ++s)
            for (std::int64_t c = 0; c < problem.head_dim_v; ++c)
              result.outputs.o.set(b, h, s, c, -std::numeric_limits<double>::infinity());
    return result;
  }

 private:
  Capabilities caps_;
  CpuLowp inner_;
  bool overflow_;
};

const char* kNearOverflow = "b=1 hq=4 sq=100 skv=100 d=64 dtype=bf16 values=near_overflow(3000,0.9)";

TEST(Verdict, AFullyMaskedCaseIsVacuousNotAPass) {
  CpuLowp subject;
  // Every query row sees no key (skv = 0): O = 0 and LSE = -inf hold, but nothing was compared.
  const CaseResult empty_keys = judge(subject, parse_problem("b=2 hq=2 sq=17 skv=0 d=16 dtype=f32"));
  ASSERT_TRUE(empty_keys.ran()) << empty_keys.message;
  EXPECT_TRUE(empty_keys.verdict.pass) << "the rule holds: the fully-masked convention";
  EXPECT_EQ(empty_keys.verdict_kind, VerdictKind::vacuous);
  EXPECT_FALSE(empty_keys.passed());
  EXPECT_FALSE(empty_keys.failed());
  EXPECT_EQ(empty_keys.rows_visible, 0);
  EXPECT_GT(empty_keys.subject_metrics.rows_compared, 0) << "rows were compared, none of them sees a key";
  const auto record = nlohmann::json(to_record(empty_keys));
  EXPECT_EQ(record["verdict"], "vacuous");
  EXPECT_EQ(record["rows_visible"], 0);
  EXPECT_EQ(record["schema"], kRecordSchema);
  EXPECT_NE(explain(empty_keys).find("nothing was compared"), std::string::npos);

  // A padded batch whose sequences are each empty on one side, and an empty query side.
  for (const char* line : {"b=2 hq=1 sq=8 skv=8 lens_q=0,5 lens_kv=3,0 d=8 dtype=f16", "b=1 hq=1 sq=0 skv=9 d=8 dtype=f32"}) {
    const CaseResult r = judge(subject, parse_problem(line));
    ASSERT_TRUE(r.ran()) << line;
    EXPECT_EQ(r.verdict_kind, VerdictKind::vacuous) << line;
    EXPECT_EQ(nlohmann::json(to_record(r))["verdict"], "vacuous") << line;
  }
  // One sequence with keys is enough to compare something.
  const CaseResult some = judge(subject, parse_problem("b=2 hq=1 sq=8 skv=8 lens_q=0,5 lens_kv=3,1 d=8 dtype=f16"));
  EXPECT_EQ(some.verdict_kind, VerdictKind::pass) << explain(some);
  EXPECT_TRUE(some.passed());
  EXPECT_EQ(some.rows_visible, 5);
  EXPECT_EQ(nlohmann::json(to_record(some))["verdict"], "pass");
}

TEST(Verdict, ARowOfNaNEverywhereStillComparesItsPositions) {
  // One key with a NaN or Inf in V: O is non-finite in every column, so no
  // finite pair is compared, but the census compares the NaN/Inf positions.
  CpuLowp subject;
  const CaseResult r = judge(subject, parse_problem("b=1 hq=2 hkv=1 sq=1 skv=1 d=96 dtype=f32 values=nan_inf(0.02) "
                                                    "gseed=0 dseed=1"));
  ASSERT_TRUE(r.ran()) << r.message;
  EXPECT_EQ(r.subject_metrics.o.errors.count, 0);
  EXPECT_GT(r.subject_metrics.o.census.want_nan + r.subject_metrics.o.census.want_pos_inf +
                r.subject_metrics.o.census.want_neg_inf,
            0);
  EXPECT_EQ(r.verdict_kind, VerdictKind::pass) << explain(r);
}

TEST(Verdict, AFailureInsideADeclaredLimitIsADeviation) {
  OverflowingSubject declares(true, true);
  const CaseResult r = judge(declares, parse_problem(kNearOverflow));
  ASSERT_TRUE(r.ran()) << r.message;
  EXPECT_FALSE(r.verdict.pass) << "outside the rule";
  EXPECT_EQ(r.verdict_kind, VerdictKind::deviation) << explain(r);
  EXPECT_FALSE(r.passed());
  EXPECT_FALSE(r.failed());
  EXPECT_NE(r.deviation.find("accumulator"), std::string::npos) << r.deviation;
  const auto record = nlohmann::json(to_record(r));
  EXPECT_EQ(record["verdict"], "deviation");
  EXPECT_EQ(record["deviation"], r.deviation);
  EXPECT_NE(explain(r).find("deviation"), std::string::npos);
}

TEST(Verdict, TheSameFailureOutsideTheLimitOrUndeclaredIsAFail) {
  // Small values: no accumulator can overflow, so the -inf is a bug.
  OverflowingSubject declares(true, true);
  const CaseResult small = judge(declares, parse_problem("b=1 hq=4 sq=100 skv=100 d=64 dtype=bf16"));
  EXPECT_EQ(small.verdict_kind, VerdictKind::fail) << explain(small);
  EXPECT_EQ(nlohmann::json(to_record(small))["verdict"], "fail");
  // The same values on a subject that declares no limit.
  OverflowingSubject silent(false, true);
  const CaseResult undeclared = judge(silent, parse_problem(kNearOverflow));
  EXPECT_EQ(undeclared.verdict_kind, VerdictKind::fail) << explain(undeclared);
  EXPECT_TRUE(undeclared.failed());
  // A subject that declares the limit and holds passes.
  OverflowingSubject holds(true, false);
  const CaseResult held = judge(holds, parse_problem(kNearOverflow));
  EXPECT_EQ(held.verdict_kind, VerdictKind::pass) << explain(held);
}

TEST(Verdict, DeclaredDeviationCountsTheKeysARowSees) {
  Capabilities caps = kCpuLowpCapabilities;
  caps.accumulator_max = 100;
  Problem p = parse_problem("b=1 hq=1 sq=4 skv=10 d=8 dtype=f32 mask=causal_tl");
  EXPECT_FALSE(declared_deviation(caps, p, 20.0)) << "4 keys at most x 20 = 80";
  EXPECT_TRUE(declared_deviation(caps, p, 30.0)) << "4 keys x 30 = 120";
  caps.accumulator_max = 0;
  EXPECT_FALSE(declared_deviation(caps, p, 1e300)) << "nothing declared";
}

// fp8_accumulator_keys: a declared limit for fp8 problems only, on the keys a row sees.
TEST(Verdict, Fp8AccumulatorLimitIsDeclaredForFp8RowsPastIt) {
  Capabilities caps = kCpuLowpCapabilities;
  caps.fp8_accumulator_keys = 8;
  const Problem short_rows = parse_problem("b=1 hq=1 sq=4 skv=10 d=8 dtype=e4m3 mask=causal_tl");  // 4 keys at most
  const Problem long_rows = parse_problem("b=1 hq=1 sq=4 skv=10 d=8 dtype=e4m3");                  // 10 keys
  const Problem bf16_rows = parse_problem("b=1 hq=1 sq=4 skv=10 d=8 dtype=bf16");
  EXPECT_FALSE(declared_deviation(caps, short_rows, 1.0));
  const auto limit = declared_deviation(caps, long_rows, 1.0);
  ASSERT_TRUE(limit);
  EXPECT_NE(limit->find("fp8 tensor cores' accumulator"), std::string::npos) << *limit;
  EXPECT_FALSE(declared_deviation(caps, bf16_rows, 1.0)) << "the limit is fp8's";
}


// fp8_output: the baseline's O is rounded to the inputs' format at V's
// descale, for fp8 problems of a subject that declares it.
TEST(Verdict, Fp8OutputRoundsTheBaselinesOAtVsDescale) {
  const Problem p = parse_problem("b=1 hq=1 sq=2 skv=3 d=4 dv=2 dtype=e4m3");
  AttentionRows rows(p, all_rows(p));
  rows.o = {0.30, -1.7, 100.0, 0.0};
  round_o_to_fp8(rows, DType::e4m3, 0.25);
  for (double x : {0.30, -1.7, 100.0, 0.0})
    EXPECT_NE(std::find(rows.o.begin(), rows.o.end(), round_to(DType::e4m3, x / 0.25) * 0.25), rows.o.end()) << x;
  EXPECT_EQ(rows.o[0], 0.3125);  // 1.2 -> 1.25 in e4m3, times 0.25
  EXPECT_EQ(rows.o[2], 96.0);    // 400 -> 384
  Capabilities caps = kCpuLowpCapabilities;
  EXPECT_FALSE(baseline_o_in_fp8(caps, p));
  caps.fp8_output = true;
  EXPECT_TRUE(baseline_o_in_fp8(caps, p));
  EXPECT_FALSE(baseline_o_in_fp8(caps, parse_problem("b=1 hq=1 sq=2 skv=3 d=4 dtype=bf16")));
  EXPECT_THROW(round_o_to_fp8(rows, DType::bf16, 1.0), std::invalid_argument);
}

// min_seqlen_q: the padded seqlen_q's least, with its reason.
TEST(Verdict, MinSeqlenQRefusesShorterProblems) {
  Capabilities caps = kCpuLowpCapabilities;
  caps.min_seqlen_q = 2;
  const auto reason = unsupported_reason(caps, parse_problem("b=1 hq=1 sq=1 skv=3 d=4 dtype=bf16"));
  ASSERT_TRUE(reason);
  EXPECT_EQ(*reason, "seqlen_q 1 is below 2");
  EXPECT_FALSE(unsupported_reason(caps, parse_problem("b=1 hq=1 sq=2 skv=3 d=4 dtype=bf16")));
}

}  // namespace
}  // namespace flashcheck
