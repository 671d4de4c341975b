// The driver of a sweep: the case stream, the worker processes, the records,
// the corpus, progress and the summary.
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

namespace flashcheck::fuzz {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

void parse_shard(const std::string& text, int& shard, int& shards) {
  const std::size_t slash = text.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("");
    std::size_t used = 0;
    shard = std::stoi(text.substr(0, slash), &used);
    if (used != slash) throw std::invalid_argument("");
    shards = std::stoi(text.substr(slash + 1), &used);
    if (used != text.size() - slash - 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw std::invalid_argument(fmt::format("--shard '{}': expected i/n, e.g. 0/4", text));
  }
  if (shards < 1 || shard < 0 || shard >= shards)
    throw std::invalid_argument(fmt::format("--shard '{}': need 0 <= i < n", text));
}

namespace detail {

double number(const nlohmann::json& record, const char* key) {
  const auto found = record.find(key);
  return found != record.end() && found->is_number() ? found->get<double>() : 0.0;
}

Recorded read_records(const fs::path& path) {
  Recorded done;
  if (!fs::exists(path)) return done;
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t good = 0, start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    if (end == std::string::npos) break;  // torn: no newline
    const std::string_view line(text.data() + start, end - start);
    if (nlohmann::json::parse(line.begin(), line.end(), nullptr, false).is_discarded()) break;  // torn
    Record read;
    try {
      read = parse_record(line);
    } catch (const RecordError& error) {  // whole, but not a record this build reads: never cut off
      throw std::invalid_argument(fmt::format(
          "fuzz: {} line {}: {} (a sweep of another flashcheck version? give a new --out)", path.string(),
          std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(start), '\n') + 1, error.what()));
    }
    if (const auto* record = std::get_if<CaseRecord>(&read)) {
      if (!record->case_key.empty()) done.cases.insert(record->case_key);
      if (record->failed() && !record->subject.empty()) done.failed_subjects.insert(record->subject);
      if (record->failed() && !record->case_key.empty()) done.failed_cases.insert(record->case_key);
    }
    good = end + 1;
    start = end + 1;
  }
  if (good < text.size()) fs::resize_file(path, good);
  return done;
}

void append_durably(const fs::path& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("fuzz: cannot open {}: {}", path.string(), std::strerror(errno)));
  const std::string text = line + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error(fmt::format("fuzz: cannot write {}: {}", path.string(), std::strerror(errno)));
}

// Case k has its own RapidCheck random state, so any case can be drawn without
// the ones before it (shards, resume). A draw the generator discards (an
// RC_PRE inside it) is redrawn with the next salt.
rc::Shrinkable<Problem> draw_problem(const Subject& subject, std::uint64_t seed, std::int64_t k, int size) {
  const rc::Gen<Problem> gen = gen_problem_in(subject.capabilities(), {.long_contexts = true, .use_geometry_pool = false});
  if (size < 0) size = static_cast<int>(k * 37 % 101);  // RapidCheck's size: 0 (small) to 100
  for (std::uint64_t salt = 0; salt < 1000; ++salt) {
    const rc::Random random(rc::Random::Key{seed, static_cast<std::uint64_t>(k), 0x666c617368636865ull, salt});
    try {
      rc::Shrinkable<Problem> drawn = gen(random, size);
      drawn.value();  // a discard throws here
      return drawn;
    } catch (const rc::detail::CaseResult&) {  // discarded
    } catch (const rc::GenerationFailure&) {
    }
  }
  throw std::runtime_error(fmt::format("fuzz: {}'s generator discarded 1000 draws for case {}", subject.name(), k));
}

double watchdog_for(const Problem& p, double fixed) {
  if (fixed > 0) return fixed;
  const double work = static_cast<double>(p.batch * p.heads_q) * static_cast<double>(p.seqlen_q) *
                      static_cast<double>(p.seqlen_kv) * static_cast<double>(p.head_dim + p.head_dim_v);
  return 60.0 + work / 1e7;
}

