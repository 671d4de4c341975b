#include "flashcheck/cli/progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <fmt/core.h>

#include <cstdio>
#include <string>

namespace flashcheck::cli {

namespace {

/// The terminal's width, so that the line never wraps (a wrapped line cannot
/// be rewritten with a carriage return).
std::size_t terminal_columns() {
  winsize size{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

}  // namespace

Progress::Progress(bool enabled) : active_(enabled && ::isatty(STDERR_FILENO)) {}

Progress::~Progress() { clear(); }

void Progress::show(std::string_view what, std::size_t done, std::size_t total, std::string_view detail) {
  if (!active_) return;
  std::string line = fmt::format("{} {}/{}: {}", what, done + 1, total, detail);
  const std::size_t columns = terminal_columns();
  if (line.size() >= columns) {
    line.resize(columns > 4 ? columns - 4 : 0);
    line += "...";
  }
  std::fflush(stdout);  // what was printed before goes first
  fmt::print(stderr, "\r{}\x1b[K", line);
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::clear() {
  if (!active_ || !drawn_) return;
  fmt::print(stderr, "\r\x1b[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace flashcheck::cli
