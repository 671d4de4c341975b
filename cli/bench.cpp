// `flashcheck bench`: the options; the work is reports/bench.
#include <fmt/core.h>

#include "flashcheck/cli/commands.hpp"
#include "flashcheck/cli/progress.hpp"
#include "flashcheck/reports/bench.hpp"

namespace flashcheck::cli {

void add_bench(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<reports::BenchOptions>();
  auto names = std::make_shared<std::vector<std::string>>();
  auto lines = std::make_shared<std::vector<std::string>>();
  auto file = std::make_shared<std::string>();
  auto no_peer = std::make_shared<bool>(false);
  auto peer = std::make_shared<std::string>(kDefaultPeer);
  auto* command = app.add_subcommand(
      "bench", "Time subjects on problems: the machine's ceilings first (cuBLAS GEMM, device copy), then CUDA events "
               "around each launch, median/min/max, cuDNN alongside");
  add_subjects(*command, *names)->required();
  command->add_option("-p,--problem", *lines, "A problem line (repeatable; README: problem lines)");
  command->add_option("--problems", *file,
                      "A file of problem lines ('#' starts a comment), read after the --problem lines");
  command->add_option("--record", options->record_path,
                      "Append the ceilings and one JSON record per timing to this JSON Lines file (default: no "
                      "records)");
  command->add_option("--warmup", options->warmup, "Untimed launches before the timed ones, per subject and problem")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  command->add_option("--repeats", options->repeats, "Timed launches per subject and problem (median, min, max)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  command->add_option("--input-sets", options->input_sets,
                      "Copies of the inputs cycled through (0: enough to exceed twice the L2)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  add_peer(*command, *peer, *no_peer);
  auto require_gpu = std::make_shared<bool>(false);
  add_require_gpu(*command, *require_gpu);
  add_max_memory(*command);
  command->footer(
      "Example: flashcheck bench -s all --problems scripts/gpu-bench.problems --record bench.jsonl\n"
      "Exit codes: 0 every pair in a subject's domain was timed (subjects unavailable on this machine are\n"
      "printed UNAVAILABLE and skipped); 1 a timing failed, or with --require-gpu a subject is unavailable\n"
      "here; 2 bad input, or nothing could be timed (no GPU, a build without CUDA); 3 internal error.");
  command->callback([=, &exit_code] {
    options->problems = read_problems(*lines, *file);
    options->subjects = resolve_subjects(*names, &options->every_subject);
    if (*require_gpu)
      if (const int code = check_required_gpu(options->subjects); code != kExitPass) {
        exit_code = code;
        return;
      }
    options->peer = resolve_peer(*peer, *no_peer);
    // "problem i/n: subject" on stderr while each is timed (a terminal only).
    auto progress = std::make_shared<Progress>(true);
    options->progress = [progress, total = options->problems.size()](std::size_t problem, std::string_view subject) {
      if (subject.empty()) progress->clear();
      else progress->show("problem", problem, total, subject);
    };
    exit_code = reports::run_bench(*options);
    progress->clear();
    print_subject_stats();
  });
}

}  // namespace flashcheck::cli
