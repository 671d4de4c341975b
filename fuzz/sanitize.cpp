// The sweep's sanitizer mode (`flashcheck fuzz --sanitize TOOL`): a few small
// cases per subject, each in a fresh worker under NVIDIA's compute-sanitizer.
// A finding (the tool's --error-exitcode) becomes a failed record carrying the
// tool's first report lines; the records, the corpus and resume are the
// sweep's own.
#include <signal.h>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <vector>

#include "flashcheck/core/record.hpp"
#include "flashcheck/fuzz/fuzz.hpp"
#include "flashcheck/fuzz/sweep_parts.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/core/process.hpp"

namespace flashcheck::fuzz::detail {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kFindingExit = 86;  // compute-sanitizer's --error-exitcode: a finding

/// compute-sanitizer: $FLASHCHECK_COMPUTE_SANITIZER, else on PATH, else in
/// $CUDA_HOME/bin or /usr/local/cuda/bin.
std::string find_sanitizer() {
  if (const char* given = std::getenv("FLASHCHECK_COMPUTE_SANITIZER"); given && *given) {
    if (::access(given, X_OK) != 0)
      throw std::invalid_argument(fmt::format("fuzz --sanitize: FLASHCHECK_COMPUTE_SANITIZER={} is not executable", given));
    return given;
  }
  std::vector<fs::path> places;
  if (const char* path = std::getenv("PATH"))
    for (std::string_view rest = path; !rest.empty();) {
      const std::size_t colon = rest.find(':');
      places.emplace_back(rest.substr(0, colon));
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    }
  if (const char* cuda = std::getenv("CUDA_HOME")) places.push_back(fs::path(cuda) / "bin");
  places.emplace_back("/usr/local/cuda/bin");
  for (const fs::path& place : places)
    if (const fs::path candidate = place / "compute-sanitizer"; ::access(candidate.c_str(), X_OK) == 0)
      return candidate.string();
  throw std::invalid_argument(
      "fuzz --sanitize: compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin; or set "
      "FLASHCHECK_COMPUTE_SANITIZER)");
}

/// Runs argv with `input` on its stdin (then closed) and collects its stdout,
/// killing it after `seconds`. A process group of its own: a timeout kills the
/// tool and the worker it started, and whatever that left behind.
Finished run_once(const std::vector<std::string>& argv, const std::string& input, double seconds) {
  ProcessOptions options;
  options.argv = argv;
  options.out = Redirect::pipe();
  options.reap_descendants = true;
  try {
    return run_process(options, input, seconds);
  } catch (const ProcessError& error) {
    throw std::runtime_error(fmt::format("fuzz --sanitize: {}", error.what()));
  }
}

/// The tool's report without its banner and summary: the first `most` lines.
std::vector<std::string> report_lines(const fs::path& log, std::size_t most) {
  std::vector<std::string> lines;
  std::ifstream in(log);
  std::string line;
  while (lines.size() < most && std::getline(in, line)) {
    std::string_view text = line;
    if (text.rfind("=========", 0) == 0) text.remove_prefix(9);
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    if (text.empty() || text.rfind("COMPUTE-SANITIZER", 0) == 0) continue;
    lines.emplace_back(text);
  }
  return lines;
}

}  // namespace

