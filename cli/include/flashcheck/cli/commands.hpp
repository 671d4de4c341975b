// The flashcheck subcommands. Each returns the process exit code:
// 0 pass, 1 fail (also a subject unavailable under --require-gpu, or no GPU
// reference under --every-row on), 2 bad input or unsupported, or nothing ran,
// 3 internal error (an exception that is not bad input).
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <string>
#include <vector>

#include "flashcheck/cli/options.hpp"

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck::cli {

inline constexpr int kExitPass = 0;
inline constexpr int kExitFail = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInternalError = 3;

/// Adds every command to the app (main, and the test that walks the options).
void add_commands(CLI::App& app, int& exit_code);
/// Prints one line for an error that ended a command and gives its exit code:
/// kExitBadInput for CLI11's errors, BadInput and std::invalid_argument (the
/// commands' checks of what they were given); kExitInternalError, as
/// "flashcheck: internal error: ...", for anything else.
int exit_code_of(std::exception_ptr error);

/// Problems from --problem lines and a --problems file ('#' starts a comment);
/// a bad line throws BadInput naming the file and line; a missing file, a
/// folder, or no problem at all throws std::invalid_argument.
std::vector<Problem> read_problems(const std::vector<std::string>& lines, const std::string& file);

/// The subjects that --subject names (each a registered name, `all` for every
/// subject, or `mutants` for every mutant linked in); an unknown name throws
/// naming it (std::invalid_argument). `every` is set when `all`
/// was among them.
std::vector<Subject*> resolve_subjects(const std::vector<std::string>& names, bool* every = nullptr);

/// The peers a command compares with unless told otherwise: on each problem
/// the first whose domain holds it (cudnn; cudnn-fp8 for fp8 problems).
inline const std::vector<std::string> kDefaultPeers = {"cudnn", "cudnn-fp8"};
/// Adds --peer NAME,... and --no-peer to a command that compares its
/// subjects with a peer (run, replay, bench).
void add_peer(CLI::App& command, std::vector<std::string>& names, bool& none);
/// The peer subjects the library is given: none with --no-peer; a default
/// peer not built into this binary (a CPU build) is left out; another name
/// that is not registered is bad input (std::invalid_argument).
std::vector<Subject*> resolve_peers(const std::vector<std::string>& names, bool none);

/// Adds --max-memory GIB to a command that takes problems (run, replay, fuzz,
/// bench): sets memory_limit_bytes for this process and its children.
CLI::Option* add_max_memory(CLI::App& command);
/// Adds --require-gpu to a command: the same name and help on run, fuzz and bench.
CLI::Option* add_require_gpu(CLI::App& command, bool& flag);
/// What --require-gpu checks before anything runs: one line on stderr per
/// subject that cannot run here (and one when no GPU is usable at all, though
/// no chosen subject needs it), and kExitFail; kExitPass when all can.
int check_required_gpu(const std::vector<Subject*>& subjects);
/// --every-row, shared by run and fuzz (the commands that judge): where the
/// judge sampled a case's rows, judge it again on every row on the GPU.
enum class EveryRowMode {
  off,        // the verdict rests on the sampled rows
  automatic,  // on the GPU where the Kokkos reference can run there, else sampled (the record says why)
  on,         // as automatic, and a machine where it cannot run is a failure
};
/// Adds --every-row (off|auto|on, default off for now) to a command: the same name and help on run and fuzz.
CLI::Option* add_every_row(CLI::App& command, EveryRowMode& mode);
/// What the judge is asked for under a mode.
EveryRow judge_every_row_option(EveryRowMode mode);
/// What --every-row on checks before anything runs: one line on stderr and
/// kExitFail where the GPU reference cannot run here; kExitPass otherwise.
int check_every_row(EveryRowMode mode);
/// Prints, on stderr, the stats() line of every subject that has one (the cuDNN
/// subject's graph and kernel-cache counters, say).
void print_subject_stats();

/// What `run` (and `replay`) do: judge every subject on every problem and print.
struct RunOptions {
  std::vector<std::string> subjects;
  std::vector<std::string> problem_lines;
  std::string problems_file;
  std::string record_path;
  std::int64_t max_rows = 1024;
  bool quiet = false;
  std::vector<std::string> peers = kDefaultPeers;
  bool no_peer = false;
  bool kokkos = false;  // also compare with the Kokkos reference
  bool require_gpu = false;  // an unavailable subject is a failure
  double watchdog_seconds = 0;  // a case's deadline (0: fuzz's, scaled to the case's size)
  // off until the GPU path is fixed (docs/kokkos-cuda.md: on the H100 every
  // device call faulted, 2026-11-25); auto is the intended default.
  EveryRowMode every_row = EveryRowMode::automatic;
};
int run_cases(const RunOptions& options);

/// Registers the external workers that `external`, $FLASHCHECK_EXTERNAL or a
/// parent process named, once; a worker that fails to start throws.
void ensure_external_registered();

/// Adds `list` to the app; the returned flag is set when it was chosen.
void add_list(CLI::App& app, int& exit_code);
void add_run(CLI::App& app, int& exit_code);
void add_bench_oracle(CLI::App& app, int& exit_code);
void add_bench(CLI::App& app, int& exit_code);
void add_fuzz(CLI::App& app, int& exit_code);
void add_replay(CLI::App& app, int& exit_code);
void add_report(CLI::App& app, int& exit_code);
void add_external(CLI::App& app, int& exit_code);

}  // namespace flashcheck::cli
