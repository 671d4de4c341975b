// bench: times subjects on problems, CUDA events around the launch alone,
// after warm-up, cycling through several copies of the inputs, median of N.
#include <fmt/core.h>

#include <fstream>
#include <memory>
#include <vector>

#include "cli/commands.hpp"
#include "core/record.hpp"
#include "core/subject.hpp"
#include "core/values.hpp"
#ifdef FLASHCHECK_HAVE_CUDA
#include "core/gpu/gpu_subject.hpp"
#endif

namespace flashcheck::cli {
namespace {

struct BenchOptions {
  std::vector<std::string> subjects;
  std::vector<std::string> problem_lines;
  std::string problems_file;
  std::string record_path;
  int warmup = 3, repeats = 10, input_sets = 3;
};

int bench(const BenchOptions& options) {
  const std::vector<Problem> problems = read_problems(options.problem_lines, options.problems_file);
  bool every_subject = false;
  const std::vector<Subject*> subjects = resolve_subjects(options.subjects, &every_subject);
  std::unique_ptr<RecordWriter> records;
  if (!options.record_path.empty()) records = std::make_unique<RecordWriter>(options.record_path);
  fmt::print("{:<20} {:>10} {:>9} {:>8}  {}\n", "subject", "median ms", "TFLOP/s", "GB/s", "problem");
  int timed = 0;
  for (const Problem& p : problems) {
    const Inputs inputs = generate_inputs(p);
    for (Subject* subject : subjects) {
      std::string outcome;
      double ms = 0;
#ifdef FLASHCHECK_HAVE_CUDA
      if (auto* gpu_subject = dynamic_cast<gpu::GpuSubject*>(subject)) {
        try {
          ms = gpu_subject->time_ms(p, inputs, options.warmup, options.repeats, options.input_sets);
        } catch (const std::exception& error) {
          outcome = error.what();
        }
      } else {
        outcome = "not timed: a CPU subject";
      }
#else
      outcome = "not timed: built without CUDA";
#endif
      if (!outcome.empty()) {
        if (!subject->capabilities().needs_gpu && every_subject) continue;  // `all`: CPU subjects are not timed
        fmt::print("{:<20} {:>10} {:>9} {:>8}  {} ({})\n", subject->name(), "-", "-", "-", to_line(p), outcome);
        continue;
      }
      const double tflops = attention_flops(p) / (ms * 1e-3) / 1e12;
      const double gbps = p.storage_bytes() / (ms * 1e-3) / 1e9;  // every tensor moved once
      fmt::print("{:<20} {:>10.3f} {:>9.2f} {:>8.0f}  {}\n", subject->name(), ms, tflops, gbps, to_line(p));
      ++timed;
      if (records)
        records->write({{"schema", kRecordSchema}, {"kind", "bench"}, {"subject", subject->name()},
                        {"problem", to_line(p)}, {"median_ms", ms}, {"tflops", tflops},
                        {"flops", attention_flops(p)}, {"bytes", p.storage_bytes()}, {"gbps", gbps}, {"repeats", options.repeats}, {"warmup", options.warmup},
                        {"input_sets", options.input_sets}});
    }
  }
  return timed > 0 ? kExitPass : kExitBadInput;
}

}  // namespace

void add_bench(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<BenchOptions>();
  auto* command = app.add_subcommand("bench", "Time subjects on problems (CUDA events, median of repetitions)");
  command->add_option("-s,--subject", options->subjects, "Subject name (repeatable), or 'all'")->required();
  command->add_option("-p,--problem", options->problem_lines, "A problem line (repeatable)");
  command->add_option("--problems", options->problems_file, "A file of problem lines");
  command->add_option("--record", options->record_path, "Append one JSON record per timing");
  command->add_option("--warmup", options->warmup)->check(CLI::Range(0, 1000))->capture_default_str();
  command->add_option("--repeats", options->repeats)->check(CLI::Range(1, 10000))->capture_default_str();
  command->add_option("--input-sets", options->input_sets, "Copies of the inputs cycled through (beat the caches)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  command->callback([options, &exit_code] { exit_code = bench(*options); });
}

}  // namespace flashcheck::cli