int run_sanitize(const FuzzOptions& options) {
  static const std::vector<std::string> kTools = {"memcheck", "racecheck", "initcheck", "synccheck"};
  if (std::find(kTools.begin(), kTools.end(), options.sanitize) == kTools.end())
    throw std::invalid_argument(
        fmt::format("fuzz --sanitize {}: expected memcheck, racecheck, initcheck or synccheck", options.sanitize));
  if (options.sanitize_cases < 1) throw std::invalid_argument("fuzz --sanitize-cases: need at least 1");
  const std::string sanitizer = find_sanitizer();

  const fs::path out(options.out), records = out / "records.jsonl", corpus = out / "corpus",
                 logs = out / "sanitize";
  fs::create_directories(corpus);
  fs::create_directories(logs);
  const Recorded recorded = read_records(records);
  ::signal(SIGPIPE, SIG_IGN);

  struct Tally {
    int cases = 0, findings = 0, other_failures = 0, unsupported = 0, unavailable = 0;
    std::string first;
  };
  std::map<std::string, Tally> tally;
  int findings = 0, failures = 0;
  // Failures an earlier run of this tool and seed recorded still count: a
  // resumed run must not turn a finding into a pass.
  const std::string prefix = fmt::format("sanitize:{}:{}:", options.sanitize, options.seed);
  int recorded_failures = 0;
  for (const std::string& key : recorded.failed_cases)
    if (key.rfind(prefix, 0) == 0) ++recorded_failures;
  const auto started = Clock::now();
  for (Subject* subject : options.subjects) {
    const std::string name(subject->name());
    for (int i = 0; i < options.sanitize_cases; ++i) {
      const std::string key = fmt::format("sanitize:{}:{}:{}:{}", options.sanitize, options.seed, name, i);
      if (recorded.cases.count(key)) continue;
      // Small cases (RapidCheck sizes 10 to 30): the tools slow kernels 10-100x.
      const Problem problem = draw_problem(*subject, options.seed, i, 10 + i * 10 % 21, options.backward_share).value();
      const fs::path log = logs / fmt::format("{}.{}.{}.log", name, options.sanitize, i);
      const std::vector<std::string> argv = {
          sanitizer, "--tool", options.sanitize, "--error-exitcode", std::to_string(kFindingExit), "--print-limit", "20",
          "--log-file", log.string(), options.worker_exe, "fuzz-worker"};
      fmt::print(stderr, "fuzz --sanitize {}: {} case {} of {}: {}\n", options.sanitize, name, i + 1,
                 options.sanitize_cases, to_line(problem));
      const double watchdog = 10 * watchdog_for(problem, options.watchdog_seconds);
      const Finished run = run_once(argv, request(key, *subject, problem) + "\n", watchdog);

      CaseRecord record;
      try {
        Record read = parse_record(std::string_view(run.out).substr(0, run.out.find('\n')));
        if (auto* case_record = std::get_if<CaseRecord>(&read)) record = std::move(*case_record);
        else throw RecordError("not a case");
      } catch (const RecordError&) {  // no record: the worker died before writing one
        record = CaseRecord{};
        record.verdict = CaseVerdict::crash;
        record.check = "crash";
      }
      const bool exited = !run.timed_out && run.status.exited();
      const int code = exited ? run.status.code() : -1;
      const std::vector<std::string> report = report_lines(log, 8);
      record.case_key = key;
      record.subject = name;
      record.problem = to_line(problem);
      record.sanitizer = SanitizerRun{options.sanitize, code, log.string(), report};
      record.reproducer = fmt::format("compute-sanitizer --tool {} {}", options.sanitize, replay_command(name, problem));
      Tally& t = tally[name];
      if (code == kFindingExit) {
        record.verdict = CaseVerdict::fail;
        record.check = "sanitizer:" + options.sanitize;
        record.message = report.empty() ? "compute-sanitizer reported an error" : report.front();
      } else if (run.timed_out) {
        record.verdict = CaseVerdict::timeout;
        record.check = "timeout";
        record.message = fmt::format("no answer within the {:.0f} s watchdog under {}", watchdog, options.sanitize);
      } else if (!exited || code != 0) {
        // The tool itself failed (or the worker crashed): the case was not checked.
        const bool crashed = !exited || record.verdict == CaseVerdict::crash;
        record.verdict = crashed ? CaseVerdict::crash : CaseVerdict::error;
        record.check = crashed ? "crash" : "sanitizer_error";
        record.message = exited ? fmt::format("compute-sanitizer exited with status {}{}", code,
                                              report.empty() ? "" : ": " + report.front())
                                : fmt::format("killed by signal {}", run.status.signal());
      }
      // A finding on a case whose judge record was lost (the worker died under
      // the tool): a failure with no metrics to show, which is an error, not a fail.
      if (record.verdict == CaseVerdict::fail && !record.judged) record.verdict = CaseVerdict::error;
      record.sweep = SweepOrigin{options.seed, std::nullopt, std::nullopt, options.sanitize};
      append_durably(records, dump_record(record));

      if (record.verdict == CaseVerdict::unsupported) {
        ++t.unsupported;
        continue;
      }
      if (record.verdict == CaseVerdict::unavailable) {  // nothing ran under the tool: not a clean case
        ++t.unavailable;
        if (options.require_gpu) ++failures;
        continue;
      }
      ++t.cases;
      if (!record.failed()) continue;
      if (code == kFindingExit) {
        ++t.findings;
        ++findings;
        if (t.first.empty()) t.first = record.message;
      } else {
        ++t.other_failures;
      }
      ++failures;
      append_durably(corpus / (name + ".problems"),
                     fmt::format("# {}: {} ({})\n{}", key, record.check.empty() ? "fail" : record.check,
                                 record.message, to_line(problem)));
    }
  }
  fmt::print("\nsanitize summary: {} under compute-sanitizer ({}), {} finding(s), {} other failure(s) in {:.1f} min; "
             "{} failed case(s) recorded before (resumed); records in {}\n",
             options.sanitize, sanitizer, findings, failures - findings,
             std::chrono::duration<double>(Clock::now() - started).count() / 60, recorded_failures, records.string());
  fmt::print("{:<32} {:>6} {:>9} {:>7} {:>12} {:>12}  first finding\n", "subject", "cases", "findings", "other",
             "unsupported", "unavailable");
  for (const auto& [name, t] : tally)
    fmt::print("{:<32} {:>6} {:>9} {:>7} {:>12} {:>12}  {}\n", name, t.cases, t.findings, t.other_failures,
               t.unsupported, t.unavailable, t.first);
  return failures + recorded_failures > 0 ? 1 : 0;
}

}  // namespace flashcheck::fuzz::detail
