// `flashcheck fuzz`, its hidden worker, and `flashcheck replay`.
#include <unistd.h>

#include <fmt/core.h>

#include <filesystem>
#include <memory>

#include "cli/commands.hpp"
#include "fuzz/fuzz.hpp"

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
  auto names = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"all"});
  CLI::App* command = app.add_subcommand("fuzz", "A sweep: generated cases of every subject against the oracles, in "
                                                 "worker processes, recorded and resumable");
  command->add_option("--out", options->out, "Output folder: records.jsonl, corpus/, fuzz.log; a re-run resumes")
      ->required();
  command->add_option("--cases", options->cases, "Cases this shard runs")->check(CLI::NonNegativeNumber);
  command->add_option("--minutes", options->minutes, "Time budget")->check(CLI::NonNegativeNumber);
  command->add_option("--subjects", *names, "Subjects: names, 'all' or 'mutants'")->delimiter(',');
  command->add_option("--seed", options->seed, "Seed of the case stream (the same seed and code give the same cases)");
  command->add_option("--shard", *shard, "i/n: this shard takes cases k with k % n == i");
  command->add_option("--watchdog", options->watchdog_seconds, "Seconds per case (default: scaled to its size)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--gpus", options->gpus, "Devices, one worker each (CUDA_VISIBLE_DEVICES), e.g. 0,1,2,3")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  command->add_option("--shrink-runs", options->shrink_runs, "Most runs spent shrinking one failure (0: no shrinking)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--sanitize", options->sanitize,
                      "Instead of the sweep: --sanitize-cases small cases per GPU subject, each under compute-sanitizer "
                      "with this tool")
      ->check(CLI::IsMember({"memcheck", "racecheck", "initcheck", "synccheck"}));
  command->add_option("--sanitize-cases", options->sanitize_cases, "Cases per subject in --sanitize mode")
      ->check(CLI::PositiveNumber);
  add_require_gpu(*command, options->require_gpu);
  add_max_memory(*command);
  auto every_row = std::make_shared<EveryRowMode>(EveryRowMode::off);  // docs/kokkos-cuda.md: the GPU path faults
  add_every_row(*command, *every_row);
  command->footer(
      "Exit codes: 0 every case that ran passed (with mutants: every mutant caught and no subject failed);\n"
      "unsupported cases, and subjects unavailable on this machine (printed UNAVAILABLE), are counted apart,\n"
      "never passed; 1 a failure (a crash, a hang, a fault, a verdict), with --require-gpu a subject\n"
      "unavailable here, or with --every-row on no GPU reference here; 2 bad input.");
  command->callback([options, shard, names, every_row, &exit_code] {
    fuzz::parse_shard(*shard, options->shard, options->shards);
    bool every = false;
    options->subjects = resolve_subjects(*names, &every);
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
    options->worker_exe = self_exe();
    exit_code = fuzz::run_sweep(*options);
  });
  CLI::App* worker = app.add_subcommand("fuzz-worker", "");  // internal: the sweep's worker process
  worker->group("");
  auto worker_every_row = std::make_shared<std::string>("off");  // to_string(EveryRow) of the driver's choice
  worker->add_option("--every-row", *worker_every_row)->check(CLI::IsMember({"off", "device", "host"}));
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
  auto subject = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand("replay", "Re-run a corpus file (OUT/corpus/<subject>.problems) or one problem line");
  command->add_option("target", *target, "A corpus file, or a problem line (then --subject)")->required();
  command->add_option("-s,--subject", *subject, "The subject (default: a corpus file's name)");
  add_max_memory(*command);
  command->callback([target, subject, &exit_code] {
    RunOptions options;
    const std::filesystem::path path(*target);
    if (std::filesystem::is_regular_file(path)) {
      options.problems_file = *target;
      options.subjects = {subject->empty() ? path.stem().string() : *subject};
    } else {
      if (subject->empty()) throw std::invalid_argument("replay: a problem line needs --subject");
      options.problem_lines = {*target};
      options.subjects = {*subject};
    }
    exit_code = run_cases(options);
  });
}

}  // namespace flashcheck::cli
