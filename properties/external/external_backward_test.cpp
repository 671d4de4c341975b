// The worker protocol's backward (protocol 2), at the Subject level: an
// ExternalSubject's run_backward against properties/external/fake_worker.py
// (standard-library Python, float64 gradients), judged as the backward rule
// judges: compare_gradients against the f64 gradient oracle, decide_gradients
// with cpu_lowp's gradients as the baseline. A correct fake passes, a fake
// whose dK misses the GQA sum is caught, and every misbehaviour of a reply
// (a missing gradient, a wrong shape, the statuses) is a clear result.
//
// TorchBackward runs the same judgement on PyTorch's four SDPA backends
// through external/torch_sdpa.py: SKIPPED where torch or a CUDA device is
// missing (the handshake then fails), as on the CPU CI.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/core/metrics.hpp"
#include "flashcheck/core/tolerance.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/external/protocol.hpp"
#include "flashcheck/external/subject.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/oracles/cpu_f64_backward.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"
#include "properties/judged_backward.hpp"

namespace flashcheck::external {
namespace {

WorkerSpec fake(const std::string& mode, int at = 1) {
  WorkerSpec s;
  s.name = "fake-" + mode;
  s.command = fmt::format("{} {} --mode {} --at {}", FLASHCHECK_PYTHON, FLASHCHECK_FAKE_WORKER, mode, at);
  s.startup_seconds = 20;
  return s;
}

/// What a backward subject is handed (core/backward.hpp): the inputs, the
/// f64 oracle's forward rounded, and dO drawn from its own family.
BackwardInputs hand_over(const Problem& p) {
  BackwardInputs in;
  in.inputs = generate_inputs(p);
  in.forward = backward_outputs(p, cpu_f64_reference(p, in.inputs, all_rows(p)));
  in.dout = generate_dout(p);
  return in;
}

using testing_backward::Judged;

/// One backward case judged on every row, through the judge's judge_backward.
Judged judge_backward(Subject& subject, const Problem& p, const BackwardInputs& in) {
  return testing_backward::judge_every_row(subject, p, in);
}

Judged judge_backward(Subject& subject, const Problem& p) { return judge_backward(subject, p, hand_over(p)); }

/// Whether two tensors hold the same bits (NaN included).
bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.bytes())) == 0;
}

/// The failed checks of a verdict, "dk.max_abs dv.rmse".
std::string failed_checks(const Verdict& verdict) {
  std::string names;
  for (const RuleCheck& check : verdict.checks)
    if (!check.pass) names += (names.empty() ? "" : " ") + check.metric;
  return names;
}

// Inside the fake's domain (d 8 or 16, lengths up to 24, no per-sequence
// lengths): GQA and MQA, each mask, both layouts, the three dtypes, rows
// that see no key (causal_br with sq > skv).
const char* kLines[] = {
    "b=2 hq=4 hkv=2 sq=11 skv=19 d=16 dtype=bf16 layout=bshd mask=causal_br pass=bwd dseed=2",
    "b=1 hq=3 hkv=1 sq=20 skv=9 d=8 dtype=f16 mask=causal_br pass=bwd dout=normal(0,3) dseed=3",
    "b=1 hq=2 hkv=2 sq=16 skv=16 d=16 dv=8 dtype=f32 mask=causal_tl pass=bwd dseed=4",
    "b=2 hq=2 hkv=1 sq=13 skv=24 d=8 dtype=bf16 mask=window window=3,1 pass=bwd dseed=5",
    "b=1 hq=4 hkv=4 sq=7 skv=5 d=16 dtype=f16 layout=bshd pass=bwd values=outliers(0.01,20) dseed=6",
};

TEST(ExternalBackwardProtocol, TheBackwardKeysNeedProtocol2) {
  Capabilities c;
  c.dtypes = {DType::f16};
  c.masks = {MaskKind::none};
  c.backward = c.backward_deterministic = c.backward_operands_in_dtype = true;
  std::string deviations;
  const Capabilities back = capabilities_from_json(to_json(c), deviations, 2);
  EXPECT_TRUE(back.backward);
  EXPECT_TRUE(back.backward_deterministic);
  EXPECT_TRUE(back.backward_operands_in_dtype);
  try {
    capabilities_from_json(to_json(c), deviations, 1);
    ADD_FAILURE() << "a version-1 worker declared a backward";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("capabilities.backward: needs protocol 2 (the worker speaks 1)"),
              std::string::npos)
        << error.what();
  }
  const auto lonely = nlohmann::json::parse(R"({"dtypes": ["f16"], "masks": ["none"], "backward_deterministic": true})");
  EXPECT_THROW(capabilities_from_json(lonely, deviations, 2), std::runtime_error);
  const auto operands_alone =
      nlohmann::json::parse(R"({"dtypes": ["f16"], "masks": ["none"], "backward_operands_in_dtype": true})");
  EXPECT_THROW(capabilities_from_json(operands_alone, deviations, 2), std::runtime_error);
}

