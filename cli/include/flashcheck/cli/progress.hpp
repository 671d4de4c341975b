// Progress on stderr for the commands that run many cases (bench, a
// multi-case run): one line, rewritten in place, and only when stderr is a
// terminal, so that logs and pipes never see it.
#pragma once

#include <string_view>

namespace flashcheck::cli {

class Progress {
 public:
  /// `enabled`: whether to draw at all (also needs stderr to be a terminal).
  explicit Progress(bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Draws "<what> <done + 1>/<total>: <detail>" over the previous line.
  void show(std::string_view what, std::size_t done, std::size_t total, std::string_view detail);
  /// Erases the line, before anything else is printed to the terminal.
  void clear();
  bool active() const { return active_; }

 private:
  bool active_ = false;
  bool drawn_ = false;
};

}  // namespace flashcheck::cli
