// cuDNN's backward (sdpa_backward) as a subject, judged as the judge's
// pass=bwd judges it: the f64 gradient oracle (cpu_f64_gradients) on every
// query and key row, the same-precision baseline (cpu_lowp_gradients) and the
// backward rule (decide_gradients), on the O and LSE the judge hands
// (backward_outputs of the f64 forward). Problems: bf16 and f16, d = 64 and
// 128, causal (both alignments), windows, GQA (hq=8, hkv=2 and MQA), varlen,
// both layouts, and a batch entry whose rows before its diagonal see no key
// (fully masked: their dQ must be exactly 0). Then the determinism the subject
// declares (every bit over reruns), and what cuDNN itself does with an LSE of
// -inf on rows that see no key (the subject hands +inf there; the test shows
// whether it had to). GPU only: SKIPPED without one, never passed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/metrics.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/tolerance.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/oracles/cpu_f64_backward.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/oracles/cudnn/cudnn_sdpa_testing.hpp"
#include "properties/judged_backward.hpp"

namespace flashcheck {
namespace {

// The cudnn subject, or why this machine cannot run it.
Subject* cudnn_here(std::string* why) {
  const GpuInventory inventory = gpu_devices();
  if (inventory.devices.empty()) {
    *why = "no GPU: " + inventory.note;
    return nullptr;
  }
  Subject* cudnn = Registry::instance().find("cudnn");
  if (!cudnn) {
    *why = "no cudnn subject in this binary";
    return nullptr;
  }
  if (inventory.devices.front().compute_capability < cudnn->capabilities().min_compute_capability) {
    *why = "cudnn needs compute capability " + std::to_string(cudnn->capabilities().min_compute_capability);
    return nullptr;
  }
  return cudnn;
}

// What the judge hands a backward subject: the inputs, the f64 forward's O
// and LSE rounded, and dO.
BackwardInputs hand_over(const Problem& p) {
  BackwardInputs in;
  in.inputs = generate_inputs(p);
  in.forward = backward_outputs(p, cpu_f64_reference(p, in.inputs, all_rows(p)));
  in.dout = generate_dout(p);
  return in;
}

using testing_backward::Judged;

// The backward rule on every row, through the judge's judge_backward.
Judged judge_gradients(Subject& subject, const Problem& p, const BackwardInputs& in) {
  return testing_backward::judge_every_row(subject, p, in);
}

// The query rows of a problem that see no key (valid rows only).
std::vector<std::pair<std::int64_t, std::int64_t>> rows_seeing_no_key(const Problem& p) {
  std::vector<std::pair<std::int64_t, std::int64_t>> rows;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 0; i < p.len_q(b); ++i)
      if (visible_key_range(p, b, i).count() == 0) rows.emplace_back(b, i);
  return rows;
}

// A problem whose second batch entry has 40 query rows and 24 keys, bottom-right
// aligned: its rows 0..15 see no key (the padded lengths keep sq <= skv, as
// cuDNN's bottom-right masks need).
constexpr const char* kFullyMaskedForward =
    "b=2 hq=2 sq=48 skv=64 lens_q=48,40 lens_kv=64,24 d=64 dtype=bf16 mask=causal_br dseed=6";
const std::string kFullyMaskedLine = std::string(kFullyMaskedForward) + " pass=bwd";

// The domain check comes first, on any machine: outside it nothing runs.
// Then a machine without a usable GPU is `unavailable`, never ok.
TEST(CudnnBackward, OutsideTheDomainIsRefusedAndNoGpuIsUnavailable) {
  Subject* cudnn = Registry::instance().find("cudnn");
  ASSERT_NE(cudnn, nullptr);
  EXPECT_TRUE(cudnn->capabilities().backward);
  EXPECT_TRUE(cudnn->capabilities().backward_deterministic);
  for (const char* outside : {
           "b=1 hq=2 sq=16 skv=16 d=64 dtype=f32 pass=bwd",                    // f32
           "b=1 hq=2 sq=16 skv=16 d=48 dtype=bf16 pass=bwd",                   // d = 48
           "b=1 hq=2 sq=16 skv=16 d=64 dv=32 dtype=bf16 pass=bwd",             // dv != d
           "b=1 hq=2 sq=32 skv=16 d=64 dtype=f16 mask=causal_br pass=bwd",     // bottom-right with sq > skv
           "b=2 hq=2 sq=16 skv=16 lens_q=16,0 lens_kv=16,8 d=64 dtype=f16 pass=bwd",  // an empty sequence
       }) {
    SCOPED_TRACE(outside);
    const Problem p = parse_problem(outside);
    const BackwardResult r = cudnn->run_backward(p, hand_over(p));
    EXPECT_EQ(r.status, Status::unsupported) << r.message;
    EXPECT_FALSE(r.message.empty());
  }
  const Problem p = parse_problem("b=1 hq=2 sq=16 skv=16 d=64 dtype=bf16 mask=causal_tl pass=bwd");
  const BackwardResult r = cudnn->run_backward(p, hand_over(p));
  std::string why;
  if (cudnn_here(&why)) {
    EXPECT_EQ(r.status, Status::ok) << r.message;
  } else {
    EXPECT_EQ(r.status, Status::unavailable) << r.message;
    EXPECT_FALSE(r.message.empty());
    std::printf("without a GPU: %s\n", r.message.c_str());
  }
}

TEST(GpuCudnnBackward, GradientsPassTheBackwardRuleAgainstTheF64Oracle) {
  std::string why;
  Subject* cudnn = cudnn_here(&why);
  if (!cudnn) GTEST_SKIP() << why;
  ASSERT_TRUE(cudnn->capabilities().backward);
  std::printf("%s\n", cudnn->version_info().c_str());
  const char* lines[] = {
      "b=2 hq=4 sq=128 skv=128 d=64 dtype=bf16 mask=causal_tl pass=bwd dseed=1",
      "b=1 hq=4 sq=100 skv=130 d=128 dtype=f16 mask=none pass=bwd dseed=2",
      "b=2 hq=8 hkv=2 sq=96 skv=160 d=64 dtype=bf16 mask=causal_br pass=bwd dseed=3",
      "b=1 hq=8 hkv=2 sq=150 skv=200 d=128 dtype=f16 mask=window window=20,0 pass=bwd dseed=4",
      "b=3 hq=4 hkv=2 sq=64 skv=80 lens_q=64,33,7 lens_kv=80,50,9 d=64 dtype=f16 mask=causal_tl layout=bshd "
      "pass=bwd dseed=5",
      kFullyMaskedLine.c_str(),
      "b=1 hq=4 hkv=1 sq=64 skv=64 d=128 dtype=bf16 mask=window window=8,4 layout=bshd pass=bwd dout=normal(0,3) "
      "dseed=7",
      "b=2 hq=2 sq=70 skv=90 lens_q=70,31 lens_kv=90,77 d=128 dtype=bf16 mask=none pass=bwd dseed=8",
  };
  for (const char* line : lines) {
    SCOPED_TRACE(line);
    const Problem p = parse_problem(line);
    const BackwardInputs in = hand_over(p);
    const Judged j = judge_gradients(*cudnn, p, in);
    ASSERT_EQ(j.run.status, Status::ok) << j.run.message;
    EXPECT_TRUE(j.verdict.pass) << j.verdict.rule;
    // Not vacuous: rows compared, and gradients of some size in every tensor.
    EXPECT_GT(j.subject.q_rows_compared, 0);
    EXPECT_GT(j.subject.kv_rows_compared, 0);
    for (const TensorMetrics* t : {&j.subject.dq, &j.subject.dk, &j.subject.dv}) EXPECT_GT(t->errors.ref_max_abs, 0.0);
    std::printf("cudnn %s: %s (%.3f ms)\n", line, j.verdict.rule.c_str(), j.run.time_ms);
  }
  std::printf("stats: %s\n", cudnn->stats().c_str());
}

TEST(GpuCudnnBackward, RowsThatSeeNoKeyHaveZeroGradientsAndAddNothing) {
  std::string why;
  Subject* cudnn = cudnn_here(&why);
  if (!cudnn) GTEST_SKIP() << why;
  const Problem p = parse_problem(kFullyMaskedLine);
  const auto empty_rows = rows_seeing_no_key(p);
  ASSERT_EQ(empty_rows.size(), 16u) << "the problem was meant to have 16 rows that see no key";
  const BackwardInputs in = hand_over(p);
  for (const auto& [b, i] : empty_rows)
    ASSERT_EQ(in.forward.lse[(b * p.heads_q) * p.seqlen_q + i], -INFINITY) << "the judge hands -inf there";
  const Judged j = judge_gradients(*cudnn, p, in);
  ASSERT_EQ(j.run.status, Status::ok) << j.run.message;
  EXPECT_TRUE(j.verdict.pass) << j.verdict.rule;
  // cuDNN's own forward on those rows: O = 0 and LSE = -inf, as the judge
  // hands them (the forward's rule checks the -inf position by position).
  const CaseResult forward = judge(*cudnn, parse_problem(kFullyMaskedForward));
  ASSERT_EQ(forward.status, Status::ok) << explain(forward);
  EXPECT_TRUE(forward.passed()) << explain(forward);
  std::int64_t nonzero = 0;
  for (const auto& [b, i] : empty_rows)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t c = 0; c < p.head_dim; ++c) nonzero += j.run.gradients.dq.get(b, h, i, c) != 0.0;
  EXPECT_EQ(nonzero, 0) << "dQ of rows that see no key must be exactly 0";
  // Padding rows come back 0 too (flashcheck's convention).
  for (std::int64_t h = 0; h < p.heads_q; ++h)
    for (std::int64_t i = p.len_q(1); i < p.seqlen_q; ++i) EXPECT_EQ(j.run.gradients.dq.get(1, h, i, 0), 0.0);
}

