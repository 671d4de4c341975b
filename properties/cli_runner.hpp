// Running the flashcheck binary from a test: its exit code, stdout and stderr
// (through files in a scratch folder the caller owns), under a time limit so
// that a hang fails the test instead of stalling the suite. One runner for
// the CLI tests, the bad-input tests and the problem-line property.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace flashcheck::testing_cli {

struct Outcome {
  int exit_code = -1;  // 128 + the signal where the process was killed
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

inline int count_lines(const std::string& text) {
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

/// Runs `binary args` (args shell-quoted by the caller) after `shell_prefix`
/// (a ulimit, say), with stdin from /dev/null and its output in `dir`.
inline Outcome run_binary(const std::string& binary, const std::string& args, const std::filesystem::path& dir,
                          const std::string& shell_prefix = "", int seconds = 120) {
  const std::string command = shell_prefix + "timeout " + std::to_string(seconds) + " " + binary + " " + args + " >" +
                              (dir / "out").string() + " 2>" + (dir / "err").string() + " </dev/null";
  const int status = std::system(command.c_str());
  Outcome outcome;
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  outcome.out = slurp(dir / "out");
  outcome.err = slurp(dir / "err");
  return outcome;
}

}  // namespace flashcheck::testing_cli
