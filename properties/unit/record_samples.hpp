// One record of every kind and shape that flashcheck writes, built the way its
// producers build them: judged cases through the judge and to_record (a pass,
// a fail, a vacuous case, a deviation, with a peer; unsupported, unavailable,
// a fault, an error), a sweep's lost cases (crash, timeout, a worker error), a
// fuzz case and the sanitizer mode's shapes, a bench timing (the peer's and a
// subject's) and the ceilings. Used by the round-trip tests (record_test.cpp)
// and by the schema test (record_samples.cpp, record_schema_test.py).
#pragma once

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "flashcheck/core/record.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"

namespace flashcheck::testing_records {

/// cpu-lowp's arithmetic, made to misbehave on demand.
class ScriptedSubject final : public Subject {
 public:
  enum class Mode { plain, offset, overflow, status };
  ScriptedSubject(Mode mode, bool declares_limit = false, Status status = Status::ok, std::string message = {})
      : mode_(mode), status_(status), message_(std::move(message)) {
    caps_ = kCpuLowpCapabilities;
    caps_.backward = true;
    if (declares_limit) caps_.accumulator_max = std::numeric_limits<float>::max();
  }
  /// cpu_lowp's gradients on every row (offset: dQ off by 0.5).
  BackwardResult run_backward(const Problem& problem, const BackwardInputs& in) override {
    if (auto refused = refuse_backward_outside(caps_, problem)) return *refused;
    if (mode_ == Mode::status) return BackwardResult{status_, message_, {}, std::numeric_limits<double>::quiet_NaN()};
    const GradientRows g =
        cpu_lowp_gradients(problem, in.inputs, in.dout, all_rows(problem), all_key_rows(problem), problem.dtype);
    BackwardResult result{Status::ok, {}, make_gradients(problem), 0.5};
    const double offset = mode_ == Mode::offset ? 0.5 : 0.0;
    for (std::int64_t b = 0; b < problem.batch; ++b) {
      for (std::int64_t h = 0; h < problem.heads_q; ++h)
        for (std::int64_t s = 0; s < problem.seqlen_q; ++s)
          for (std::int64_t c = 0; c < problem.head_dim; ++c)
            result.gradients.dq.set(b, h, s, c, g.dq_row(b, h, s)[c] + offset);
      for (std::int64_t h = 0; h < problem.heads_kv; ++h)
        for (std::int64_t s = 0; s < problem.seqlen_kv; ++s) {
          for (std::int64_t c = 0; c < problem.head_dim; ++c) result.gradients.dk.set(b, h, s, c, g.dk_row(b, h, s)[c]);
          for (std::int64_t c = 0; c < problem.head_dim_v; ++c) result.gradients.dv.set(b, h, s, c, g.dv_row(b, h, s)[c]);
        }
    }
    return result;
  }
  std::string_view name() const override { return "scripted"; }
  std::string_view description() const override { return "cpu-lowp, misbehaving on demand"; }
  const Capabilities& capabilities() const override { return caps_; }
  RunResult run(const Problem& problem, const Inputs& inputs) override {
    if (auto refused = refuse_outside(caps_, problem)) return *refused;
    if (mode_ == Mode::status) return RunResult{status_, message_, {}, std::numeric_limits<double>::quiet_NaN()};
    RunResult result = inner_.run(problem, inputs);
    result.time_ms = 0.25;  // a subject that reports its own time
    if (mode_ == Mode::plain) return result;
    for (std::int64_t b = 0; b < problem.batch; ++b)
      for (std::int64_t h = 0; h < problem.heads_q; ++h)
        for (std::int64_t s = 0; s < problem.seqlen_q; ++s)
          for (std::int64_t c = 0; c < problem.head_dim_v; ++c)
            result.outputs.o.set(b, h, s, c,
                                 mode_ == Mode::offset ? result.outputs.o.get(b, h, s, c) + 0.5
                                                       : -std::numeric_limits<double>::infinity());
    return result;
  }

