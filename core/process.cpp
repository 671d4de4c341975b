// Child processes (process.hpp).
#include "flashcheck/core/process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

extern char** environ;

namespace flashcheck {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kTokens = "FLASHCHECK_PROCESS_TOKENS";

/// The children this process started and has not reaped yet, by pid, with
/// their tokens. The lock is held across fork and registration, so that a
/// descendant sweep never takes a child being started for an orphan.
struct Children {
  std::mutex lock;
  std::map<pid_t, std::string> live;  // pid -> token
  std::set<std::string> live_tokens;
  std::uint64_t started = 0;
  bool subreaper = false;
};

/// Never destroyed: children are killed from destructors of other statics
/// (the subject registry's external workers), in any order at exit.
Children& children() {
  static Children* const instance = new Children;
  return *instance;
}

template <typename Call>
auto retry(Call call) {
  for (;;) {
    const auto result = call();
    if (!(result < 0 && errno == EINTR)) return result;
  }
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);  // no retry on EINTR: Linux has closed it already
  fd = -1;
}

/// A close-on-exec duplicate at 3 or above, so that the child's dup2s onto
/// 0, 1 and 2 cannot overwrite one another's sources.
int above_stdio(int fd) {
  if (fd < 0 || fd > 2) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  ::close(fd);
  return moved;
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

/// argv[0] as execve needs it: as given when it has a '/', else the first
/// executable regular file of that name on PATH; empty when none is.
std::string resolve(const std::string& program, const char* path_variable) {
  if (program.find('/') != std::string::npos) return program;
  std::string_view rest = path_variable && *path_variable ? path_variable : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const std::size_t colon = rest.find(':');
    const std::string_view folder = rest.substr(0, colon);
    const std::string candidate = fmt::format("{}/{}", folder.empty() ? "." : folder, program);
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string_view::npos) return {};
    rest.remove_prefix(colon + 1);
  }
}

double seconds_until(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

Clock::time_point deadline_after(double seconds) {
  if (seconds < 0) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

/// poll(2) on one descriptor until `deadline`, in slices of at most a second,
/// retried on EINTR. True when it is ready (or in error, or hung up).
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const double left = deadline == Clock::time_point::max() ? 1.0 : seconds_until(deadline);
    pollfd entry{fd, events, 0};
    const int ms = left <= 0 ? 0 : static_cast<int>(std::min(left * 1000 + 1, 1000.0));
    const int ready = ::poll(&entry, 1, ms);
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return true;  // let the read or write say what is wrong
    if (left <= 0) return false;
  }
}

struct ChildError {
  int stage;  // 0 exec, 1 chdir, 2 dup2
  int error;
};

/// One line of /proc/PID/stat: (state, ppid, pgrp); false when it is gone.
bool read_stat(pid_t pid, char& state, pid_t& ppid, pid_t& pgrp) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = retry([&] { return ::open(path, O_RDONLY | O_CLOEXEC); });
  if (fd < 0) return false;
  char text[1024];
  const ssize_t got = retry([&] { return ::read(fd, text, sizeof text - 1); });
  ::close(fd);
  if (got <= 0) return false;
  text[got] = '\0';
  const char* after_name = std::strrchr(text, ')');  // the command name may hold spaces and parentheses
  int parent = 0, group = 0;
  if (!after_name || std::sscanf(after_name + 1, " %c %d %d", &state, &parent, &group) != 3) return false;
  ppid = parent;
  pgrp = group;
  return true;
}