std::string request(const std::string& key, const Subject& subject, const Problem& problem) {
  return fmt::format("{}\t{}\t{}", key, subject.name(), to_line(problem));
}

}  // namespace detail

namespace {

using namespace detail;

/// One worker process, fed through pipes, one case at a time. `gpu` >= 0
/// pins it to that device (CUDA_VISIBLE_DEVICES), for one worker per GPU.
/// `threads` is its share of the host's cores: its OpenMP thread count, unless
/// OMP_NUM_THREADS says otherwise (so that N workers never spin N x cores threads).
/// Each process gets a temporary folder of its own (its TMPDIR), removed when
/// it ends however it ends: a worker killed by the watchdog or a crash cannot
/// clean up what it made there (an external subject's exchange folder, say).
class Worker {
 public:
  Worker(std::string exe, int gpu, int threads, EveryRow every_row)
      : exe_(std::move(exe)), gpu_(gpu), threads_(threads), every_row_(std::string(to_string(every_row))) {}
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() {
    stop();
    remove_scratch();
  }

  enum class Outcome { record, died, timed_out };
  struct Reply {
    Outcome outcome;
    std::string line;  // the record, for Outcome::record
    std::string how;   // how it died or timed out
  };

  /// Starts one case (the worker must be idle), with `seconds` to answer.
  void submit(const std::string& request, double seconds) {
    if (process_ && process_->try_wait()) process_.reset();  // it exited between cases
    if (!process_) start();
    busy_ = true;
    watchdog_ = seconds;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    if (!process_->write_all(request + "\n", seconds)) broken_ = true;
  }

  /// The case's reply once there is one: call when fd() is readable, or to
  /// check the watchdog.
  std::optional<Reply> collect() {
    if (!busy_) return std::nullopt;
    while (!broken_) {
      const Process::Read read = process_->fill(0);
      if (read == Process::Read::eof) broken_ = true;
      if (read != Process::Read::data) break;
    }
    if (auto line = process_->take_line()) {
      busy_ = false;
      return Reply{Outcome::record, std::move(*line), {}};
    }
    if (broken_) return died();
    if (Clock::now() >= deadline_) {
      stop();
      return Reply{Outcome::timed_out, {}, fmt::format("no answer within the {:.0f} s watchdog", watchdog_)};
    }
    return std::nullopt;
  }

  /// One case, waiting for its reply (shrinking uses this).
  Reply run(const std::string& request, double seconds) {
    submit(request, seconds);
    while (true) {
      pollfd fd{this->fd(), POLLIN, 0};
      ::poll(&fd, 1, 200);
      if (auto reply = collect()) return *reply;
    }
  }

  bool busy() const { return busy_; }
  int fd() const { return process_ ? process_->stdout_fd() : -1; }
  Clock::time_point deadline() const { return deadline_; }

  /// Kills the worker (with its group and whatever it left behind) and removes its folder.
  void stop() {
    busy_ = false;
    if (!process_) return;
    process_.reset();
    remove_scratch();
  }

 private:
  void remove_scratch() {
    if (scratch_.empty()) return;
    std::error_code ignored;
    fs::remove_all(scratch_, ignored);
    scratch_.clear();
  }

  void start() {
    remove_scratch();
    std::string pattern = (fs::temp_directory_path() / "flashcheck-worker-XXXXXX").string();
    if (!::mkdtemp(pattern.data()))
      throw std::runtime_error(fmt::format("fuzz: cannot make a folder like {}: {}", pattern, std::strerror(errno)));
    scratch_ = pattern;
    ProcessOptions options;
    options.argv = {exe_, "fuzz-worker", "--every-row", every_row_};
    options.in = Redirect::pipe();
    options.out = Redirect::pipe();
    if (gpu_ >= 0) options.env.emplace_back("CUDA_VISIBLE_DEVICES", std::to_string(gpu_));
    options.env.emplace_back("TMPDIR", scratch_.string());
    options.env_defaults = {{"OMP_NUM_THREADS", std::to_string(threads_)}, {"OMP_WAIT_POLICY", "passive"}};
    // Its own group, dying with the sweep; whatever it starts (an external
    // worker's descendants) ends with it.
    options.reap_descendants = true;
    try {
      process_.emplace(options);
    } catch (const ProcessError& error) {
      throw std::runtime_error(fmt::format("fuzz: cannot start a worker: {}", error.what()));
    }
    broken_ = false;
  }