// What cuDNN does when handed flashcheck's -inf as the LSE of rows that see
// no key. Either it copes (then handing +inf there changes no bit anywhere) or
// it does not (then the substitution is what keeps the gradients finite, and
// the difference is printed as the evidence).
TEST(GpuCudnnBackward, WhatCudnnDoesWithAnLseOfMinusInfinity) {
  std::string why;
  Subject* cudnn = cudnn_here(&why);
  if (!cudnn) GTEST_SKIP() << why;
  const Problem p = parse_problem(kFullyMaskedLine);
  const auto empty_rows = rows_seeing_no_key(p);
  const BackwardInputs in = hand_over(p);
  cudnn_testing::hand_stats_as_given(true);
  const BackwardResult as_given = cudnn->run_backward(p, in);
  cudnn_testing::hand_stats_as_given(false);
  const BackwardResult handled = cudnn->run_backward(p, in);
  ASSERT_EQ(handled.status, Status::ok) << handled.message;
  const auto census = [&](const BackwardResult& r) {
    std::int64_t nonfinite = 0, nonzero_empty = 0;
    for (const HostTensor* g : {&r.gradients.dq, &r.gradients.dk, &r.gradients.dv})
      for (std::int64_t n = 0; n < g->size(); ++n) nonfinite += !std::isfinite(g->load(n));
    for (const auto& [b, i] : empty_rows)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t c = 0; c < p.head_dim; ++c) nonzero_empty += r.gradients.dq.get(b, h, i, c) != 0.0;
    return std::pair{nonfinite, nonzero_empty};
  };
  const auto [handled_nonfinite, handled_nonzero] = census(handled);
  EXPECT_EQ(handled_nonfinite, 0);
  EXPECT_EQ(handled_nonzero, 0);
  std::string finding;
  if (as_given.status != Status::ok) {
    finding = "with LSE = -inf cuDNN's backward did not run: " + as_given.message;
  } else {
    const auto [nonfinite, nonzero] = census(as_given);
    if (nonfinite == 0 && nonzero == 0) {
      finding = "cuDNN copes with LSE = -inf on rows that see no key: the +inf it is handed there changes no bit";
      EXPECT_TRUE(as_given.gradients.dq == handled.gradients.dq);
      EXPECT_TRUE(as_given.gradients.dk == handled.gradients.dk);
      EXPECT_TRUE(as_given.gradients.dv == handled.gradients.dv);
    } else {
      finding = "with LSE = -inf on rows that see no key cuDNN's backward gives " + std::to_string(nonfinite) +
                " non-finite gradient element(s) and " + std::to_string(nonzero) +
                " non-zero dQ element(s) on those rows; with +inf, none";
    }
  }
  std::printf("finding: %s\n", finding.c_str());
  RecordProperty("finding", finding);
}