/// The FLASHCHECK_PROCESS_TOKENS entries of a process's initial environment.
std::vector<std::string> tokens_of(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/environ", static_cast<int>(pid));
  const int fd = retry([&] { return ::open(path, O_RDONLY | O_CLOEXEC); });
  if (fd < 0) return {};
  std::string text;
  char chunk[65536];
  for (;;) {
    const ssize_t got = retry([&] { return ::read(fd, chunk, sizeof chunk); });
    if (got <= 0 || text.size() > (std::size_t{8} << 20)) break;
    text.append(chunk, static_cast<std::size_t>(got));
  }
  ::close(fd);
  const std::string key = fmt::format("{}=", kTokens);
  std::vector<std::string> tokens;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\0', at), text.size());
    if (text.compare(at, key.size(), key) == 0) {
      std::string_view value(text.data() + at + key.size(), end - at - key.size());
      while (!value.empty()) {
        const std::size_t colon = value.find(':');
        tokens.emplace_back(value.substr(0, colon));
        value = colon == std::string_view::npos ? std::string_view() : value.substr(colon + 1);
      }
    }
    at = end + 1;
  }
  return tokens;
}

/// Ends and reaps this process's children that a dead child of ours left
/// behind (re-parented here as the subreaper): those in `group` (the dead
/// child's process group), those whose tokens name a child of ours that is no
/// longer live, and zombies that no live child accounts for. Repeats until
/// none is left, since each one ended re-parents its own children here. A
/// child whose environment reads empty is looked at again for up to 50 ms: a
/// process in the middle of an execve has none for a moment (the new image's
/// is not yet set up), and the descendant it becomes carries our token (a
/// setsid grandchild exec'ing `sleep` outlived kill() in 3 of 120 runs of
/// Process.SetsidGrandchildDoesNotOutliveTheRunUnderTheSubreaper before this,
/// 0 of 240 after, 2026-11-26, and failed a clean-clone CI run).
void sweep_descendants(pid_t group) {
  Children& r = children();
  const std::lock_guard<std::mutex> hold(r.lock);
  const pid_t self = ::getpid();
  const std::string ours = fmt::format("{}.", self);
  int second_looks = 0;
  for (int round = 0; round < 10000; ++round) {
    std::vector<pid_t> doomed;
    bool unread = false;  // a child of ours whose environment read empty
    DIR* proc = ::opendir("/proc");
    if (!proc) return;
    while (const dirent* entry = ::readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(entry->d_name, &end, 10);
      if (pid <= 0 || *end != '\0' || r.live.count(static_cast<pid_t>(pid))) continue;
      char state = 0;
      pid_t ppid = 0, pgrp = 0;
      if (!read_stat(static_cast<pid_t>(pid), state, ppid, pgrp) || ppid != self) continue;
      bool orphaned = state == 'Z' || (group > 0 && pgrp == group);
      if (!orphaned) {
        const std::vector<std::string> tokens = tokens_of(static_cast<pid_t>(pid));
        unread = unread || tokens.empty();
        for (const std::string& token : tokens)
          if (token.rfind(ours, 0) == 0 && !r.live_tokens.count(token)) orphaned = true;
      }
      if (orphaned) doomed.push_back(static_cast<pid_t>(pid));
    }
    ::closedir(proc);
    if (doomed.empty()) {
      if (!unread || ++second_looks > 50) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    for (const pid_t pid : doomed) {
      ::kill(pid, SIGKILL);
      retry([&] { return ::waitpid(pid, nullptr, 0); });
    }
  }
}

}  // namespace

bool ExitStatus::exited() const { return WIFEXITED(raw); }
int ExitStatus::code() const { return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1; }
bool ExitStatus::signaled() const { return WIFSIGNALED(raw); }
int ExitStatus::signal() const { return WIFSIGNALED(raw) ? WTERMSIG(raw) : 0; }

std::string ExitStatus::describe() const {
  if (exited()) return fmt::format("exited with status {}", code());
  if (signaled()) return fmt::format("killed by signal {} ({})", signal(), ::strsignal(signal()));
  return "ended";
}

