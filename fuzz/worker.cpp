// The worker side of a sweep (`flashcheck fuzz-worker`): one case per stdin
// line, one record per stdout line. Nothing else is written to stdout.
#include <fmt/core.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "core/record.hpp"
#include "fuzz/fuzz.hpp"
#include "oracles/judge.hpp"

namespace flashcheck::fuzz {

namespace {

/// The check that failed, for the summary's "failures by check".
std::string failed_check(const CaseResult& r) {
  if (!r.ran()) return std::string(to_string(r.status));
  if (r.verdict.pass) return {};
  if (!r.verdict.census_pass) return "nan_inf_census";
  for (const RuleCheck& check : r.verdict.checks)
    if (!check.pass) return check.metric;
  return "rule";
}

}  // namespace

int run_worker() {
  std::string line;
  while (std::getline(std::cin, line)) {
    const std::size_t tab1 = line.find('\t'), tab2 = line.find('\t', tab1 + 1);
    nlohmann::json record;
    if (tab1 == std::string::npos || tab2 == std::string::npos) {
      record = {{"verdict", "error"}, {"message", "fuzz-worker: malformed case line"}};
    } else {
      const std::string key = line.substr(0, tab1), name = line.substr(tab1 + 1, tab2 - tab1 - 1);
      try {
        Subject* subject = Registry::instance().find(name);
        if (!subject) throw std::invalid_argument(fmt::format("unknown subject '{}'", name));
        const CaseResult result = judge(*subject, parse_problem(line.substr(tab2 + 1)), JudgeOptions{});
        record = to_record(result);
        record["check"] = failed_check(result);
        record["worst_ratio"] = result.ran() ? result.verdict.worst_ratio : 0.0;
      } catch (const std::exception& error) {
        record = {{"subject", name}, {"problem", line.substr(tab2 + 1)}, {"verdict", "error"}, {"check", "error"},
                  {"message", error.what()}};
      }
      record["case"] = key;
    }
    std::cout << record.dump() << '\n' << std::flush;
    // A sticky CUDA error leaves this process's context unusable: exit after
    // reporting it, so that the driver starts a fresh worker.
    if (record.value("status", "") == "fault") return 0;
  }
  return 0;
}

}  // namespace flashcheck::fuzz
