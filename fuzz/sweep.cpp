// The driver of a sweep: the main loop over the case stream (case_stream.cpp)
// and the worker processes (worker_pool.hpp), the records (records.cpp),
// shrinking (shrink.cpp), the corpus and progress; the summary (summary.cpp).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include <algorithm>
#include <thread>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/record.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/fuzz/fuzz.hpp"
#include "flashcheck/fuzz/sweep_parts.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/generators/generators.hpp"
#include "flashcheck/core/process.hpp"
#include "summary.hpp"
#include "worker_pool.hpp"

namespace flashcheck::fuzz {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;


namespace {

using namespace detail;


}  // namespace

int run_sweep(const FuzzOptions& options) {
  if (options.out.empty()) throw std::invalid_argument("fuzz: --out DIR is required (records, corpus and log go there)");
  const std::vector<Subject*>& subjects = options.subjects;
  if (subjects.empty()) throw std::invalid_argument("fuzz: no subject to sweep");
  if (!options.sanitize.empty()) return run_sanitize(options);
  if (options.cases <= 0 && options.minutes <= 0) throw std::invalid_argument("fuzz: give --cases N or --minutes M");

  const fs::path out(options.out), records = out / "records.jsonl", corpus = out / "corpus", log = out / "fuzz.log";
  fs::create_directories(corpus);
  const Recorded recorded = read_records(records);
  std::set<std::string> done = recorded.cases;
  const std::size_t resumed = done.size();

  // The time budget is the sweep's, not the run's: a resumed run (the same
  // seed, shard and --minutes) spends what the killed one left.
  const fs::path budget_path = out / "budget.json";
  const nlohmann::json budget_key = {{"seed", options.seed}, {"shard", fmt::format("{}/{}", options.shard, options.shards)},
                                     {"minutes", options.minutes}};
  double spent_before = 0;
  if (options.minutes > 0 && fs::exists(budget_path)) {
    std::ifstream in(budget_path);
    const auto saved = nlohmann::json::parse(in, nullptr, false);
    if (!saved.is_discarded() && saved.value("sweep", nlohmann::json()) == budget_key)
      spent_before = number(saved, "spent_seconds");
  }
  const auto save_budget = [&](double spent_now) {
    if (options.minutes <= 0) return;
    const fs::path temp = out / "budget.json.tmp";
    std::ofstream(temp) << nlohmann::json{{"sweep", budget_key}, {"spent_seconds", spent_before + spent_now}}.dump()
                        << '\n';
    fs::rename(temp, budget_path);  // atomic: a kill leaves the old or the new file
  };

  // Mutants in the sweep: the score is how many are caught. A caught mutant
  // gets no more cases (one catch is all it needs), and a sweep of mutants
  // alone ends when every one is caught.
  std::map<std::string, std::optional<double>> first_catch;  // mutant -> seconds into this run
  std::set<std::string> caught;
  for (Subject* mutant : Registry::instance().mutants())
    if (std::find(subjects.begin(), subjects.end(), mutant) != subjects.end()) {
      first_catch[std::string(mutant->name())] = std::nullopt;
      if (recorded.failed_subjects.count(std::string(mutant->name()))) caught.insert(std::string(mutant->name()));
    }
  const bool only_mutants = first_catch.size() == subjects.size();

  std::map<std::string, SubjectStats> stats;
  double subject_ms = 0, oracle_ms = 0, inputs_ms = 0;
  std::int64_t ran = 0, failures = 0;
  const auto started = Clock::now();
  const auto deadline =
      started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                    options.minutes > 0 ? std::max(0.0, options.minutes * 60 - spent_before) : 1e9));
  const bool tty = ::isatty(STDERR_FILENO);
  auto last_progress = Clock::now() - std::chrono::hours(1);
  std::ofstream log_file(log, std::ios::app);
  const std::string opening = fmt::format(
      "fuzz: seed {} shard {}/{}, {} subject(s); {} case(s) recorded before{}", options.seed, options.shard,
      options.shards, subjects.size(), resumed,
      spent_before > 0 ? fmt::format(", {:.1f} of {} min already spent (resumed)", spent_before / 60, options.minutes)
                       : std::string());
  log_file << opening << '\n';
  fmt::print(stderr, "{}\n", opening);

  // A worker that exits between cases (after a sticky fault) must not take
  // the driver with it: writing to its pipe then fails with EPIPE instead.
  ::signal(SIGPIPE, SIG_IGN);
  // One worker per GPU (--gpus), or one.
  std::vector<std::unique_ptr<Worker>> workers;
  const std::vector<int> devices = options.gpus.empty() ? std::vector<int>{-1} : options.gpus;
  const int threads = std::max<int>(1, static_cast<int>(std::thread::hardware_concurrency() / devices.size()));
  for (int gpu : devices)
    workers.push_back(std::make_unique<Worker>(options.worker_exe, gpu, threads, options.every_row));

  struct Case {
    std::string key;
    Subject* subject;
    std::optional<rc::Shrinkable<Problem>> drawn;  // empty for a corpus entry
    Problem problem;
    Clock::time_point started;
    double watchdog = 0;  // seconds
  };
  // Records a finished case: the record (shrinking a new failure first, on the
  // worker that found it), the stats, and the corpus.
  const auto finish = [&](Worker& worker, const Case& c, const Worker::Reply& reply) {
    Subject& subject = *c.subject;
    CaseRecord record = record_of(reply, c.key, subject, c.problem);
    // A sticky device fault ends the worker's usefulness (it exits after its
    // record): the next case, and any shrinking, get a fresh process.
    if (record.status == Status::fault) worker.stop();
    record.sweep = SweepOrigin{options.seed, options.shard, options.shards, {}};
    SubjectStats& s = stats[std::string(subject.name())];
    const bool is_failure = record.failed();
    std::optional<Problem> shrunk;
    // A hang is not shrunk: each try would cost a whole watchdog (up to
    // --shrink-runs of them), and its line already reproduces it.
    if (is_failure && c.drawn && record.verdict != CaseVerdict::timeout) {
      shrunk = shrink(worker, subject, *c.drawn, record.check, c.watchdog, options.shrink_runs);
      if (shrunk) record.shrunk_problem = to_line(*shrunk);
    }
    append_durably(records, dump_record(record));
    done.insert(c.key);

    s.seconds += std::chrono::duration<double>(Clock::now() - c.started).count();
    if (record.verdict == CaseVerdict::unsupported) {
      ++s.unsupported;
      return;
    }
    if (record.verdict == CaseVerdict::unavailable) {  // the machine cannot run it: neither pass nor fail
      if (s.unavailable++ == 0) s.unavailable_because = record.message;
      return;
    }
    ++s.cases;
    ++ran;
    if (record.timing) {
      subject_ms += record.timing->subject_ms;
      inputs_ms += record.timing->inputs_ms;
      oracle_ms += record.timing->oracle_ms + record.timing->baseline_ms;
    }
    if (record.worst_ratio && std::isfinite(*record.worst_ratio)) s.worst_ratio = std::max(s.worst_ratio, *record.worst_ratio);
    if (!is_failure) {
      ++(record.verdict == CaseVerdict::vacuous     ? s.vacuous
         : record.verdict == CaseVerdict::deviation ? s.deviations
                                                    : s.passed);
      return;
    }
    ++failures;
    const std::string check = record.check.empty() ? "fail" : record.check;
    ++s.failures[check];
    if (auto mutant = first_catch.find(std::string(subject.name())); mutant != first_catch.end()) {
      if (!mutant->second) mutant->second = std::chrono::duration<double>(Clock::now() - started).count();
      caught.insert(mutant->first);
    }
    if (!c.drawn) return;  // a corpus entry: already stored
    const std::string why = !record.message.empty() ? record.message : record.judged ? record.judged->rule : "";
    std::string entry = fmt::format("# case {}: {} ({})\n{}", c.key, check, why, to_line(c.problem));
    if (shrunk) entry += fmt::format("\n# case {} shrunk (the same check fails)\n{}", c.key, to_line(*shrunk));
    append_durably(corpus / (std::string(subject.name()) + ".problems"), entry);
  };
  const auto progress = [&](std::string_view current, bool force) {
    const auto now = Clock::now();
    if (!force && now - last_progress < std::chrono::seconds(tty ? 1 : 10)) return;
    last_progress = now;
    save_budget(std::chrono::duration<double>(now - started).count());
    const double minutes = std::chrono::duration<double>(now - started).count() / 60;
    const double left = options.minutes > 0 ? std::max(0.0, options.minutes - spent_before / 60 - minutes) : 0;
    const std::string text =
        fmt::format("fuzz: {} case(s), {} failure(s), {:.0f} cases/min, {} left, now {}", ran, failures,
                    minutes > 0 ? ran / minutes : 0.0,
                    options.minutes > 0 ? fmt::format("{:.1f} min", left)
                                        : fmt::format("{} case(s)", std::max<std::int64_t>(0, options.cases - ran)),
                    current);
    log_file << text << '\n' << std::flush;
    if (tty) fmt::print(stderr, "\r{:<110}", text);
    else fmt::print(stderr, "{}\n", text);
  };

  // The corpus first: every failure an earlier sweep stored, replayed (read
  // whole before any case runs, since failures append to it).
  std::vector<std::tuple<std::string, Subject*, std::string>> stored;
  for (const auto& entry : fs::directory_iterator(corpus)) {
    if (entry.path().extension() != ".problems") continue;
    Subject* subject = Registry::instance().find(entry.path().stem().string());
    if (!subject) continue;
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      if (!line.empty() && line[0] != '#')
        stored.emplace_back(fmt::format("corpus:{}:{}:{}", entry.path().filename().string(), n, options.seed), subject,
                            line);
  }
  std::size_t next_stored = 0;
  std::int64_t k = options.shard, taken = 0;
  // The next case to run, or nothing when the corpus and the budget are spent.
  const auto next_case = [&]() -> std::optional<Case> {
    while (next_stored < stored.size()) {
      const auto& [key, subject, line] = stored[next_stored++];
      if (done.count(key)) continue;
      Problem problem = parse_problem(line);
      const double watchdog = watchdog_for(problem, options.watchdog_seconds) + subject->startup_seconds();
      return Case{key, subject, std::nullopt, std::move(problem), Clock::now(), watchdog};
    }
    while (!(options.cases > 0 && taken >= options.cases) && Clock::now() < deadline) {
      const std::int64_t index = k;
      k += options.shards;
      ++taken;
      const std::string key = fmt::format("{}:{}", options.seed, index);
      if (done.count(key)) continue;
      // The subject of case k depends on k alone (not on the shard count), so
      // shards are disjoint slices of one stream and merge by concatenation.
      Subject* subject = subjects[static_cast<std::size_t>(mix(options.seed, index) % subjects.size())];
      if (caught.count(std::string(subject->name()))) {
        if (only_mutants && caught.size() == first_catch.size()) break;  // every mutant caught
        continue;
      }
      rc::Shrinkable<Problem> drawn = draw_problem(*subject, options.seed, index, -1, options.backward_share);
      Problem problem = drawn.value();
      // An external worker's start-up and its own watchdog come on top, so
      // that its hang is recorded as its own failure, not as the sweep's.
      const double watchdog = watchdog_for(problem, options.watchdog_seconds) + subject->startup_seconds();
      return Case{key, subject, std::move(drawn), std::move(problem), Clock::now(), watchdog};
    }
    return std::nullopt;
  };

  std::vector<std::optional<Case>> running(workers.size());
  bool exhausted = false;
  while (true) {
    for (std::size_t w = 0; w < workers.size() && !exhausted; ++w) {
      if (running[w]) continue;
      running[w] = next_case();
      if (!running[w]) {
        exhausted = true;
        break;
      }
      workers[w]->submit(request(running[w]->key, *running[w]->subject, running[w]->problem),
                         running[w]->watchdog);
    }
    std::vector<pollfd> fds;
    for (std::size_t w = 0; w < workers.size(); ++w)
      if (running[w]) fds.push_back({workers[w]->fd(), POLLIN, 0});
    if (fds.empty()) break;
    ::poll(fds.data(), fds.size(), 200);
    for (std::size_t w = 0; w < workers.size(); ++w) {
      if (!running[w]) continue;
      if (auto reply = workers[w]->collect()) {
        const Case c = std::move(*running[w]);
        running[w].reset();
        finish(*workers[w], c, *reply);
        progress(c.subject->name(), false);
      }
    }
  }
  for (auto& worker : workers) worker->stop();
  progress("done", true);
  if (tty) fmt::print(stderr, "\n");

  const double wall_ms = 1e3 * std::chrono::duration<double>(Clock::now() - started).count();
  save_budget(wall_ms / 1e3);
  return summarise(options,
                   SweepTotals{ran, failures, static_cast<std::int64_t>(resumed), wall_ms, workers.size(), records,
                               subject_ms, oracle_ms, inputs_ms, std::move(stats), std::move(first_catch),
                               std::move(caught)},
                   log_file);
}

}  // namespace flashcheck::fuzz