  Reply died() {
    // It closed its output: it is ending (a crash) or has ended.
    process_->close_stdin();
    process_->wait_for(10);
    const ExitStatus status = process_->kill();
    process_.reset();
    busy_ = false;
    remove_scratch();
    return {Outcome::died, {}, "worker " + status.describe()};
  }

  std::string exe_;
  int gpu_;
  int threads_;
  std::optional<Process> process_;
  bool busy_ = false, broken_ = false;
  double watchdog_ = 0;
  std::string every_row_;  // the workers' --every-row (to_string(EveryRow))
  Clock::time_point deadline_;
  fs::path scratch_;  // the running process's TMPDIR
};

/// A 64-bit mix of (seed, k) (splitmix64's finaliser): spreads subjects over cases.
std::uint64_t mix(std::uint64_t seed, std::int64_t k) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(k) + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// A case's record from its worker's reply (a crash or timeout record when it
/// gave none). The worker's judge record names the case already; what a
/// crash, a timeout or a worker error leaves out is filled in here.
CaseRecord record_of(const Worker::Reply& reply, const std::string& key, const Subject& subject,
                     const Problem& problem) {
  CaseRecord record;
  if (reply.outcome == Worker::Outcome::record) {
    std::string why;
    try {
      Record read = parse_record(reply.line);
      if (auto* case_record = std::get_if<CaseRecord>(&read)) record = std::move(*case_record);
      else why = "the worker wrote a record that is not a case";
    } catch (const RecordError& error) {
      why = fmt::format("the worker wrote a line that is not a record ({})", error.what());
    }
    if (!why.empty()) {
      record = CaseRecord{};
      record.verdict = CaseVerdict::error;
      record.check = "error";
      record.message = why;
    }
  } else {
    const bool timed_out = reply.outcome == Worker::Outcome::timed_out;
    record.verdict = timed_out ? CaseVerdict::timeout : CaseVerdict::crash;
    record.check = timed_out ? "timeout" : "crash";
    record.message = reply.how;
  }
  record.case_key = key;
  if (record.subject.empty()) record.subject = subject.name();
  if (record.problem.empty()) record.problem = to_line(problem);
  if (record.reproducer.empty()) record.reproducer = replay_command(subject.name(), problem);
  return record;
}

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

struct SubjectStats {
  std::int64_t cases = 0, passed = 0, unsupported = 0, unavailable = 0, vacuous = 0, deviations = 0;
  std::string unavailable_because;  // the first unavailable case's message
  std::map<std::string, std::int64_t> failures;  // by check
  double worst_ratio = 0;
  double seconds = 0;
};

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
      rc::Shrinkable<Problem> drawn = draw_problem(*subject, options.seed, index);
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
  // Shares of the workers' combined time (wall time x workers: with --gpus they run at once).
  const double worker_ms = wall_ms * static_cast<double>(workers.size());
  const auto share = [worker_ms](double ms) { return worker_ms > 0 ? 100 * ms / worker_ms : 0.0; };
  fmt::print("\nsweep summary: {} case(s) run in {:.1f} min ({:.0f} cases/min), {} failure(s); {} recorded before "
             "(resumed); records in {}\n",
             ran, wall_ms / 6e4, wall_ms > 0 ? ran / (wall_ms / 6e4) : 0.0, failures, resumed, records.string());
  fmt::print("{}: subjects {:.1f} s ({:.0f}%), oracles (f64 + baseline) {:.1f} s ({:.0f}%), inputs {:.1f} s "
             "({:.0f}%), the rest (processes, pipes, shrinking) {:.0f}%\n",
             workers.size() > 1 ? fmt::format("time of {} workers", workers.size()) : std::string("wall time"),
             subject_ms / 1e3, share(subject_ms), oracle_ms / 1e3, share(oracle_ms), inputs_ms / 1e3, share(inputs_ms),
             std::max(0.0, 100 - share(subject_ms) - share(oracle_ms) - share(inputs_ms)));
  fmt::print("{:<32} {:>7} {:>7} {:>8} {:>8} {:>10} {:>11} {:>9} {:>11} {:>11}  failures by check\n", "subject",
             "cases", "passes", "failures", "vacuous", "deviations", "worst ratio", "cases/min", "unsupported",
             "unavailable");
  for (const auto& [name, s] : stats) {
    std::string by_check;
    for (const auto& [check, count] : s.failures) by_check += fmt::format("{}{}={}", by_check.empty() ? "" : " ", check, count);
    fmt::print("{:<32} {:>7} {:>7} {:>8} {:>8} {:>10} {:>11.3g} {:>9.0f} {:>11} {:>11}  {}\n", name, s.cases, s.passed,
               s.cases - s.passed - s.vacuous - s.deviations, s.vacuous, s.deviations, s.worst_ratio,
               s.seconds > 0 ? 60 * s.cases / s.seconds : 0.0, s.unsupported, s.unavailable, by_check);
  }
  // Subjects this machine cannot run: said, never passed; failures under --require-gpu.
  std::int64_t unavailable_subjects = 0;
  for (const auto& [name, s] : stats)
    if (s.unavailable > 0) {
      ++unavailable_subjects;
      if (options.require_gpu)
        fmt::print(stderr, "flashcheck: --require-gpu: {} is unavailable here: {}\n", name, s.unavailable_because);
      else
        fmt::print("UNAVAILABLE  {}: {} case(s) not run on this machine: {}\n", name, s.unavailable,
                   s.unavailable_because);
    }
  if (options.require_gpu && unavailable_subjects > 0) return 1;
  if (ran == 0 && resumed == 0) {  // nothing judged: never a pass
    std::int64_t skipped = 0;
    for (const auto& [name, s] : stats) skipped += s.unsupported + s.unavailable;
    fmt::print(stderr, "fuzz: no case ran: {}\n",
               skipped > 0 ? fmt::format("all {} case(s) drawn were unsupported or unavailable on this machine", skipped)
                           : std::string("the budget ended before the first case (raise --minutes or --cases)"));
    return 2;
  }
  if (first_catch.empty()) return failures > 0 ? 1 : 0;

