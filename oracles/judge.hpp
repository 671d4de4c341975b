// The judge: runs one case end to end. It draws the inputs, runs the subject,
// computes the f64 oracle and the same-precision baseline on the same rows,
// measures both against the oracle and applies the tolerance rule.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/metrics.hpp"
#include "core/subject.hpp"
#include "core/tolerance.hpp"

namespace flashcheck {

struct JudgeOptions {
  /// Query rows checked per (batch, head): every row when seqlen_q is at most
  /// this, otherwise a sample of this size (first/last rows and tile edges always in).
  std::int64_t max_rows = 1024;
  std::uint64_t row_seed = 0;
};

/// Everything one case produced.
struct CaseResult {
  Problem problem;
  std::string subject;
  Status status = Status::ok;
  std::string message;              // why it was unsupported or failed to run
  DType baseline_dtype = DType::f32;
  RowSet rows;
  CaseMetrics subject_metrics;      // subject vs cpu_f64
  CaseMetrics baseline_metrics;     // cpu_lowp vs cpu_f64
  Verdict verdict;
  double inputs_ms = 0, subject_ms = 0, oracle_ms = 0, baseline_ms = 0;

  bool ran() const { return status == Status::ok; }
  bool passed() const { return ran() && verdict.pass; }
  /// The command that replays this case.
  std::string reproducer() const;
};

/// Judges one case. Throws BadInput for an invalid problem.
CaseResult judge(Subject& subject, const Problem& problem, const JudgeOptions& options = {});

/// The case's record (one JSON Lines object).
nlohmann::json to_record(const CaseResult& result);

}  // namespace flashcheck