Process::Process(const ProcessOptions& options)
    : own_group_(options.own_group), reap_descendants_(options.reap_descendants) {
  if (options.argv.empty()) throw ProcessError("cannot run an empty command");
  const std::string& program = options.argv.front();
  const std::string where = options.cwd.empty() ? "" : fmt::format(" in {}", options.cwd.string());

  // The environment, built here: the child may only call async-signal-safe
  // functions between fork and exec (this process may have threads).
  std::vector<std::string> environment;
  for (char** entry = environ; entry && *entry; ++entry) environment.emplace_back(*entry);
  const auto find = [&](const std::string& name) {
    return std::find_if(environment.begin(), environment.end(), [&](const std::string& entry) {
      return entry.size() > name.size() && entry.compare(0, name.size(), name) == 0 && entry[name.size()] == '=';
    });
  };
  for (const auto& [name, value] : options.env) {
    if (auto found = find(name); found != environment.end()) *found = name + "=" + value;
    else environment.push_back(name + "=" + value);
  }
  for (const auto& [name, value] : options.env_defaults)
    if (find(name) == environment.end()) environment.push_back(name + "=" + value);
  const char* path_variable = std::getenv("PATH");
  for (const std::string& entry : environment)
    if (entry.rfind("PATH=", 0) == 0) path_variable = entry.c_str() + 5;
  const std::string executable = resolve(program, path_variable);
  if (executable.empty())
    throw ProcessError(fmt::format("cannot run '{}'{}: {} (not found on PATH)", program, where, std::strerror(ENOENT)));

  Children& r = children();
  {
    const std::lock_guard<std::mutex> hold(r.lock);
    token_ = fmt::format("{}.{}", ::getpid(), ++r.started);
    if (options.reap_descendants && !r.subreaper) {
      if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        throw ProcessError(fmt::format("cannot become a subreaper: {}", std::strerror(errno)));
      r.subreaper = true;
    }
  }
  if (auto found = find(kTokens); found != environment.end()) *found += ":" + token_;
  else environment.push_back(fmt::format("{}={}", kTokens, token_));
  std::vector<char*> envp, args;
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv = options.argv;
  for (std::string& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);

  // The child's ends (child[i] for stdin, stdout, stderr; -1: inherited) and ours.
  int child[3] = {-1, -1, -1}, parent[3] = {-1, -1, -1}, report[2] = {-1, -1};
  const auto close_all = [&] {
    for (int i = 0; i < 3; ++i) {
      close_fd(child[i]);
      close_fd(parent[i]);
    }
    close_fd(report[0]);
    close_fd(report[1]);
  };
  const Redirect* redirects[3] = {&options.in, &options.out, &options.err};
  for (int i = 0; i < 3; ++i) {
    const Redirect& redirect = *redirects[i];
    if (redirect.kind == Redirect::Kind::pipe) {
      int ends[2];
      if (::pipe2(ends, O_CLOEXEC) != 0) {
        const int error = errno;
        close_all();
        throw ProcessError(fmt::format("cannot run '{}': cannot create a pipe: {}", program, std::strerror(error)));
      }
      child[i] = above_stdio(i == 0 ? ends[0] : ends[1]);
      parent[i] = i == 0 ? ends[1] : ends[0];
      set_nonblocking(parent[i]);
    } else if (redirect.kind != Redirect::Kind::inherit) {
      const bool null = redirect.kind == Redirect::Kind::null;
      const char* path = null ? "/dev/null" : redirect.path.c_str();
      const int flags = i == 0 ? O_RDONLY : O_WRONLY | O_CREAT | (redirect.append ? O_APPEND : O_TRUNC);
      child[i] = above_stdio(retry([&] { return ::open(path, flags | O_CLOEXEC | O_NOCTTY, 0644); }));
      if (child[i] < 0) {
        const int error = errno;
        close_all();
        throw ProcessError(fmt::format("cannot run '{}': cannot open {}: {}", program, path, std::strerror(error)));
      }
    }
  }
  if (::pipe2(report, O_CLOEXEC) != 0) {
    const int error = errno;
    close_all();
    throw ProcessError(fmt::format("cannot run '{}': cannot create a pipe: {}", program, std::strerror(error)));
  }
  report[1] = above_stdio(report[1]);
  if (options.in.kind == Redirect::Kind::pipe) {
    // A write to a child that has gone must fail with EPIPE, not end this
    // process; the child gets SIGPIPE's default back before exec.
    ::signal(SIGPIPE, SIG_IGN);
  }

  const pid_t self = ::getpid();
  std::unique_lock<std::mutex> hold(r.lock);
  pid_ = ::fork();
  if (pid_ < 0) {
    const int error = errno;
    hold.unlock();
    close_all();
    throw ProcessError(fmt::format("cannot run '{}': cannot fork: {}", program, std::strerror(error)));
  }
  if (pid_ == 0) {
    // The child: async-signal-safe calls only, until exec.
    const auto fail = [&](int stage) {
      const ChildError error{stage, errno};
      (void)!::write(report[1], &error, sizeof error);
      ::_exit(127);
    };
    if (options.own_group) ::setpgid(0, 0);
    if (options.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != self) ::_exit(127);  // the parent died before the prctl
    }
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    ::sigaction(SIGPIPE, &fallback, nullptr);
    for (int i = 0; i < 3; ++i)
      if (child[i] >= 0 && retry([&] { return ::dup2(child[i], i); }) < 0) fail(2);
    if (!options.cwd.empty() && ::chdir(options.cwd.c_str()) != 0) fail(1);
    ::execve(executable.c_str(), args.data(), envp.data());
    fail(0);
  }
  r.live[pid_] = token_;
  r.live_tokens.insert(token_);
  hold.unlock();
  if (own_group_) ::setpgid(pid_, pid_);  // here too, so that the group exists before any kill
  for (int i = 0; i < 3; ++i) close_fd(child[i]);
  close_fd(report[1]);
  in_ = parent[0];
  out_ = parent[1];
  err_ = parent[2];
  // The exec either succeeds (the close-on-exec pipe reads EOF) or reports errno.
  ChildError error{};
  const ssize_t got = retry([&] { return ::read(report[0], &error, sizeof error); });
  close_fd(report[0]);
  if (got == static_cast<ssize_t>(sizeof error)) {
    kill();
    const char* stage = error.stage == 1 ? "cannot enter the folder: " : error.stage == 2 ? "cannot redirect: " : "";
    throw ProcessError(fmt::format("cannot run '{}'{}: {}{}", program, where, stage, std::strerror(error.error)));
  }
}

