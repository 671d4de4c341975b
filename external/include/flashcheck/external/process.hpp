// A worker process: started from a command line (split by wordexp, no shell),
// spoken to in lines over its stdin and stdout, its stderr appended to a log
// file, and killed with its process group on a timeout.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>

namespace flashcheck::external {

class WorkerProcess {
 public:
  /// Starts `command` in `cwd` (empty: this process's), with FLASHCHECK_PROTOCOL
  /// set. Throws std::runtime_error when the command cannot be split or run.
  WorkerProcess(const std::string& command, const std::filesystem::path& cwd, const std::filesystem::path& log);
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  /// Writes one line (a newline is added). False when the worker has gone.
  bool send(const std::string& line);

  enum class Wait { line, timeout, closed, too_long };
  /// Waits up to `seconds` for one line of stdout (without its newline).
  Wait receive(std::string& line, double seconds);

  /// Kills the process group (SIGKILL) and reaps the worker.
  void kill();
  /// Closes stdin, waits up to `seconds` for the worker to exit, then kills it.
  void stop(double seconds);
  /// How the worker ended ("exited with status 3", "killed by signal 11"),
  /// waiting up to `seconds` for it; nullopt while it runs.
  std::optional<std::string> ended(double seconds = 0);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string pending_;  // bytes read past the last line
  std::optional<std::string> ending_;
  bool group_killed_ = false;
};

}  // namespace flashcheck::external
