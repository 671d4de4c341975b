// Child processes: the one way flashcheck starts a program (sweep workers,
// compute-sanitizer runs, external workers, the report script).
//
// Why not a library: reproc (the maintained C/C++ process library) is not
// packaged for Debian 12, and Boost.Process 1.74 (libboost-dev) has no
// parent-death signal, no subreaper and a wait_for that is known to misreport,
// so both would need the same hand-written child set-up hooks that this file
// is; it is plain POSIX/Linux, a few hundred lines, tested by
// properties/unit/process_test.cpp.
//
// What every child gets: argv executed without a shell (argv[0] searched on
// PATH when it has no '/'); an exec (or chdir, or redirect) failure reported
// to the parent as an exception with errno's text, through a close-on-exec
// pipe; by default a process group of its own and SIGKILL when the starting
// thread dies (PR_SET_PDEATHSIG, with the race against an already-dead parent
// closed); SIGPIPE and the signal mask reset to defaults. Every system call
// retries on EINTR, writes go on after short writes, and the parent's pipe
// ends are non-blocking so that every wait has a deadline.
//
// With `reap_descendants`, this process becomes a subreaper
// (PR_SET_CHILD_SUBREAPER): whatever the child starts and orphans (a
// grandchild that calls setsid and leaves the group, a daemon) is re-parented
// here, and kill() ends and reaps it too. Such descendants are recognised by
// FLASHCHECK_PROCESS_TOKENS, a variable every child inherits; one that clears
// its environment (env -i) escapes, as does anything when this process is
// killed with SIGKILL. A process that turns this on must start every child
// through this file: unrecognised zombie children are reaped by kill().
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashcheck {

/// Where one of a child's standard streams goes.
struct Redirect {
  enum class Kind { inherit, pipe, null, file };
  Kind kind = Kind::inherit;
  std::filesystem::path path;  // Kind::file
  bool append = true;          // Kind::file: append (else truncate)

  static Redirect inherit() { return {}; }
  static Redirect pipe() { return {Kind::pipe, {}, true}; }
  static Redirect null() { return {Kind::null, {}, true}; }
  static Redirect file(std::filesystem::path path, bool append = true) { return {Kind::file, std::move(path), append}; }
};

/// How to start a child.
struct ProcessOptions {
  std::vector<std::string> argv;  // argv[0]: a path, or a name searched on PATH
  std::filesystem::path cwd;      // empty: this process's
  std::vector<std::pair<std::string, std::string>> env;           // set in the child's environment
  std::vector<std::pair<std::string, std::string>> env_defaults;  // set unless already there
  Redirect in, out, err;          // default: inherited
  bool own_group = true;          // a process group of its own (kill() ends the group)
  bool die_with_parent = true;    // SIGKILL when the starting thread ends (PR_SET_PDEATHSIG)
  bool reap_descendants = false;  // this process as subreaper; kill() ends orphaned descendants
};

/// How a child ended (waitpid's status).
struct ExitStatus {
  int raw = 0;
  bool exited() const;
  int code() const;  // exited(): its exit code, else -1
  bool signaled() const;
  int signal() const;  // signaled(): the signal, else 0
  /// "exited with status 3", "killed by signal 11 (Segmentation fault)".
  std::string describe() const;
};

/// A child that could not be started: pipes, fork, a redirect, the folder or
/// the exec; the message names the program and errno's text.
struct ProcessError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One running child. Destroying it kills it (with its group and, with
/// reap_descendants, its orphaned descendants) and reaps it.
class Process {
 public:
  /// Starts the child; throws ProcessError when it cannot.
  explicit Process(const ProcessOptions& options);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  /// The parent's ends of piped streams (non-blocking), -1 when not piped or closed.
  int stdin_fd() const { return in_; }
  int stdout_fd() const { return out_; }
  int stderr_fd() const { return err_; }

  /// Writes all of `bytes` to the child's stdin, waiting up to `seconds`
  /// (negative: no limit). False when the child closed its end (EPIPE), the
  /// time ran out, or stdin is not piped.
  bool write_all(std::string_view bytes, double seconds = -1);
  void close_stdin();

  enum class Read { data, eof, timeout };
  /// Waits up to `seconds` (0: only what is there) for the child's stdout and
  /// appends what one read gives to the line buffer. eof once it is closed.
  Read fill(double seconds);
  /// The next complete line in the buffer (without its newline).
  std::optional<std::string> take_line();
  std::size_t buffered() const { return buffer_.size(); }
  /// Takes everything buffered.
  std::string take_buffered();

  enum class Line { line, timeout, closed, too_long };
  /// Waits up to `seconds` for one line of stdout; too_long when over
  /// `max_bytes` arrive without a newline.
  Line read_line(std::string& line, double seconds, std::size_t max_bytes);

  /// How it ended, once it has (waitpid WNOHANG); it is reaped then.
  std::optional<ExitStatus> try_wait();
  /// Waits up to `seconds` (negative: no limit) for it to end.
  std::optional<ExitStatus> wait_for(double seconds);
  /// Kills it with SIGKILL (its group first, when it has one), reaps it and,
  /// with reap_descendants, ends and reaps its orphaned descendants; closes the
  /// pipes. Returns how it ended (it may have ended before). Idempotent.
  ExitStatus kill();
  /// How it ended, when it has been reaped.
  const std::optional<ExitStatus>& status() const { return status_; }

 private:
  void reaped(int raw);
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  bool own_group_ = true, reap_descendants_ = false, group_killed_ = false;
  std::string token_;  // this child's FLASHCHECK_PROCESS_TOKENS entry
  std::string buffer_;  // stdout read past the last line
  std::optional<ExitStatus> status_;
};

/// What a run_process ended with.
struct Finished {
  ExitStatus status;
  bool timed_out = false;
  std::string out;  // stdout, when piped
};

/// Starts `options` (its stdin is piped when `input` is given and `in` is
/// inherited), writes `input` and closes stdin, collects stdout when it is
/// piped, and waits for the child; after `seconds` (negative: no limit) it
/// kills it with its group (timed_out). Throws ProcessError when it cannot start.
Finished run_process(ProcessOptions options, std::optional<std::string_view> input, double seconds);

}  // namespace flashcheck