 private:
  Mode mode_;
  Status status_;
  std::string message_;
  Capabilities caps_;
  CpuLowp inner_;
};

struct NamedRecord {
  std::string name;  // the shape, for test names and messages
  Record record;
};

inline CaseRecord judged(ScriptedSubject subject, const std::string& line, Subject* peer = nullptr) {
  JudgeOptions options;
  if (peer) options.peers = {peer};
  options.max_rows = 16;
  return to_record(judge(subject, parse_problem(line), options));
}

/// A sweep's record of a case its worker never answered (fuzz/sweep.cpp record_of).
inline CaseRecord lost(CaseVerdict verdict, const std::string& check, const std::string& message) {
  CaseRecord r;
  r.verdict = verdict;
  r.check = check;
  r.message = message;
  r.case_key = "7:12";
  r.subject = "cpu-plain";
  r.problem = "b=1 hq=2 hkv=2 sq=8 skv=8 d=8 dv=8 dtype=f16";
  r.reproducer = replay_command("cpu-plain", parse_problem(r.problem));
  r.sweep = SweepOrigin{7, 0, 2, {}};
  return r;
}

inline std::vector<NamedRecord> record_samples() {
  using Mode = ScriptedSubject::Mode;
  std::vector<NamedRecord> samples;
  const std::string small = "b=1 hq=2 sq=8 skv=8 d=8 dtype=f16";
  CpuLowp peer;
  samples.push_back({"case pass with a peer", judged(ScriptedSubject(Mode::plain), small, &peer)});
  samples.push_back({"case pass on sampled rows, f32", judged(ScriptedSubject(Mode::plain),
                                                                "b=2 hq=4 hkv=2 sq=40 skv=33 d=16 dtype=f32 mask=causal_br")});
  samples.push_back({"case fail", judged(ScriptedSubject(Mode::offset), small)});
  samples.push_back({"case vacuous", judged(ScriptedSubject(Mode::plain), "b=1 hq=2 sq=8 skv=0 d=8 dtype=bf16")});
  const std::string near_overflow = "b=1 hq=2 sq=16 skv=16 d=16 dtype=bf16 values=near_overflow(3000,0.9)";
  samples.push_back({"case deviation", judged(ScriptedSubject(Mode::overflow, true), near_overflow)});
  samples.push_back({"case fail with non-finite outputs", judged(ScriptedSubject(Mode::overflow, false), near_overflow)});
  samples.push_back({"case unsupported", judged(ScriptedSubject(Mode::plain), "b=1 hq=2 sq=8 skv=8 d=800 dtype=f16")});
  samples.push_back({"case unavailable",
                     judged(ScriptedSubject(Mode::status, false, Status::unavailable, "no CUDA device"), small)});
  samples.push_back({"case fault",
                     judged(ScriptedSubject(Mode::status, false, Status::fault, "an illegal memory access"), small)});
  samples.push_back({"case error", judged(ScriptedSubject(Mode::status, false, Status::error, "out-of-bounds write"), small)});
  // Backward cases (pass=bwd): gradients, with a peer; a failure; sampled rows.
  const std::string backward = "b=1 hq=4 hkv=2 sq=12 skv=10 d=8 dtype=bf16 mask=causal_br pass=bwd";
  ScriptedSubject backward_peer(Mode::plain);
  samples.push_back({"backward pass with a peer", judged(ScriptedSubject(Mode::plain), backward, &backward_peer)});
  samples.push_back({"backward fail", judged(ScriptedSubject(Mode::offset), backward)});
  samples.push_back({"backward on sampled rows", judged(ScriptedSubject(Mode::plain),
                                                         "b=1 hq=2 sq=40 skv=30 d=8 dtype=f16 pass=bwd dout=uniform(-1,1)")});

  // A fuzz case: the worker's judged record, with what the sweep adds.
  CaseRecord fuzzed = judged(ScriptedSubject(Mode::offset), small);
  fuzzed.case_key = "7:3";
  fuzzed.check = "o.max_abs";
  fuzzed.worst_ratio = std::numeric_limits<double>::infinity();
  fuzzed.sweep = SweepOrigin{7, 1, 2, {}};
  fuzzed.shrunk_problem = "b=1 hq=1 sq=1 skv=1 d=8 dtype=f16";
  samples.push_back({"fuzz case, shrunk", fuzzed});
  samples.push_back({"sweep crash", lost(CaseVerdict::crash, "crash", "worker killed by signal 11 (Segmentation fault)")});
  samples.push_back({"sweep timeout", lost(CaseVerdict::timeout, "timeout", "no answer within the 60 s watchdog")});
  CaseRecord garbled = lost(CaseVerdict::error, "error", "the worker wrote a line that is not a record (not JSON)");
  garbled.sweep.reset();
  samples.push_back({"sweep worker error", garbled});

  // The sanitizer mode: a finding on a judged case, and a worker that died under the tool.
  CaseRecord finding = judged(ScriptedSubject(Mode::plain), small);
  finding.verdict = CaseVerdict::fail;
  finding.check = "sanitizer:memcheck";
  finding.message = "========= Invalid __global__ read of size 4 bytes";
  finding.case_key = "sanitize:memcheck:7:scripted:0";
  finding.sanitizer = SanitizerRun{"memcheck", 86, "/tmp/x/logs/scripted.memcheck.0.log",
                                   {"========= Invalid __global__ read of size 4 bytes", "=========     at fwd+0x40"}};
  finding.sweep = SweepOrigin{7, std::nullopt, std::nullopt, "memcheck"};
  samples.push_back({"sanitize finding", finding});
  CaseRecord died = lost(CaseVerdict::crash, "crash", "killed by signal 9");
  died.sanitizer = SanitizerRun{"racecheck", -1, "/tmp/x/logs/scripted.racecheck.1.log", {}};
  died.sweep = SweepOrigin{7, std::nullopt, std::nullopt, "racecheck"};
  samples.push_back({"sanitize crash", died});

  BenchRecord timing;
  timing.time = 1764100000;
  timing.subject = "cudnn";
  timing.peer = true;
  timing.problem = "b=4 hq=16 sq=4096 skv=4096 d=128 dtype=bf16";
  timing.dtype = DType::bf16;
  timing.bound = "compute";
  timing.median_ms = 1.25;
  timing.min_ms = 1.125;
  timing.max_ms = 1.5;
  timing.samples_ms = {1.25, 1.125, 1.5, 1.25};
  timing.flops = 1.1e12;
  timing.tflops = 880;
  timing.fraction_of_gemm = 0.9;
  timing.bytes = 2.7e8;
  timing.gbps = 215;
  timing.fraction_of_copy = 0.07;
  timing.fraction_of_read = 0.065;
  timing.warmup = 3;
  timing.repeats = 20;
  timing.input_sets = 4;
  timing.device = "NVIDIA H100 80GB HBM3, sm_90, 132 SMs";
  samples.push_back({"bench, the peer", timing});
  BenchRecord subject = timing;
  subject.subject = "mma-swizzled";
  subject.peer = false;
  subject.median_ms = 2.5;
  subject.speed_vs_peer = 0.5;
  subject.peer_subject = "cudnn";
  samples.push_back({"bench, a subject against the peer", subject});

  CeilingRecord ceiling;
  ceiling.time = 1764100000;
  ceiling.device = "NVIDIA H100 80GB HBM3, sm_90, 132 SMs";
  ceiling.gemm_bf16_tflops = 740;
  ceiling.gemm_f32_tflops = 51.5;
  ceiling.copy_gbps = 2900;
  ceiling.read_gbps = 3100;
  ceiling.l2_bytes = 52428800;
  ceiling.method = "cublasGemmEx 8192^3, median of 20";
  samples.push_back({"ceiling", ceiling});
  return samples;
}

}  // namespace flashcheck::testing_records
