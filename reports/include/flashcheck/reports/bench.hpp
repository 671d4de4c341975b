// `flashcheck bench`: times subjects on problems in one process, after
// measuring the machine's ceilings, and gives every figure also as a fraction
// of them. cuDNN is timed alongside on every problem in its domain.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/subject.hpp"

namespace flashcheck::reports {

struct BenchOptions {
  std::vector<Subject*> subjects;
  bool every_subject = false;  // `all`: CPU subjects are left out silently
  std::vector<Problem> problems;
  std::string record_path;     // JSON Lines: a ceiling record, then one per timing
  int warmup = 3;
  int repeats = 20;
  int input_sets = 0;          // 0: enough copies of the inputs to exceed twice the L2
  /// The peers: on each problem the first whose domain holds it (peer_for)
  /// is timed first, and every subject's time compared with its time (the
  /// CLI gives cuDNN, then cudnn-fp8, unless --peer names others). Not
  /// owned; empty for none.
  std::vector<Subject*> peers;
  /// Called with (problem index, subject name) before a subject is timed on a
  /// problem, and with an empty name once it is done (the CLI's progress line).
  std::function<void(std::size_t, std::string_view)> progress;
};

/// Runs the bench; returns 0 when every pair was timed, 1 when some timing
/// failed (a fault, an error), 2 when nothing could be timed.
int run_bench(const BenchOptions& options);

/// One subject's median time on one problem, for the problem's summary line.
struct TimedSubject {
  std::string name;
  double median_ms = 0;
  bool peer = false;
};

/// A problem's summary line, printed under its rows: the fastest subject (the
/// peer among them) and every subject's speed over the peer's, e.g.
///   "  best: hopper 0.907 ms, 0.91x cudnn; vs cudnn: hopper 0.91x, mma-kv-pipelined 0.46x"
/// Without the peer's time: the fastest subject alone, and why no ratio. Empty
/// when nothing was timed on the problem.
std::string problem_summary(const std::vector<TimedSubject>& timed, std::string_view peer_name);

/// Problems of at most this many queries are bandwidth-bound (decode): their
/// headline fraction is of the copy ceiling, not the GEMM's.
inline constexpr std::int64_t kDecodeMaxQueries = 16;

}  // namespace flashcheck::reports