  // The mutation score: caught / total, and when each was first caught.
  std::size_t not_run = 0;
  for (const auto& [name, when] : first_catch)
    if (!caught.count(name) && stats[name].cases == 0) ++not_run;
  fmt::print("\nmutation score: {}/{} caught{}\n", caught.size(), first_catch.size(),
             not_run ? fmt::format(" ({} never ran: every case unsupported or unavailable here)", not_run) : "");
  fmt::print("{:<32} {:>9} {:>16}  {}\n", "mutant", "cases", "first catch", "caught by");
  for (const auto& [name, when] : first_catch) {
    const SubjectStats& s = stats[name];
    const std::string at = when ? fmt::format("{:.1f} s", *when)
                           : caught.count(name) ? "before resume"
                           : s.cases == 0      ? "never ran"
                                               : "SURVIVED";
    std::string by;
    for (const auto& [check, count] : s.failures) by += fmt::format("{}{}", by.empty() ? "" : " ", check);
    fmt::print("{:<32} {:>9} {:>16}  {}\n", name, s.cases, at, by);
  }
  log_file << fmt::format("mutation score: {}/{} caught\n", caught.size(), first_catch.size());
  // With mutants, the sweep passes when every mutant was caught and no subject
  // under test failed.
  std::int64_t subject_failures = 0;
  for (const auto& [name, s] : stats)
    if (!first_catch.count(name)) subject_failures += s.cases - s.passed - s.vacuous - s.deviations;
  return subject_failures > 0 || caught.size() < first_catch.size() ? 1 : 0;
}

}  // namespace flashcheck::fuzz
