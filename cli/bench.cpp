// `flashcheck bench`: the options; the work is reports/bench.
#include <fmt/core.h>

#include <limits>
#include <stdexcept>

#include "flashcheck/cli/commands.hpp"
#include "flashcheck/cli/progress.hpp"
#include "flashcheck/cli/watchdog.hpp"
#include "flashcheck/fuzz/sweep_parts.hpp"
#include "flashcheck/reports/bench.hpp"

namespace flashcheck::cli {

void add_bench(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<reports::BenchOptions>();
  auto names = std::make_shared<std::vector<std::string>>();
  auto lines = std::make_shared<std::vector<std::string>>();
  auto file = std::make_shared<std::string>();
  auto no_peer = std::make_shared<bool>(false);
  auto peer = std::make_shared<std::vector<std::string>>(kDefaultPeers);
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
  auto watchdog_seconds = std::make_shared<double>(0);
  command->add_option("--watchdog", *watchdog_seconds,
                      "Seconds per timing (a subject on a problem) before flashcheck gives it up as a hang and\n"
                      "exits 1 (0: scaled to the problem's size, as fuzz's: 60 s + 1 s per 1e7 multiply-adds)")
      ->check(finite_in(0, kMaxSeconds))
      ->capture_default_str();
  auto splits = std::make_shared<int>(0);
  command->add_option("--splits", *splits,
                      "Key splits for the split-KV subjects (splitkv) instead of their own rule's count, e.g. to\n"
                      "time a rule against a fixed count in one run; every chosen subject must take a split count")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  add_max_memory(*command);
  command->footer(
      "Example: flashcheck bench -s all --problems scripts/gpu-bench.problems --record bench.jsonl\n"
      "Exit codes: 0 every pair in a subject's domain was timed (subjects unavailable on this machine are\n"
      "printed UNAVAILABLE and skipped); 1 a timing failed, or with --require-gpu a subject is unavailable\n"
      "here, or a timing gave no answer within --watchdog (a hang: the run stops there); 2 bad input, or\n"
      "nothing could be timed (no GPU, a build without CUDA); 3 internal error.");
  command->callback([=, &exit_code] {
    options->problems = read_problems(*lines, *file);
    options->subjects = resolve_subjects(*names, &options->every_subject);
    if (*splits > 0)
      for (Subject* subject : options->subjects)
        if (!subject->set_split_count(*splits))
          throw std::invalid_argument(fmt::format(
              "--splits {}: subject {} takes no split count, or not that many", *splits, subject->name()));
    if (*require_gpu)
      if (const int code = check_required_gpu(options->subjects); code != kExitPass) {
        exit_code = code;
        return;
      }
    options->peers = resolve_peers(*peer, *no_peer);
    // "problem i/n: subject" on stderr while each is timed (a terminal only),
    // and the timing's deadline: a subject that hangs ends the run (exit 1).
    auto progress = std::make_shared<Progress>(true);
    auto watchdog = std::make_shared<CaseWatchdog>();
    const std::vector<Problem>* problems = &options->problems;
    options->progress = [progress, watchdog, problems, seconds = *watchdog_seconds](std::size_t problem,
                                                                                  std::string_view subject) {
      if (subject.empty()) {
        watchdog->disarm();
        progress->clear();
        return;
      }
      progress->show("problem", problem, problems->size(), subject);
      const Problem& p = (*problems)[problem];
      watchdog->arm(fuzz::detail::watchdog_for(p, seconds), fmt::format("{} on '{}'", subject, to_line(p)), {});
    };
    exit_code = reports::run_bench(*options);
    options->progress = nullptr;  // the watchdog's thread ends with its last owner, here
    progress->clear();
    print_subject_stats();
  });
}

}  // namespace flashcheck::cli
