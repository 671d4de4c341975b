// The summary a sweep prints when it ends: the time shares, one line per
// subject, what could not run here, and the mutation score (private to fuzz/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>

#include "flashcheck/fuzz/fuzz.hpp"

namespace flashcheck::fuzz::detail {

struct SubjectStats {
  std::int64_t cases = 0, passed = 0, unsupported = 0, unavailable = 0, vacuous = 0, deviations = 0;
  std::string unavailable_because;  // the first unavailable case's message
  std::map<std::string, std::int64_t> failures;  // by check
  double worst_ratio = 0;
  double seconds = 0;
};

/// What a sweep counted, for its summary.
struct SweepTotals {
  std::int64_t ran = 0, failures = 0, resumed = 0;
  double wall_ms = 0;
  std::size_t workers = 1;
  std::filesystem::path records;
  double subject_ms = 0, oracle_ms = 0, inputs_ms = 0;
  std::map<std::string, SubjectStats> stats;
  std::map<std::string, std::optional<double>> first_catch;  // mutant -> seconds into this run
  std::set<std::string> caught;
};

/// Prints the summary (the mutation score too, with mutants) and returns the
/// sweep's exit code: 0 passed, 1 a failure (or a surviving mutant, or an
/// unavailable subject under --require-gpu), 2 no case ran.
int summarise(const FuzzOptions& options, const SweepTotals& totals, std::ostream& log);

}  // namespace flashcheck::fuzz::detail
