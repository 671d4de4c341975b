#include "summary.hpp"

#include <fmt/core.h>

#include <algorithm>

namespace flashcheck::fuzz::detail {
namespace {

SubjectStats stats_of(const SweepTotals& t, const std::string& name) {
  const auto found = t.stats.find(name);
  return found == t.stats.end() ? SubjectStats{} : found->second;
}

}  // namespace

int summarise(const FuzzOptions& options, const SweepTotals& t, std::ostream& log) {
  // Shares of the workers' combined time (wall time x workers: with --gpus they run at once).
  const double worker_ms = t.wall_ms * static_cast<double>(t.workers);
  const auto share = [worker_ms](double ms) { return worker_ms > 0 ? 100 * ms / worker_ms : 0.0; };
  fmt::print("\nsweep summary: {} case(s) run in {:.1f} min ({:.0f} cases/min), {} failure(s); {} recorded before "
             "(resumed); records in {}\n",
             t.ran, t.wall_ms / 6e4, t.wall_ms > 0 ? t.ran / (t.wall_ms / 6e4) : 0.0, t.failures, t.resumed, t.records.string());
  fmt::print("{}: subjects {:.1f} s ({:.0f}%), oracles (f64 + baseline) {:.1f} s ({:.0f}%), inputs {:.1f} s "
             "({:.0f}%), the rest (processes, pipes, shrinking) {:.0f}%\n",
             t.workers > 1 ? fmt::format("time of {} workers", t.workers) : std::string("wall time"),
             t.subject_ms / 1e3, share(t.subject_ms), t.oracle_ms / 1e3, share(t.oracle_ms), t.inputs_ms / 1e3, share(t.inputs_ms),
             std::max(0.0, 100 - share(t.subject_ms) - share(t.oracle_ms) - share(t.inputs_ms)));
  fmt::print("{:<32} {:>7} {:>7} {:>8} {:>8} {:>10} {:>11} {:>9} {:>11} {:>11}  failures by check\n", "subject",
             "cases", "passes", "failures", "vacuous", "deviations", "worst ratio", "cases/min", "unsupported",
             "unavailable");
  for (const auto& [name, s] : t.stats) {
    std::string by_check;
    for (const auto& [check, count] : s.failures) by_check += fmt::format("{}{}={}", by_check.empty() ? "" : " ", check, count);
    fmt::print("{:<32} {:>7} {:>7} {:>8} {:>8} {:>10} {:>11.3g} {:>9.0f} {:>11} {:>11}  {}\n", name, s.cases, s.passed,
               s.cases - s.passed - s.vacuous - s.deviations, s.vacuous, s.deviations, s.worst_ratio,
               s.seconds > 0 ? 60 * s.cases / s.seconds : 0.0, s.unsupported, s.unavailable, by_check);
  }
  // Subjects this machine cannot run: said, never passed; failures under --require-gpu.
  std::int64_t unavailable_subjects = 0;
  for (const auto& [name, s] : t.stats)
    if (s.unavailable > 0) {
      ++unavailable_subjects;
      if (options.require_gpu)
        fmt::print(stderr, "flashcheck: --require-gpu: {} is unavailable here: {}\n", name, s.unavailable_because);
      else
        fmt::print("UNAVAILABLE  {}: {} case(s) not run on this machine: {}\n", name, s.unavailable,
                   s.unavailable_because);
    }
  if (options.require_gpu && unavailable_subjects > 0) return 1;
  if (t.ran == 0 && t.resumed == 0) {  // nothing judged: never a pass
    std::int64_t skipped = 0;
    for (const auto& [name, s] : t.stats) skipped += s.unsupported + s.unavailable;
    fmt::print(stderr, "fuzz: no case ran: {}\n",
               skipped > 0 ? fmt::format("all {} case(s) drawn were unsupported or unavailable on this machine", skipped)
                           : std::string("the budget ended before the first case (raise --minutes or --cases)"));
    return 2;
  }
  if (t.first_catch.empty()) return t.failures > 0 ? 1 : 0;

  // The mutation score: caught / total, and when each was first caught.
  std::size_t not_run = 0;
  for (const auto& [name, when] : t.first_catch)
    if (!t.caught.count(name) && stats_of(t, name).cases == 0) ++not_run;
  fmt::print("\nmutation score: {}/{} caught{}\n", t.caught.size(), t.first_catch.size(),
             not_run ? fmt::format(" ({} never ran: every case unsupported or unavailable here)", not_run) : "");
  fmt::print("{:<32} {:>9} {:>16}  {}\n", "mutant", "cases", "first catch", "caught by");
  for (const auto& [name, when] : t.first_catch) {
    const SubjectStats& s = stats_of(t, name);
    const std::string at = when ? fmt::format("{:.1f} s", *when)
                           : t.caught.count(name) ? "before resume"
                           : s.cases == 0      ? "never ran"
                                               : "SURVIVED";
    std::string by;
    for (const auto& [check, count] : s.failures) by += fmt::format("{}{}", by.empty() ? "" : " ", check);
    fmt::print("{:<32} {:>9} {:>16}  {}\n", name, s.cases, at, by);
  }
  log << fmt::format("mutation score: {}/{} caught\n", t.caught.size(), t.first_catch.size());
  // With mutants, the sweep passes when every mutant was caught and no subject
  // under test failed.
  std::int64_t subject_failures = 0;
  for (const auto& [name, s] : t.stats)
    if (!t.first_catch.count(name)) subject_failures += s.cases - s.passed - s.vacuous - s.deviations;
  return subject_failures > 0 || t.caught.size() < t.first_catch.size() ? 1 : 0;
}

}  // namespace flashcheck::fuzz::detail
