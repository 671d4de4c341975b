// The worker side of a sweep (`flashcheck fuzz-worker`): one case per stdin
// line, one record per stdout line. Nothing else is written to stdout.
#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include "flashcheck/core/record.hpp"
#include "flashcheck/fuzz/fuzz.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck::fuzz {

namespace {

/// The check that failed, for the summary's "failures by check".
std::string failed_check(const CaseResult& r) {
  if (!r.ran()) {
    // The GPU harness's memory guards: poisoned outputs left unwritten, guard
    // bands written, inputs modified (GpuSubject::run's violations).
    for (const char* guard : {"unwritten output", "out-of-bounds write", "input modification"})
      if (r.status == Status::error && r.message.find(guard) != std::string::npos) return "memory_guard";
    return std::string(to_string(r.status));
  }
  if (r.verdict.pass) return {};
  if (!r.verdict.census_pass) return "nan_inf_census";
  for (const RuleCheck& check : r.verdict.checks)
    if (!check.pass) return check.metric;
  if (r.verdict.rule.starts_with("determinism")) return "determinism";
  return "rule";
}

/// Query rows the oracles check per (batch, head): all of them while the f64
/// oracle's work stays under ~5e7 multiply-adds, else a sample (first, last,
/// tile edges and random rows) sized to that budget, at least 64. The
/// subject always computes every row; the oracles then cost about as much as
/// a CPU subject and far less than the sweep's GPU kernels at scale.
std::int64_t rows_to_check(const Problem& p) {
  const double per_row = static_cast<double>(p.batch * p.heads_q) * static_cast<double>(p.seqlen_kv) *
                         static_cast<double>(p.head_dim + p.head_dim_v);
  if (per_row <= 0) return 1024;
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(5e7 / per_row), 64, 1024);
}

}  // namespace

int run_worker(EveryRow every_row) {
  std::string line;
  while (std::getline(std::cin, line)) {
    const std::size_t tab1 = line.find('\t'), tab2 = line.find('\t', tab1 + 1);
    CaseRecord record;
    if (tab1 == std::string::npos || tab2 == std::string::npos) {
      record.verdict = CaseVerdict::error;
      record.check = "error";
      record.message = "fuzz-worker: malformed case line";
    } else {
      const std::string key = line.substr(0, tab1), name = line.substr(tab1 + 1, tab2 - tab1 - 1);
      try {
        Subject* subject = Registry::instance().find(name);
        if (!subject) throw std::invalid_argument(fmt::format("unknown subject '{}'", name));
        const Problem problem = parse_problem(line.substr(tab2 + 1));
        JudgeOptions options;
        options.max_rows = rows_to_check(problem);
        options.every_row = every_row;
        const CaseResult result = judge(*subject, problem, options);
        record = to_record(result);
        record.check = failed_check(result);
        record.worst_ratio = result.ran() ? result.verdict.worst_ratio : 0.0;
      } catch (const std::exception& error) {
        record = CaseRecord{};
        record.subject = name;
        record.problem = line.substr(tab2 + 1);
        record.verdict = CaseVerdict::error;
        record.check = "error";
        record.message = error.what();
      }
      record.case_key = key;
    }
    std::cout << dump_record(record) << '\n' << std::flush;
    // A sticky CUDA error leaves this process's context unusable: exit after
    // reporting it, so that the driver starts a fresh worker.
    if (record.status == Status::fault) return 0;
  }
  return 0;
}

}  // namespace flashcheck::fuzz
