// The CPU subjects' forward pass on hand-made inputs where a property run once
// found them wrong: each case is judged against the f64 oracle, and the value
// the one-pass formula gives is checked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/kernels/cpu/fa2_tiles.hpp"
#include "flashcheck/kernels/cpu/plain.hpp"

namespace flashcheck {
namespace {

// Inputs of a d = 1 problem with one query row whose keys 0..15 (the first
// 16-key tile) score -inf and the rest 0: q = 1, k_j = -inf for j < 16.
Inputs minus_infinity_keys(const Problem& p) {
  Inputs in = generate_inputs(p);
  in.q.set(0, 0, 0, 0, 1.0);
  for (std::int64_t j = 0; j < p.seqlen_kv; ++j)
    in.k.set(0, 0, j, 0, j < 16 ? -std::numeric_limits<double>::infinity() : 0.0);
  return in;
}

TEST(CpuSubjects, AVisibleKeyScoringMinusInfinityWeighsNothing) {
  // Found by CI's property run (GqaEqualsRepeatedMha, 2026-11-26): cpu-fa2-tiles
  // gave NaN where a row's only visible key in its first tile scored -inf
  // (exp(-inf - -inf)), though a later tile held a finite score.
  const Problem found = parse_problem("b=1 hq=4 hkv=1 sq=15 skv=17 d=16 dv=1 dtype=f32 layout=bhsd mask=window "
                                      "window=0,1 scale=0.25 values=nan_inf(0.02) gseed=0 dseed=0");
  // By hand: keys 0..15 (the first 16-key tile) score -inf, key 16 scores 0, so
  // O = V[16] and LSE = 0; with key 16 masked too, every visible key scores
  // -inf and the one-pass formula's O and LSE are NaN (exp(-inf - -inf)).
  const Problem finite_later = parse_problem("b=1 hq=1 sq=1 skv=17 d=1 dtype=f32");
  const Problem none_finite = parse_problem("b=1 hq=1 sq=1 skv=16 d=1 dtype=f32");
  CpuPlain plain;
  CpuFa2Tiles tiles;
  for (Subject* subject : std::initializer_list<Subject*>{&plain, &tiles}) {
    const CaseResult r = judge(*subject, found);
    EXPECT_EQ(r.verdict_kind, VerdictKind::pass) << explain(r);
    const Inputs later = minus_infinity_keys(finite_later);
    const CaseResult a = judge(*subject, finite_later, later);
    EXPECT_EQ(a.verdict_kind, VerdictKind::pass) << explain(a);
    const RunResult ran = subject->run(finite_later, later);
    EXPECT_EQ(ran.outputs.o.get(0, 0, 0, 0), later.v.get(0, 0, 16, 0)) << subject->name();
    EXPECT_EQ(ran.outputs.lse[0], 0.0f) << subject->name();
    const CaseResult b = judge(*subject, none_finite, minus_infinity_keys(none_finite));
    EXPECT_EQ(b.verdict_kind, VerdictKind::pass) << explain(b);
    EXPECT_TRUE(std::isnan(subject->run(none_finite, minus_infinity_keys(none_finite)).outputs.lse[0]))
        << subject->name();
  }
}

TEST(CpuSubjects, AKeyScoringMinusInfinityStillAddsZeroTimesV) {
  // Found by CI's property run (BottomRightEqualsOffsetTopLeft, 2026-11-26): with
  // the fix above, cpu-fa2-tiles skipped a tile whose visible keys all scored -inf
  // and so dropped two things the one-pass formula keeps: 0 x V (NaN where V is
  // infinite) and a NaN score in that tile (std::max(-inf, NaN) is -inf).
  const float inf = std::numeric_limits<float>::infinity();
  const Problem found = parse_problem("b=3 hq=1 hkv=1 sq=15 skv=21 d=80 dv=1 dtype=f32 layout=bhsd mask=causal_br "
                                      "scale=0.11180339887498948 values=nan_inf(0.002) gseed=0 dseed=367972");
  // By hand: keys 0..15 score -inf, key 16 scores 0. With V[0] = inf, O is
  // 0 x inf + V[16] = NaN and LSE is 0; with K[3] = NaN instead, O and LSE are NaN.
  const Problem p = parse_problem("b=1 hq=1 sq=1 skv=17 d=1 dtype=f32");
  const auto with = [&](bool infinite_value, bool nan_key) {
    Inputs in = minus_infinity_keys(p);
    if (infinite_value) in.v.set(0, 0, 0, 0, inf);
    if (nan_key) in.k.set(0, 0, 3, 0, std::numeric_limits<double>::quiet_NaN());
    return in;
  };
  CpuPlain plain;
  CpuFa2Tiles tiles;
  for (Subject* subject : std::initializer_list<Subject*>{&plain, &tiles}) {
    const CaseResult r = judge(*subject, found);
    EXPECT_EQ(r.verdict_kind, VerdictKind::pass) << explain(r);
    const Inputs infinite_value = with(true, false);
    const CaseResult a = judge(*subject, p, infinite_value);
    EXPECT_EQ(a.verdict_kind, VerdictKind::pass) << explain(a);
    const RunResult ran = subject->run(p, infinite_value);
    EXPECT_TRUE(std::isnan(ran.outputs.o.get(0, 0, 0, 0))) << subject->name();
    EXPECT_EQ(ran.outputs.lse[0], 0.0f) << subject->name();
    const Inputs nan_key = with(false, true);
    const CaseResult b = judge(*subject, p, nan_key);
    EXPECT_EQ(b.verdict_kind, VerdictKind::pass) << explain(b);
    EXPECT_TRUE(std::isnan(subject->run(p, nan_key).outputs.lse[0])) << subject->name();
  }
}

// The peer of a problem is the first of the list whose domain holds it.
TEST(CpuSubjects, PeerForTakesTheFirstPeerWhoseDomainHoldsTheProblem) {
  CpuFa2Tiles tiles;  // f32, f16, bf16; d <= 256
  CpuPlain plain;     // fp8 too; d <= 576
  const std::vector<Subject*> peers = {&tiles, &plain};
  EXPECT_EQ(peer_for(peers, parse_problem("b=1 hq=1 sq=4 skv=10 d=8 dtype=bf16")), &tiles);
  EXPECT_EQ(peer_for(peers, parse_problem("b=1 hq=1 sq=4 skv=10 d=8 dtype=e4m3")), &plain);
  EXPECT_EQ(peer_for(peers, parse_problem("b=1 hq=1 sq=4 skv=10 d=300 dtype=bf16")), &plain);
  EXPECT_EQ(peer_for(peers, parse_problem("b=1 hq=1 sq=4 skv=10 d=600 dv=8 dtype=bf16")), nullptr);
  EXPECT_EQ(peer_for({}, parse_problem("b=1 hq=1 sq=4 skv=10 d=8 dtype=e4m3")), nullptr);
}

}  // namespace
}  // namespace flashcheck