Process::~Process() { kill(); }

bool Process::write_all(std::string_view bytes, double seconds) {
  const auto deadline = deadline_after(seconds);
  while (!bytes.empty()) {
    if (in_ < 0) return false;
    const ssize_t wrote = retry([&] { return ::write(in_, bytes.data(), bytes.size()); });
    if (wrote > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(wrote));
      continue;
    }
    if (wrote < 0 && errno == EAGAIN) {
      if (!wait_ready(in_, POLLOUT, deadline)) return false;
      continue;
    }
    return false;  // EPIPE: the child closed its end
  }
  return true;
}

void Process::close_stdin() { close_fd(in_); }

Process::Read Process::fill(double seconds) {
  if (out_ < 0) return Read::eof;
  const auto deadline = deadline_after(seconds);
  for (;;) {
    char chunk[65536];
    const ssize_t got = retry([&] { return ::read(out_, chunk, sizeof chunk); });
    if (got > 0) {
      buffer_.append(chunk, static_cast<std::size_t>(got));
      return Read::data;
    }
    if (got < 0 && errno == EAGAIN) {
      if (seconds_until(deadline) <= 0 || !wait_ready(out_, POLLIN, deadline)) return Read::timeout;
      continue;
    }
    close_fd(out_);
    return Read::eof;
  }
}

std::optional<std::string> Process::take_line() {
  const std::size_t newline = buffer_.find('\n');
  if (newline == std::string::npos) return std::nullopt;
  std::string line = buffer_.substr(0, newline);
  buffer_.erase(0, newline + 1);
  return line;
}

std::string Process::take_buffered() { return std::exchange(buffer_, {}); }

