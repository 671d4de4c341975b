// Shrinking a failing case of a sweep, through its generator's shrinks, in
// the worker that found it.
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "flashcheck/core/record.hpp"
#include "flashcheck/fuzz/sweep_parts.hpp"
#include "worker_pool.hpp"

namespace flashcheck::fuzz::detail {

/// Shrinks a failing case through its generator's shrinks (smaller batch,
/// heads, lengths and head dim, simpler values, all inside the domain) while
/// it still fails the same check; at most `max_runs` runs. Returns the
/// smallest failing problem, or nothing when no shrink still failed.
std::optional<Problem> shrink(Worker& worker, const Subject& subject, rc::Shrinkable<Problem> failing,
                              const std::string& check, double watchdog, int max_runs) {
  std::optional<Problem> smallest;
  int runs = 0;
  for (bool smaller = true; smaller && runs < max_runs;) {
    smaller = false;
    auto candidates = failing.shrinks();
    while (auto candidate = candidates.next()) {
      if (++runs > max_runs) break;
      Problem problem;
      try {
        problem = candidate->value();
      } catch (const rc::detail::CaseResult&) {  // the generator discarded this shrink
        continue;
      } catch (const rc::GenerationFailure&) {
        continue;
      }
      const CaseRecord record =
          record_of(worker.run(request("shrink", subject, problem), watchdog), "shrink", subject, problem);
      if (record.failed() && record.check == check) {
        failing = *candidate;
        smallest = problem;
        smaller = true;
        break;
      }
    }
  }
  return smallest;
}

}  // namespace flashcheck::fuzz::detail
