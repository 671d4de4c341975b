// `flashcheck fuzz`, its hidden worker, and `flashcheck replay`.
#include <unistd.h>

#include <fmt/core.h>

#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>

#include "flashcheck/cli/commands.hpp"
#include "flashcheck/fuzz/fuzz.hpp"

namespace flashcheck::cli {

namespace {

/// This binary, for the workers (they must register the same subjects).
std::string self_exe() {
  std::error_code error;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) throw std::runtime_error("fuzz: cannot find this executable through /proc/self/exe");
  return path.string();
}

}  // namespace

void add_fuzz(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<fuzz::FuzzOptions>();
  auto shard = std::make_shared<std::string>("0/1");
  auto names = std::make_shared<std::vector<std::string>>();  // empty: all
  CLI::App* command = app.add_subcommand("fuzz", "A sweep: generated cases of every subject against the oracles, in "
                                                 "worker processes, recorded and resumable");
  command->add_option("--out", options->out, "Output folder: records.jsonl, corpus/, fuzz.log; a re-run resumes")
      ->required();
  add_integer(*command, "--cases", options->cases, "Cases this shard runs (0: until --minutes is spent)", 0,
              std::int64_t{1} << 50);
  command->add_option("--backward-share", options->backward_share,
                      "Share of a backward subject's cases drawn as pass=bwd (0: forward only, 1: backward only); "
                      "resume with the same share")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  command->add_option("--minutes", options->minutes, "Time budget in minutes (0: until --cases have run)")
      ->check(finite_in(0, kMaxMinutes))
      ->capture_default_str();
  add_subjects(*command, *names)->default_str("all");
  add_integer(*command, "--seed", options->seed, "Seed of the case stream (the same seed and code give the same cases)",
              0, std::numeric_limits<std::uint64_t>::max());
  command->add_option("--shard", *shard, "i/n: this shard takes cases k with k % n == i")->capture_default_str();
  command->add_option("--watchdog", options->watchdog_seconds,
                      "Seconds per case before its worker is killed (0: scaled to the case's size)")
      ->check(finite_in(0, kMaxSeconds))
      ->capture_default_str();
  command->add_option("--gpus", options->gpus,
                      "Devices, one worker each (CUDA_VISIBLE_DEVICES), e.g. 0,1,2,3 (default: one worker, the "
                      "devices inherited)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1023));
  command->add_option("--shrink-runs", options->shrink_runs, "Most runs spent shrinking one failure (0: no shrinking)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  command->add_option("--sanitize", options->sanitize,
                      "Instead of the sweep: --sanitize-cases small cases per GPU subject, each under compute-sanitizer "
                      "with this tool (default: no sanitizer)")
      ->check(CLI::IsMember({"memcheck", "racecheck", "initcheck", "synccheck"}));
  command->add_option("--sanitize-cases", options->sanitize_cases, "Cases per subject in --sanitize mode")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  add_require_gpu(*command, options->require_gpu);
  add_max_memory(*command);
  auto every_row = std::make_shared<EveryRowMode>(EveryRowMode::automatic);
  add_every_row(*command, *every_row);
  command->footer(
      "Example: flashcheck fuzz -s all --minutes 10 --seed 20261121 --out build/sweep10\n"
      "Exit codes: 0 every case that ran passed (with mutants: every mutant caught and no subject failed);\n"
      "unsupported cases, and subjects unavailable on this machine (printed UNAVAILABLE), are counted apart,\n"
      "never passed; 1 a failure (a crash, a hang, a fault, a verdict), with --require-gpu a subject\n"
      "unavailable here, or with --every-row on no GPU reference here; 2 bad input, or no case ran (the\n"
      "budget ended first); 3 internal error.");
  command->callback([options, shard, names, every_row, &exit_code] {
    fuzz::parse_shard(*shard, options->shard, options->shards);
    bool every = false;
    options->subjects = resolve_subjects(names->empty() ? std::vector<std::string>{"all"} : *names, &every);
    if (!options->sanitize.empty() && every)  // `all` under a sanitizer: the GPU subjects
      std::erase_if(options->subjects, [](const Subject* s) { return !s->capabilities().needs_gpu; });
    if (options->require_gpu)
      if (const int code = check_required_gpu(options->subjects); code != kExitPass) {
        exit_code = code;
        return;
      }
    if (const int code = check_every_row(*every_row); code != kExitPass) {
      exit_code = code;
      return;
    }
    options->every_row = judge_every_row_option(*every_row);
    // A folder that cannot be made is the user's path, not an internal error.
    std::error_code error;
    std::filesystem::create_directories(options->out, error);
    if (error || !std::filesystem::is_directory(options->out))
      throw std::invalid_argument(fmt::format("--out '{}': cannot make the folder: {}", options->out,
                                              error ? error.message() : "a file is in the way"));
    options->worker_exe = self_exe();
    exit_code = fuzz::run_sweep(*options);
  });
  CLI::App* worker = app.add_subcommand("fuzz-worker", "");  // internal: the sweep's worker process
  worker->group("");
  auto worker_every_row = std::make_shared<std::string>("off");  // to_string(EveryRow) of the driver's choice
  worker->add_option("--every-row", *worker_every_row, "The driver's --every-row, as the judge's option")
      ->check(CLI::IsMember({"off", "device", "host"}))
      ->capture_default_str();
  worker->callback([worker_every_row, &exit_code] {
    ensure_external_registered();  // the driver's external subjects, from its environment
    const EveryRow every_row = *worker_every_row == "device" ? EveryRow::device
                               : *worker_every_row == "host" ? EveryRow::host
                                                             : EveryRow::off;
    exit_code = fuzz::run_worker(every_row);
  });
}

void add_replay(CLI::App& app, int& exit_code) {
  auto target = std::make_shared<std::string>();
  auto subjects = std::make_shared<std::vector<std::string>>();
  CLI::App* command = app.add_subcommand("replay", "Re-run a corpus file (OUT/corpus/<subject>.problems) or one problem line");
  command->add_option("target", *target, "A corpus file, or a problem line (then -s/--subjects)")->required();
  add_subjects(*command, *subjects)->description(std::string(kSubjectsHelp) + "\n(default: a corpus file's name)");
  add_max_memory(*command);
  command->footer(fmt::format("Example: flashcheck replay build/sweep10/corpus/cpu-plain.problems\n"
                              "         flashcheck replay 'b=1 hq=2 sq=5 skv=6 d=8 dtype=f16' -s cpu-plain\n{}",
                              kRunExitCodes));
  command->callback([target, subjects, &exit_code] {
    RunOptions options;
    const std::filesystem::path path(*target);
    std::error_code error;
    const auto status = std::filesystem::status(path, error);
    if (std::filesystem::is_regular_file(status)) {
      options.problems_file = *target;
      options.subjects = subjects->empty() ? std::vector<std::string>{path.stem().string()} : *subjects;
    } else if (std::filesystem::is_directory(status)) {
      throw std::invalid_argument(fmt::format("replay: '{}' is a folder; give a corpus file (OUT/corpus/<subject>"
                                              ".problems) or a problem line",
                                              *target));
    } else if (target->find('=') == std::string::npos) {  // every problem line has key=value fields
      throw std::invalid_argument(fmt::format("replay: '{}': no such file (and not a problem line)", *target));
    } else {
      if (subjects->empty()) throw std::invalid_argument("replay: a problem line needs -s/--subjects");
      options.problem_lines = {*target};
      options.subjects = *subjects;
    }
    exit_code = run_cases(options);
  });
}

}  // namespace flashcheck::cli
