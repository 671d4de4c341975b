// A worker process: started from a command line (split by wordexp, no shell)
// through core/process, spoken to in lines over its stdin and stdout, its
// stderr appended to a log file. It runs in a process group of its own, dies
// with flashcheck, and runs under flashcheck as subreaper: a timeout or a
// failure ends it with everything it started, a grandchild that called
// setsid included.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>

#include "flashcheck/core/process.hpp"

namespace flashcheck::external {

class WorkerProcess {
 public:
  /// Starts `command` in `cwd` (empty: this process's), with FLASHCHECK_PROTOCOL
  /// set. Throws std::runtime_error when the command cannot be split or run.
  WorkerProcess(const std::string& command, const std::filesystem::path& cwd, const std::filesystem::path& log);
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  /// Writes one line (a newline is added), waiting up to `seconds` for the
  /// worker to take it. False when the worker has gone or does not read.
  bool send(const std::string& line, double seconds);

  enum class Wait { line, timeout, closed, too_long };
  /// Waits up to `seconds` for one line of stdout (without its newline).
  Wait receive(std::string& line, double seconds);

  /// Kills the worker with its group and its orphaned descendants, and reaps it.
  void kill();
  /// Closes stdin, waits up to `seconds` for the worker to exit, then kills it.
  void stop(double seconds);
  /// How the worker ended ("exited with status 3", "killed by signal 11"),
  /// waiting up to `seconds` for it; nullopt while it runs.
  std::optional<std::string> ended(double seconds = 0);
  pid_t pid() const { return process_.pid(); }

 private:
  static ProcessOptions options(const std::string& command, const std::filesystem::path& cwd,
                                const std::filesystem::path& log);
  Process process_;
};

}  // namespace flashcheck::external
