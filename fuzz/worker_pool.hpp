// The sweep's process pool: one worker process per slot, fed a case at a
// time through pipes, with its watchdog, its own temporary folder and the
// record of how it ended (private to fuzz/).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <fmt/core.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/process.hpp"
#include "flashcheck/core/record.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck::fuzz::detail {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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

CaseRecord record_of(const Worker::Reply& reply, const std::string& key, const Subject& subject,
                     const Problem& problem);

std::optional<Problem> shrink(Worker& worker, const Subject& subject, rc::Shrinkable<Problem> failing,
                              const std::string& check, double watchdog, int max_runs);

}  // namespace flashcheck::fuzz::detail
