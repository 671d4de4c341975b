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
  /// Timed first on every problem in its domain, and every subject's time
  /// compared with its time (the CLI gives cuDNN unless --peer names another).
  /// Not owned; null for none.
  Subject* peer = nullptr;
  /// Called with (problem index, subject name) before a subject is timed on a
  /// problem, and with an empty name once it is done (the CLI's progress line).
  std::function<void(std::size_t, std::string_view)> progress;
};

/// Runs the bench; returns 0 when every pair was timed, 1 when some timing
/// failed (a fault, an error), 2 when nothing could be timed.
int run_bench(const BenchOptions& options);

/// Problems of at most this many queries are bandwidth-bound (decode): their
/// headline fraction is of the copy ceiling, not the GEMM's.
inline constexpr std::int64_t kDecodeMaxQueries = 16;

}  // namespace flashcheck::reports
