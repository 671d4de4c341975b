// Options shared by several commands, so that they read the same everywhere:
// the subject option, numeric checks that refuse NaN, infinities and
// overflowing budgets, and the exit codes' wording.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace flashcheck::cli {

/// The help text of -s/--subjects, the same on every command that takes subjects.
inline constexpr const char* kSubjectsHelp =
    "Subjects: registered names (flashcheck list), 'all' for every subject, or 'mutants' (binaries that\n"
    "link them); repeatable, and comma lists are accepted: -s a,b -s c";

/// Adds -s/--subjects (repeatable, comma lists accepted; --subject is the
/// older spelling, kept for the reproducers in existing records) to a command.
/// Names are appended to `names`.
CLI::Option* add_subjects(CLI::App& command, std::vector<std::string>& names);

/// A validator for a floating-point option: a finite number in [low, high]
/// (or (low, high] when `low_exclusive`); NaN and infinities are refused.
CLI::Validator finite_in(double low, double high, bool low_exclusive = false);

/// Adds an option read as a decimal integer in [low, high]: no sign where low
/// is 0, no octal or hexadecimal, no wrap-around (`--seed -1` is refused, not
/// turned into 2^64 - 1).
CLI::Option* add_integer(CLI::App& command, const std::string& name, std::uint64_t& target, const std::string& help,
                         std::uint64_t low, std::uint64_t high);
CLI::Option* add_integer(CLI::App& command, const std::string& name, std::int64_t& target, const std::string& help,
                         std::int64_t low, std::int64_t high);

/// At most this many minutes of a time budget (about 1.9 years): a larger one
/// would overflow the clock's deadline.
inline constexpr double kMaxMinutes = 1e6;
/// At most this many seconds for a watchdog or a start-up timeout (about 11.6 days).
inline constexpr double kMaxSeconds = 1e6;

/// The exit codes, said the same way in every footer and in the README.
inline constexpr const char* kExitCodesLine =
    "Exit codes: 0 pass, 1 fail, 2 bad input (one line on stderr), 3 internal error (\"flashcheck: internal\n"
    "error: ...\": a bug, or the machine: a full disk, a failed fork).";

/// The footer of `run` and `replay`: what the exit code says.
inline constexpr const char* kRunExitCodes =
    "Exit codes: 0 every case that ran passed (problems outside a subject's domain under 'all', and\n"
    "subjects unavailable on this machine, are printed and skipped, never passed); 1 a case failed, with\n"
    "--require-gpu a subject is unavailable here, or with --every-row on the every-row reference cannot\n"
    "run here; 2 bad input, a problem outside a named subject's domain, or no case ran at all; 3 internal\n"
    "error (\"flashcheck: internal error: ...\": a bug, or the machine: a full disk, a failed fork).";

}  // namespace flashcheck::cli