TEST(GpuCudnnBackward, TheDeclaredDeterminismHoldsToEveryBitOverReruns) {
  std::string why;
  Subject* cudnn = cudnn_here(&why);
  if (!cudnn) GTEST_SKIP() << why;
  ASSERT_TRUE(cudnn->capabilities().backward_deterministic) << "the test holds a declared-deterministic backward";
  // Long key sequences and GQA: where an atomic dQ (or dK/dV group sum) would
  // add in a different order from run to run.
  const char* lines[] = {
      "b=2 hq=8 hkv=2 sq=512 skv=1024 d=128 dtype=bf16 mask=none pass=bwd dseed=11",
      "b=1 hq=4 sq=384 skv=384 d=64 dtype=f16 mask=causal_tl pass=bwd dseed=12",
  };
  constexpr int kReruns = 20;
  for (const char* line : lines) {
    SCOPED_TRACE(line);
    const Problem p = parse_problem(line);
    const BackwardInputs in = hand_over(p);
    const BackwardResult first = cudnn->run_backward(p, in);
    ASSERT_EQ(first.status, Status::ok) << first.message;
    int differing = 0;
    for (int rerun = 1; rerun < kReruns; ++rerun) {
      const BackwardResult again = cudnn->run_backward(p, in);
      ASSERT_EQ(again.status, Status::ok) << again.message;
      differing += !(again.gradients.dq == first.gradients.dq && again.gradients.dk == first.gradients.dk &&
                     again.gradients.dv == first.gradients.dv);
    }
    EXPECT_EQ(differing, 0) << differing << " of " << kReruns - 1 << " reruns differ from the first in some bit";
    std::printf("cudnn %s: %d reruns, %d differ\n", line, kReruns - 1, differing);
  }
}

}  // namespace
}  // namespace flashcheck