Process::Line Process::read_line(std::string& line, double seconds, std::size_t max_bytes) {
  const auto deadline = deadline_after(seconds);
  for (;;) {
    if (auto next = take_line()) {
      line = std::move(*next);
      return Line::line;
    }
    if (buffer_.size() > max_bytes) return Line::too_long;
    if (out_ < 0) return Line::closed;
    const double left = deadline == Clock::time_point::max() ? -1 : seconds_until(deadline);
    if (deadline != Clock::time_point::max() && left <= 0) return Line::timeout;
    if (fill(left) == Read::timeout) return Line::timeout;
  }
}

void Process::reaped(int raw) {
  status_ = ExitStatus{raw};
  Children& r = children();
  const std::lock_guard<std::mutex> hold(r.lock);
  r.live.erase(pid_);
  r.live_tokens.erase(token_);
}

std::optional<ExitStatus> Process::try_wait() {
  if (status_ || pid_ <= 0) return status_;
  int raw = 0;
  const pid_t got = retry([&] { return ::waitpid(pid_, &raw, WNOHANG); });
  if (got == pid_) reaped(raw);
  else if (got < 0) reaped(0);  // not our child any more (reaped elsewhere): nothing to learn
  return status_;
}

std::optional<ExitStatus> Process::wait_for(double seconds) {
  const auto deadline = deadline_after(seconds);
  for (auto pause = std::chrono::microseconds(200);; pause = std::min(pause * 2, std::chrono::microseconds(20000))) {
    if (try_wait()) return status_;
    if (seconds_until(deadline) <= 0) return std::nullopt;
    std::this_thread::sleep_for(pause);
  }
}

ExitStatus Process::kill() {
  if (pid_ > 0) {
    // The group first, even when the child has been reaped: whatever it
    // started (and that may hold its output, or a GPU) goes too. While the
    // group has members, its id cannot be reused.
    if (own_group_ && !group_killed_) ::kill(-pid_, SIGKILL);
    group_killed_ = true;
    if (!status_) {
      ::kill(pid_, SIGKILL);
      int raw = 0;
      const pid_t got = retry([&] { return ::waitpid(pid_, &raw, 0); });
      reaped(got == pid_ ? raw : 0);
    }
    if (reap_descendants_) {
      sweep_descendants(own_group_ ? pid_ : 0);
      reap_descendants_ = false;
    }
  }
  close_fd(in_);
  close_fd(out_);
  close_fd(err_);
  return status_.value_or(ExitStatus{});
}

Finished run_process(ProcessOptions options, std::optional<std::string_view> input, double seconds) {
  if (input && options.in.kind == Redirect::Kind::inherit) options.in = Redirect::pipe();
  const auto deadline = deadline_after(seconds);
  Process child(options);
  Finished finished;
  std::string_view rest = input.value_or(std::string_view());
  if (child.stdin_fd() >= 0 && rest.empty()) child.close_stdin();
  // Feed stdin and drain stdout together, so that neither pipe can fill up
  // while the other waits.
  while (child.stdin_fd() >= 0 || child.stdout_fd() >= 0) {
    pollfd fds[2] = {{child.stdin_fd(), POLLOUT, 0}, {child.stdout_fd(), POLLIN, 0}};
    const double left = deadline == Clock::time_point::max() ? 1.0 : seconds_until(deadline);
    if (left <= 0) {
      finished.timed_out = true;
      break;
    }
    const int ready = ::poll(fds, 2, static_cast<int>(std::min(left * 1000 + 1, 1000.0)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    if (fds[0].fd >= 0 && fds[0].revents) {
      const ssize_t wrote = retry([&] { return ::write(child.stdin_fd(), rest.data(), rest.size()); });
      if (wrote > 0) rest.remove_prefix(static_cast<std::size_t>(wrote));
      if ((wrote < 0 && errno != EAGAIN) || rest.empty()) child.close_stdin();
    }
    if (fds[1].fd >= 0 && fds[1].revents) child.fill(0);
  }
  finished.out = child.take_buffered();
  if (!finished.timed_out) {
    const double left = deadline == Clock::time_point::max() ? -1 : std::max(0.0, seconds_until(deadline));
    if (!child.wait_for(left)) finished.timed_out = true;
  }
  finished.status = child.kill();
  return finished;
}

}  // namespace flashcheck
