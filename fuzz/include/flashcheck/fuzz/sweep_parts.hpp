// The pieces of a sweep that the sanitizer mode shares with the main loop.
#pragma once

#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/fuzz/fuzz.hpp"

namespace flashcheck::fuzz::detail {

/// What an earlier run left in records.jsonl: the case keys, the failed ones,
/// and the subjects with a failure among them. A torn last line (a killed driver) is cut off so
/// that the file stays JSON Lines.
struct Recorded {
  std::set<std::string> cases;
  std::set<std::string> failed_subjects;
  std::set<std::string> failed_cases;
};
Recorded read_records(const std::filesystem::path& path);

/// Appends one line and forces it to the disk before the case counts as done.
void append_durably(const std::filesystem::path& path, const std::string& line);

/// Case k of the stream for `seed`, drawn from the subject's generator at
/// RapidCheck size `size` (0 to 100; negative: a size that cycles with k).
rc::Shrinkable<Problem> draw_problem(const Subject& subject, std::uint64_t seed, std::int64_t k, int size = -1,
                                     double backward_share = 1.0 / 3);

/// A 64-bit mix of (seed, k) (splitmix64's finaliser): spreads subjects over cases.
std::uint64_t mix(std::uint64_t seed, std::int64_t k);

/// The worker's request line for one case.
std::string request(const std::string& key, const Subject& subject, const Problem& problem);

/// A record's number at `key`, 0 where it is missing or null (NaN and
/// infinities are written as null: JSON has no such numbers).
double number(const nlohmann::json& record, const char* key);

/// The per-case watchdog: `fixed` when set, else generous for the CPU
/// oracle's cost at this size.
double watchdog_for(const Problem& p, double fixed);

/// The sanitizer mode: see FuzzOptions::sanitize.
int run_sanitize(const FuzzOptions& options);

}  // namespace flashcheck::fuzz::detail
