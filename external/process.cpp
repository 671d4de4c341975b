#include "flashcheck/external/process.hpp"

#include <wordexp.h>

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#include "flashcheck/external/protocol.hpp"

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

}  // namespace

ProcessOptions WorkerProcess::options(const std::string& command, const std::filesystem::path& cwd,
                                      const std::filesystem::path& log) {
  ProcessOptions options;
  options.argv = split_command(command);
  options.cwd = cwd;
  options.env = {{"FLASHCHECK_PROTOCOL", std::to_string(kProtocolVersion)}};  // the newest spoken
  options.in = Redirect::pipe();
  options.out = Redirect::pipe();
  options.err = Redirect::file(log);
  // The worker dies with flashcheck (a fuzz worker killed by its watchdog
  // must not leave a GPU process behind), in a group of its own, and whatever
  // it starts is ended with it, even what leaves the group.
  options.own_group = true;
  options.die_with_parent = true;
  options.reap_descendants = true;
  return options;
}

WorkerProcess::WorkerProcess(const std::string& command, const std::filesystem::path& cwd,
                             const std::filesystem::path& log)
    : process_(options(command, cwd, log)) {}

bool WorkerProcess::send(const std::string& line, double seconds) { return process_.write_all(line + "\n", seconds); }

WorkerProcess::Wait WorkerProcess::receive(std::string& line, double seconds) {
  switch (process_.read_line(line, seconds, kMaxLine)) {
    case Process::Line::line: return Wait::line;
    case Process::Line::timeout: return Wait::timeout;
    case Process::Line::closed: return Wait::closed;
    case Process::Line::too_long: return Wait::too_long;
  }
  return Wait::closed;
}

std::optional<std::string> WorkerProcess::ended(double seconds) {
  if (const auto status = process_.wait_for(seconds)) return status->describe();
  return std::nullopt;
}

void WorkerProcess::kill() { process_.kill(); }

void WorkerProcess::stop(double seconds) {
  process_.close_stdin();
  process_.wait_for(seconds);
  process_.kill();  // a no-op kill when it has ended; ends its descendants either way
}

}  // namespace flashcheck::external
