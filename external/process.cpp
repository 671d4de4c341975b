#include "flashcheck/external/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <wordexp.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace flashcheck::external {

namespace {

constexpr std::size_t kMaxLine = 1 << 20;  // a reply longer than 1 MiB is garbage

std::vector<std::string> split_command(const std::string& command) {
  wordexp_t words{};
  const int code = ::wordexp(command.c_str(), &words, WRDE_NOCMD | WRDE_UNDEF);
  if (code != 0) {
    const char* why = code == WRDE_BADCHAR ? "an unquoted shell operator (| & ; < > ( ) { } or newline); wrap it in "
                                             "sh -c '...'"
                      : code == WRDE_CMDSUB ? "a command substitution"
                      : code == WRDE_BADVAL ? "an undefined variable"
                      : code == WRDE_SYNTAX ? "a quoting error"
                                            : "an unsplittable word";
    throw std::runtime_error(fmt::format("external command '{}' has {}", command, why));
  }
  std::vector<std::string> argv(words.we_wordv, words.we_wordv + words.we_wordc);
  ::wordfree(&words);
  if (argv.empty()) throw std::runtime_error("external command is empty");
  return argv;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {} ({})", WTERMSIG(status), ::strsignal(WTERMSIG(status)));
  return "ended";
}

}  // namespace

WorkerProcess::WorkerProcess(const std::string& command, const std::filesystem::path& cwd,
                             const std::filesystem::path& log) {
  const std::vector<std::string> argv = split_command(command);
  // A write to a worker that has died must return EPIPE, not end flashcheck.
  ::signal(SIGPIPE, SIG_IGN);
  int in[2] = {-1, -1}, out[2] = {-1, -1}, ready[2] = {-1, -1};
  int log_fd = -1;
  const auto close_all = [&] {
    for (int fd : {in[0], in[1], out[0], out[1], ready[0], ready[1], log_fd})
      if (fd >= 0) ::close(fd);
  };
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(ready, O_CLOEXEC) != 0) {
    const int error = errno;
    close_all();
    throw std::runtime_error(fmt::format("cannot create pipes: {}", std::strerror(error)));
  }
  log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    const int error = errno;
    close_all();
    throw std::runtime_error(fmt::format("cannot open {}: {}", log.string(), std::strerror(error)));
  }
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) {
    const int error = errno;
    close_all();
    throw std::runtime_error(fmt::format("cannot fork: {}", std::strerror(error)));
  }
  if (pid_ == 0) {
    // The worker dies with flashcheck (a fuzz worker killed by its watchdog
    // must not leave a GPU process behind), in a group of its own so that a
    // timeout kills whatever it started too.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(log_fd, 2);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) {
      const int error = errno;
      (void)!::write(ready[1], &error, sizeof error);
      ::_exit(127);
    }
    ::setenv("FLASHCHECK_PROTOCOL", "1", 1);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    const int error = errno;
    (void)!::write(ready[1], &error, sizeof error);
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(ready[1]);
  ::close(log_fd);
  to_child_ = in[1];
  from_child_ = out[0];
  // The exec either succeeds (the close-on-exec pipe reads EOF) or reports errno.
  int error = 0;
  ssize_t got;
  do got = ::read(ready[0], &error, sizeof error);
  while (got < 0 && errno == EINTR);
  ::close(ready[0]);
  if (got == sizeof error) {
    kill();
    throw std::runtime_error(fmt::format("cannot run '{}'{}: {}", argv[0],
                                         cwd.empty() ? "" : fmt::format(" in {}", cwd.string()), std::strerror(error)));
  }
}

WorkerProcess::~WorkerProcess() { kill(); }

bool WorkerProcess::send(const std::string& line) {
  if (to_child_ < 0) return false;
  const std::string text = line + "\n";
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t wrote = ::write(to_child_, text.data() + done, text.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return false;
    done += static_cast<std::size_t>(wrote);
  }
  return true;
}

WorkerProcess::Wait WorkerProcess::receive(std::string& line, double seconds) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    if (const std::size_t newline = pending_.find('\n'); newline != std::string::npos) {
      line = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      return Wait::line;
    }
    if (pending_.size() > kMaxLine) return Wait::too_long;
    if (from_child_ < 0) return Wait::closed;
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) return Wait::timeout;
    pollfd fd{from_child_, POLLIN, 0};
    const int ready = ::poll(&fd, 1, static_cast<int>(std::min(left * 1000 + 1, 60000.0)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buffer[65536];
    const ssize_t got = ::read(from_child_, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      ::close(from_child_);
      from_child_ = -1;
      continue;
    }
    pending_.append(buffer, static_cast<std::size_t>(got));
  }
}

std::optional<std::string> WorkerProcess::ended(double seconds) {
  if (ending_ || pid_ <= 0) return ending_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int status = 0;
    const pid_t got = ::waitpid(pid_, &status, WNOHANG);
    if (got == pid_) {
      ending_ = describe_status(status);
      return ending_;
    }
    if (got < 0) {
      ending_ = "ended (not a child any more)";
      return ending_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    ::usleep(10000);
  }
}

void WorkerProcess::kill() {
  // The group first, even when the worker itself has been reaped: whatever it
  // started (and that still holds its output, or the GPU) goes too. While the
  // group has members its id cannot be reused.
  if (pid_ > 0 && !group_killed_) {
    ::kill(-pid_, SIGKILL);
    group_killed_ = true;
  }
  if (pid_ > 0 && !ending_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    if (::waitpid(pid_, &status, 0) == pid_) ending_ = describe_status(status);
  }
  for (int* fd : {&to_child_, &from_child_})
    if (*fd >= 0) {
      ::close(*fd);
      *fd = -1;
    }
}

void WorkerProcess::stop(double seconds) {
  if (to_child_ >= 0) {
    ::close(to_child_);
    to_child_ = -1;
  }
  if (!ended(seconds)) kill();
  kill();  // closes the pipes; the worker has already been reaped
}

}  // namespace flashcheck::external
