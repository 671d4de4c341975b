// fa2-rowthread-bwd, the GPU backward subject, and its atomic-dQ mutant
// (issue 22 item 7): the subject passes the backward rule on a spread of
// pass=bwd problems and is bitwise repeatable over reruns, also while another
// stream keeps the GPU busy; the mutant, whose gradients are as accurate,
// gives different bits across the same reruns: the error rule cannot see its
// flaw, the determinism check must. The mma.sync backward (issue 23):
// fa2-mma-bwd-det bitwise repeatable over 1000 reruns, half of them beside a
// busy stream (GpuMmaBackward, label harness), and fa2-mma-bwd, declared not
// deterministic, seen changing bits over the same kind of reruns. GPU only;
// SKIPPED without one.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/kernels/backward/mma.hpp"
#include "flashcheck/kernels/backward/rowthread.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "properties/ctest_resources.hpp"
#include "properties/gpu/busy_stream.hpp"

namespace flashcheck {
namespace {

using kernels::kAtomicDqMutantName;
using kernels::kMmaBackwardDeterministicName;
using kernels::kMmaBackwardName;
using kernels::kRowthreadBackwardName;

// The judged problems: every dtype, every mask, GQA (hq=8 hkv=2) and MQA,
// varlen with an empty sequence, d = 64/128/256 and dv != d, both layouts, and
// fully masked rows (causal_br with sq > skv: rows 0..39 of the second line
// see no key).
constexpr const char* kJudgedLines[] = {
    "b=2 hq=8 hkv=2 sq=70 skv=130 d=64 dtype=bf16 mask=causal_br pass=bwd dseed=1",
    "b=1 hq=2 hkv=1 sq=100 skv=60 d=128 dtype=f16 mask=causal_br pass=bwd dseed=2",
    "b=2 hq=4 hkv=2 sq=65 skv=97 lens_q=65,17 lens_kv=97,40 d=256 dtype=f32 layout=bshd mask=window window=16,8 "
    "pass=bwd dseed=3",
    "b=1 hq=3 hkv=3 sq=33 skv=47 d=40 dv=72 dtype=bf16 mask=causal_tl pass=bwd dseed=4",
    "b=2 hq=8 hkv=2 sq=64 skv=80 lens_q=64,0 lens_kv=30,80 d=256 dtype=bf16 layout=bshd pass=bwd dseed=5",
    "b=1 hq=4 hkv=1 sq=129 skv=129 d=128 dtype=f16 mask=window window=-1,0 pass=bwd dout=normal(0,3) dseed=6",
};

// The rerun problem: 32 key blocks of 64 per K/V head and 4 query heads per
// group, so that the mutant's 64 warps per K/V head add into each dQ element
// at once and their order varies; f32, so that every changed bit of the sum
// shows in dQ.
constexpr const char* kRerunLine = "b=1 hq=8 hkv=2 sq=128 skv=2048 d=64 dtype=f32 pass=bwd dseed=7";
constexpr int kReruns = 20;

// The mma backward's rerun problem: bf16 (its dtypes), 32 key blocks of 64 per
// K/V head adding into each dQ element of the atomic subject, 4 query heads a group.
constexpr const char* kMmaRerunLine = "b=1 hq=8 hkv=2 sq=128 skv=2048 d=64 dtype=bf16 pass=bwd dseed=7";

// Why the subject cannot run here (the test is then SKIPPED), or empty.
std::string missing_gpu(const Subject& subject) {
  const auto why = unavailable_reason(subject.capabilities());
  return why ? fmt::format("{} is unavailable here: {}", subject.name(), *why) : std::string();
}

BackwardInputs handed_inputs(const Problem& p) {
  BackwardInputs handed;
  handed.inputs = generate_inputs(p);
  handed.dout = generate_dout(p);
  handed.forward = backward_outputs(p, cpu_f64_reference(p, handed.inputs, all_rows(p)));
  return handed;
}

// The first element at which two tensors' bits differ, in words, or empty.
std::string first_difference(const char* label, const HostTensor& a, const HostTensor& b) {
  const int bytes = storage_bytes(a.dtype());
  for (std::int64_t n = 0; n < a.size(); ++n)
    if (std::memcmp(static_cast<const char*>(a.data()) + n * bytes, static_cast<const char*>(b.data()) + n * bytes,
                    bytes) != 0)
      return fmt::format("{} element {}: {} vs {}", label, n, a.load(n), b.load(n));
  return {};
}

std::string first_difference(const Gradients& a, const Gradients& b) {
  for (const auto& [label, x, y] : {std::tuple{"dQ", &a.dq, &b.dq}, std::tuple{"dK", &a.dk, &b.dk},
                                    std::tuple{"dV", &a.dv, &b.dv}})
    if (std::string where = first_difference(label, *x, *y); !where.empty()) return where;
  return {};
}

// No vacuous comparison: the gradients hold non-zero finite values.
double norm(const HostTensor& t) {
  double sum = 0;
  for (std::int64_t n = 0; n < t.size(); ++n)
    if (std::isfinite(t.load(n))) sum += t.load(n) * t.load(n);
  return std::sqrt(sum);
}

struct Reruns {
  int differing = 0;          // reruns whose bits differ from the first run's
  std::string first_change;   // where the first of them differs
};

// Runs the backward once, then `count` times quietly and `count` times with a
// busy kernel on another stream (1 to 4 blocks per SM, varying), comparing
// every rerun's bits with the first run's.
Reruns rerun(Subject& subject, const Problem& p, const BackwardInputs& handed, int count = kReruns) {
  Reruns reruns;
  const BackwardResult first = subject.run_backward(p, handed);
  EXPECT_EQ(first.status, Status::ok) << first.message;
  if (first.status != Status::ok) return reruns;
  EXPECT_GT(norm(first.gradients.dq), 0);
  EXPECT_GT(norm(first.gradients.dk), 0);
  EXPECT_GT(norm(first.gradients.dv), 0);
  testing_gpu::BusyStream busy;
  for (int run = 0; run < 2 * count; ++run) {
    const bool loaded = run >= count;
    if (loaded) busy.start(1 + run % 4, 20);
    const BackwardResult again = subject.run_backward(p, handed);
    if (loaded) busy.finish();
    EXPECT_EQ(again.status, Status::ok) << again.message;
    if (again.status != Status::ok) continue;
    if (const std::string where = first_difference(first.gradients, again.gradients); !where.empty()) {
      if (reruns.differing++ == 0)
        reruns.first_change = fmt::format("rerun {} ({}): {}", run, loaded ? "busy GPU" : "quiet GPU", where);
    }
  }
  return reruns;
}

Subject& find(std::string_view name) {
  Subject* subject = Registry::instance().find(name);
  if (!subject) throw std::runtime_error(fmt::format("{} is not registered in this binary", name));
  return *subject;
}

// Runs on any machine: the refusals come before any device call.
TEST(RowthreadBackward, RefusesOutsideItsDomainAndIsUnavailableWithoutAGpu) {
  Subject& subject = find(kRowthreadBackwardName);
  const Problem outside = parse_problem("b=1 hq=2 sq=10 skv=10 d=512 dtype=f16 pass=bwd");
  const BackwardResult refused = subject.run_backward(outside, handed_inputs(outside));
  EXPECT_EQ(refused.status, Status::unsupported) << refused.message;
  EXPECT_NE(refused.message.find("head_dim 512"), std::string::npos) << refused.message;
  const Problem inside = parse_problem("b=1 hq=2 sq=10 skv=10 d=64 dtype=f16 pass=bwd");
  const BackwardResult run = subject.run_backward(inside, handed_inputs(inside));
  if (missing_gpu(subject).empty()) EXPECT_EQ(run.status, Status::ok) << run.message;
  else EXPECT_EQ(run.status, Status::unavailable) << run.message;
}

TEST(GpuRowthreadBackward, PassesTheBackwardRule) {
  Subject& subject = find(kRowthreadBackwardName);
  if (const std::string why = missing_gpu(subject); !why.empty()) GTEST_SKIP() << why;
  for (const char* line : kJudgedLines) {
    const Problem p = parse_problem(line);
    ASSERT_FALSE(unsupported_reason(subject.capabilities(), p)) << line;
    const CaseResult result = judge(subject, p);
    ASSERT_EQ(result.status, Status::ok) << explain(result);
    EXPECT_TRUE(result.passed()) << explain(result);
    EXPECT_TRUE(result.on_every_row()) << line;  // small enough that no row is sampled
  }
}

TEST(GpuRowthreadBackward, IsBitwiseRepeatableAlsoUnderABusyGpu) {
  Subject& subject = find(kRowthreadBackwardName);
  if (const std::string why = missing_gpu(subject); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(subject.capabilities().backward_deterministic);
  const Problem p = parse_problem(kRerunLine);
  const BackwardInputs handed = handed_inputs(p);
  const Reruns reruns = rerun(subject, p, handed);
  EXPECT_EQ(reruns.differing, 0) << reruns.differing << " of " << 2 * kReruns << " reruns changed bits; the first "
                                 << reruns.first_change << "\n  problem: " << kRerunLine;
}

// The mutant is caught by the reruns alone: its gradients pass the error rule
// (on the first judged problem; where the judge reruns a declared-deterministic
// backward itself, it may fail there, on determinism and nothing else), and
// over the same reruns as the subject's its bits change.
TEST(GpuRowthreadBackward, TheAtomicDqMutantPassesTheRuleButNotTheReruns) {
  Subject& mutant = find(kAtomicDqMutantName);
  if (const std::string why = missing_gpu(mutant); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(mutant.capabilities().backward_deterministic);  // what it declares, falsely
  const CaseResult judged = judge(mutant, parse_problem(kJudgedLines[0]));
  ASSERT_EQ(judged.status, Status::ok) << explain(judged);
  const bool caught_on_determinism = judged.verdict.rule.rfind("determinism", 0) == 0;
  EXPECT_TRUE(judged.passed() || caught_on_determinism)
      << "the mutant's flaw is its order only; the error rule should hold:\n" << explain(judged);

  const Problem p = parse_problem(kRerunLine);
  const BackwardInputs handed = handed_inputs(p);
  const Reruns reruns = rerun(mutant, p, handed);
  EXPECT_GE(reruns.differing, 1) << "the atomic-dQ mutant gave the same bits on all " << 2 * kReruns
                                 << " reruns of " << kRerunLine << ": the determinism check cannot catch it here";
  if (reruns.differing > 0)
    fmt::print("MUTANT CAUGHT: {} changed bits in {} of {} reruns; the first {}\n", kAtomicDqMutantName,
               reruns.differing, 2 * kReruns, reruns.first_change);
}

// More (batch, head) pairs than a grid's y holds (65535): the backward
// family's kernels run them as z slices (common/attention.cuh: pair_grid), each
// block finding its pair from y and z. 65600 query and K/V head pairs.
TEST(GpuMmaBackward, RunsMoreHeadPairsThanAGridsYHolds) {
  const Problem p = parse_problem("b=1 hq=65600 hkv=65600 sq=1 skv=2 d=64 dtype=bf16 pass=bwd");
  for (std::string_view name : {kRowthreadBackwardName, kMmaBackwardName, kMmaBackwardDeterministicName}) {
    Subject& subject = find(name);
    if (const std::string why = missing_gpu(subject); !why.empty()) GTEST_SKIP() << why;
    const CaseResult result = judge(subject, p);
    ASSERT_EQ(result.status, Status::ok) << name << ": " << explain(result);
    EXPECT_TRUE(result.passed()) << name << ": " << explain(result);
  }
}

// fa2-mma-bwd-det: every sum in a fixed order, no atomics; 1000 reruns (500
// quiet, 500 beside a busy stream) give the first run's bits.
TEST(GpuMmaBackward, TheDeterministicSubjectIsBitwiseRepeatableOver1000Reruns) {
  Subject& subject = find(kMmaBackwardDeterministicName);
  if (const std::string why = missing_gpu(subject); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(subject.capabilities().backward_deterministic);
  const Problem p = parse_problem(kMmaRerunLine);
  const Reruns reruns = rerun(subject, p, handed_inputs(p), 500);
  EXPECT_EQ(reruns.differing, 0) << reruns.differing << " of 1000 reruns changed bits; the first "
                                 << reruns.first_change << "\n  problem: " << kMmaRerunLine;
}

// fa2-mma-bwd adds dQ with atomics and says so (backward_deterministic
// false): over 40 reruns its bits change, which is what the declaration is
// for (the judge then holds its reruns to the rule's bound, not to every bit).
TEST(GpuMmaBackward, TheAtomicSubjectChangesBitsAsItDeclares) {
  Subject& subject = find(kMmaBackwardName);
  if (const std::string why = missing_gpu(subject); !why.empty()) GTEST_SKIP() << why;
  ASSERT_FALSE(subject.capabilities().backward_deterministic);
  const Problem p = parse_problem(kMmaRerunLine);
  const Reruns reruns = rerun(subject, p, handed_inputs(p));
  EXPECT_GE(reruns.differing, 1) << "fa2-mma-bwd gave the same bits on all " << 2 * kReruns << " reruns of "
                                 << kMmaRerunLine;
  fmt::print("{} changed bits in {} of {} reruns; the first {}\n", kMmaBackwardName, reruns.differing, 2 * kReruns,
             reruns.first_change);
}

}  // namespace
}  // namespace flashcheck

int main(int argc, char** argv) {
  flashcheck::use_ctest_gpu();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