TEST(ExternalBackward, ACorrectWorkerPassesTheBackwardRule) {
  ExternalSubject subject(fake("good"));
  ASSERT_TRUE(subject.capabilities().backward);
  EXPECT_TRUE(subject.capabilities().backward_deterministic);
  for (const char* line : kLines) {
    SCOPED_TRACE(line);
    const Problem p = parse_problem(line);
    const Judged j = judge_backward(subject, p);
    ASSERT_EQ(j.run.status, Status::ok) << j.run.message;
    EXPECT_TRUE(j.verdict.pass) << j.verdict.rule;
    // Not vacuous: rows were compared, and the gradients are not all zero.
    EXPECT_GT(j.subject.q_rows_compared, 0);
    EXPECT_GT(j.subject.kv_rows_compared, 0);
    for (const TensorMetrics* t : {&j.subject.dq, &j.subject.dk, &j.subject.dv}) {
      EXPECT_GT(t->errors.ref_max_abs, 0.0);
      EXPECT_EQ(t->census.mismatches, 0);
    }
    EXPECT_TRUE(std::isfinite(j.run.time_ms));
    std::printf("fake-good %s: %s\n", line, j.verdict.rule.c_str());
  }
}

TEST(ExternalBackward, AWorkerWhoseDkMissesTheGqaSumIsCaught) {
  ExternalSubject subject(fake("wrong-dk"));
  const Problem gqa = parse_problem("b=1 hq=4 hkv=2 sq=12 skv=12 d=8 dtype=bf16 pass=bwd dseed=7");
  const Judged j = judge_backward(subject, gqa);
  ASSERT_EQ(j.run.status, Status::ok) << j.run.message;
  EXPECT_FALSE(j.verdict.pass) << j.verdict.rule;
  const std::string failed = failed_checks(j.verdict);
  EXPECT_NE(failed.find("dk."), std::string::npos) << failed;
  EXPECT_NE(failed.find("dv."), std::string::npos) << failed;
  EXPECT_EQ(failed.find("dq."), std::string::npos) << failed;  // dQ is right: the flaw is in the sum alone
  std::printf("fake-wrong-dk caught: %s (failed: %s)\n", j.verdict.rule.c_str(), failed.c_str());
  // Without GQA the flaw has nothing to drop, and the same worker passes.
  const Judged mha = judge_backward(subject, parse_problem("b=1 hq=2 sq=12 skv=12 d=8 dtype=bf16 pass=bwd dseed=7"));
  ASSERT_EQ(mha.run.status, Status::ok) << mha.run.message;
  EXPECT_TRUE(mha.verdict.pass) << mha.verdict.rule;
}

TEST(ExternalBackward, AGradientOfTheWrongShapeOrMissingIsAnErrorAndTheNextCaseIsAnswered) {
  const Problem p = parse_problem("b=1 hq=4 hkv=2 sq=9 skv=13 d=8 dtype=bf16 layout=bshd mask=causal_br pass=bwd");
  {
    ExternalSubject subject(fake("dk-per-head"));  // dK per query head, the GQA sum not done
    const BackwardResult r = subject.run_backward(p, hand_over(p));
    ASSERT_EQ(r.status, Status::error);
    EXPECT_NE(r.message.find("returned dK as '<u2' [1, 13, 4, 8], but the problem needs '<u2' [1, 13, 2, 8] "
                             "(bf16 as its bit pattern)"),
              std::string::npos)
        << r.message;
  }
  ExternalSubject subject(fake("no-dq", 2));  // answers its second case ok without dq.npy
  EXPECT_TRUE(judge_backward(subject, p).verdict.pass);
  const BackwardResult missing = subject.run_backward(p, hand_over(p));
  ASSERT_EQ(missing.status, Status::error);
  EXPECT_NE(missing.message.find("dq.npy: no such file (the worker did not write it)"), std::string::npos)
      << missing.message;
  // The next case is answered, by a restarted worker, correctly.
  const Judged next = judge_backward(subject, p);
  ASSERT_EQ(next.run.status, Status::ok) << next.run.message;
  EXPECT_TRUE(next.verdict.pass) << next.verdict.rule;
}

TEST(ExternalBackward, TheStatusesAreTheForwardsAndACrashRestartsTheWorker) {
  const Problem p = parse_problem("b=1 hq=2 sq=6 skv=6 d=8 dtype=f16 pass=bwd");
  const BackwardInputs in = hand_over(p);
  ExternalSubject unsupported(fake("unsupported"));
  const BackwardResult u = unsupported.run_backward(p, in);
  EXPECT_EQ(u.status, Status::unsupported);
  EXPECT_EQ(u.message, "the fake supports nothing (the worker's answer)");
  ExternalSubject failing(fake("error"));
  const BackwardResult e = failing.run_backward(p, in);
  EXPECT_EQ(e.status, Status::error);
  EXPECT_NE(e.message.find("reported an error: the fake failed, as asked"), std::string::npos) << e.message;
  ExternalSubject crashing(fake("crash", 1));
  const BackwardResult c = crashing.run_backward(p, in);
  EXPECT_EQ(c.status, Status::error);
  EXPECT_NE(c.message.find("during backward case 1"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("killed by signal 11"), std::string::npos) << c.message;
  const Judged after = judge_backward(crashing, p);  // a new worker, its case 1 again: it crashes again
  EXPECT_EQ(after.run.status, Status::error);
  // Outside the declared domain nothing is sent: the fake has no d=32.
  const Problem outside = parse_problem("b=1 hq=2 sq=6 skv=6 d=32 dtype=f16 pass=bwd");
  ExternalSubject good(fake("good"));
  const BackwardResult refused = good.run_backward(outside, hand_over(outside));
  EXPECT_EQ(refused.status, Status::unsupported);
  EXPECT_NE(refused.message.find("head_dim 32"), std::string::npos) << refused.message;
}

TEST(ExternalBackward, AVersion1WorkerServesTheForwardAndIsRefusedTheBackward) {
  ExternalSubject subject(fake("protocol1"));
  EXPECT_FALSE(subject.capabilities().backward);
  const Problem fwd = parse_problem("b=1 hq=4 hkv=2 sq=9 skv=13 d=8 dtype=bf16 mask=causal_br dseed=3");
  const RunResult r = subject.run(fwd, generate_inputs(fwd));
  EXPECT_EQ(r.status, Status::ok) << r.message;
  const Problem bwd = parse_problem("b=1 hq=4 hkv=2 sq=9 skv=13 d=8 dtype=bf16 mask=causal_br pass=bwd dseed=3");
  const BackwardResult b = subject.run_backward(bwd, hand_over(bwd));
  EXPECT_EQ(b.status, Status::unsupported);
  EXPECT_NE(b.message.find("pass=bwd"), std::string::npos) << b.message;
}

// ---- PyTorch's SDPA backends, through autograd (a GPU with torch) -----------

/// The torch backends' backward problems: external/torch_smoke_bwd.problems,
/// which external/torch_sdpa_test.py --pass bwd runs through the CLI too.
std::vector<Problem> torch_problems() {
  const std::string path = std::string(FLASHCHECK_SOURCE_DIR) + "/external/torch_smoke_bwd.problems";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<Problem> problems;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') problems.push_back(parse_problem(line));
  return problems;
}

/// Cases expected to fail, with the reason: torch's bugs (the test fails when
/// torch fixes one, so that the table is kept true). Inferred, before the
/// first GPU run, from the forward's findings (docs/external-subjects.md).
struct KnownFailure {
  const char* backend;  // the subject, or its -det twin
  std::uint64_t dseed;
  const char* why;
};
const KnownFailure kKnownFailures[] = {
    {"torch-efficient", 3,
     "the forward's finding 1: custom_mask_type=2 (bottom-right) with seqlen_q > seqlen_kv loses the diagonal "
     "offset; torch's backward recomputes that forward and uses the same mask"},
};

const KnownFailure* known_failure(const std::string& subject, const Problem& p) {
  const std::string backend = subject.size() > 4 && subject.ends_with("-det") ? subject.substr(0, subject.size() - 4)
                                                                                : subject;
  for (const KnownFailure& known : kKnownFailures)
    if (backend == known.backend && p.data_seed == known.dseed) return &known;
  return nullptr;
}

TEST(ExternalBackwardProtocol, TheTorchProblemsAreBackwardLines) {  // read here, run on a GPU
  const std::vector<Problem> problems = torch_problems();
  EXPECT_GE(problems.size(), 8u);
  for (const Problem& p : problems) EXPECT_EQ(p.pass, Pass::bwd) << to_line(p);
}

class TorchBackward : public ::testing::TestWithParam<const char*> {};

TEST_P(TorchBackward, EveryCaseInsideTheDomainPassesTheBackwardRule) {
  WorkerSpec spec;
  spec.name = GetParam();
  // python3 from PATH, as external/torch_sdpa.json starts it; another
  // command (another Python, another checkout) through the environment.
  const char* command = std::getenv("FLASHCHECK_TORCH_WORKER");
  spec.command = command && *command ? command : fmt::format("python3 {}/external/torch_sdpa.py", FLASHCHECK_SOURCE_DIR);
  spec.startup_seconds = 300;
  std::unique_ptr<ExternalSubject> subject;
  try {
    subject = std::make_unique<ExternalSubject>(spec);
  } catch (const std::runtime_error& error) {
    // No torch, NumPy or CUDA device: the worker refuses the handshake and
    // says why. Anything else (the worker does not run, bad capabilities)
    // is a failure.
    const std::string why = error.what();
    if (why.find("No module named") != std::string::npos || why.find("no CUDA device") != std::string::npos)
      GTEST_SKIP() << "torch with CUDA is not here: " << why;
    FAIL() << why;
  }
  const Capabilities& caps = subject->capabilities();
  ASSERT_TRUE(caps.backward) << spec.name << " declares no backward";
  std::printf("%s: %s; backward_deterministic=%d\n", spec.name.c_str(), subject->version_info().c_str(),
              caps.backward_deterministic);
  int judged = 0;
  for (const Problem& p : torch_problems()) {
    const std::string text = to_line(p);
    const char* line = text.c_str();
    SCOPED_TRACE(spec.name + ": " + text);
    const BackwardInputs in = hand_over(p);
    const Judged j = judge_backward(*subject, p, in);
    if (j.run.status == Status::unsupported) {
      std::printf("%-19s UNSUPPORTED %s: %s\n", spec.name.c_str(), line, j.run.message.c_str());
      continue;
    }
    ASSERT_EQ(j.run.status, Status::ok) << j.run.message;
    ++judged;
    const KnownFailure* known = known_failure(spec.name, p);
    if (known) {
      EXPECT_FALSE(j.verdict.pass) << "expected to fail (" << known->why << "), but passed: update the table";
    } else {
      EXPECT_TRUE(j.verdict.pass) << j.verdict.rule << " (failed: " << failed_checks(j.verdict) << ")";
    }
    std::printf("%-19s %s %s: %s%s\n", spec.name.c_str(), j.verdict.pass ? "PASS" : "FAIL", line,
                j.verdict.rule.c_str(), known ? " (a known failure)" : "");
    // Determinism: a subject that declares it is bitwise repeatable; any
    // other reports how many of its reruns differed.
    int differing = 0;
    for (int rerun = 0; rerun < 5; ++rerun) {
      const BackwardResult again = subject->run_backward(p, in);
      ASSERT_EQ(again.status, Status::ok) << again.message;
      differing += !(same_bits(again.gradients.dq, j.run.gradients.dq) &&
                     same_bits(again.gradients.dk, j.run.gradients.dk) &&
                     same_bits(again.gradients.dv, j.run.gradients.dv));
    }
    if (caps.backward_deterministic) {
      EXPECT_EQ(differing, 0) << "declared deterministic";
    }
    std::printf("%-19s   %d of 5 reruns differ bitwise\n", spec.name.c_str(), differing);
  }
  EXPECT_GT(judged, 0) << "every case unsupported: nothing was judged";
}

INSTANTIATE_TEST_SUITE_P(Backends, TorchBackward,
                         ::testing::Values("torch-flash", "torch-efficient", "torch-cudnn", "torch-math",
                                           "torch-flash-det", "torch-efficient-det"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace flashcheck::external
