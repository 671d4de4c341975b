// `flashcheck external`: registers external workers as subjects
// (docs/external-subjects.md), then runs one of the usual commands with them:
//   flashcheck external --cmd 'python3 external/torch_sdpa.py' --name torch-flash run -s torch-flash -p '...'
//   flashcheck external --config external/torch_sdpa.json fuzz --subjects torch-flash,hopper --minutes 10 --out OUT
#include <fmt/core.h>

#include <memory>

#include "cli/commands.hpp"
#include "external/subject.hpp"

namespace flashcheck::cli {

namespace {

/// What `external` was given; registered on first use (CLI11 stores every
/// option before it runs any command's callback).
struct ExternalOptions {
  std::string command, name, config;
  double watchdog_seconds = 0, startup_seconds = 300;
  bool registered = false;
};

ExternalOptions& external_options() {
  static ExternalOptions options;
  return options;
}

}  // namespace

void ensure_external_registered() {
  ExternalOptions& options = external_options();
  if (options.registered) return;
  options.registered = true;
  external::register_from_environment();  // a parent's registrations, $FLASHCHECK_EXTERNAL
  std::vector<external::WorkerSpec> specs;
  if (!options.config.empty()) specs = external::read_config(options.config);
  if (!options.command.empty()) {
    external::WorkerSpec spec;
    spec.name = options.name;
    spec.command = options.command;
    specs.push_back(spec);
  }
  for (external::WorkerSpec& spec : specs) {
    if (options.watchdog_seconds > 0) spec.watchdog_seconds = options.watchdog_seconds;
    spec.startup_seconds = options.startup_seconds;
  }
  if (!specs.empty()) external::register_workers(specs);
}

void add_external(CLI::App& app, int& exit_code) {
  ExternalOptions& options = external_options();
  CLI::App* command = app.add_subcommand(
      "external", "Check programs outside this binary (PyTorch, Triton, JAX workers) as subjects: registers each "
                  "worker (docs/external-subjects.md), then runs list, run, bench, fuzz, replay or report with them");
  auto* cmd = command->add_option("--cmd", options.command, "The worker's command line (no shell operators)");
  command->add_option("--name", options.name, "The subject name the worker serves")->needs(cmd);
  cmd->needs(command->get_option("--name"));
  command->add_option("--config", options.config,
                      "A JSON file listing workers: {\"workers\": [{\"name\", \"cmd\", \"cwd\", \"startup_s\", "
                      "\"watchdog_s\"}]}")
      ->check(CLI::ExistingFile);
  command->add_option("--watchdog", options.watchdog_seconds,
                      "Seconds a worker may take per case before it is killed (default: 30 s + 1 s per 1e8 "
                      "multiply-adds)")
      ->check(CLI::PositiveNumber);
  command->add_option("--startup-timeout", options.startup_seconds, "Seconds a worker may take to start and shake hands")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->require_subcommand(1);
  command->callback([command] {
    if (external_options().command.empty() && external_options().config.empty())
      throw CLI::ValidationError("external", "needs --cmd and --name, or --config");
    (void)command;
  });
  add_list(*command, exit_code);
  add_run(*command, exit_code);
  add_bench(*command, exit_code);
  add_fuzz(*command, exit_code);
  add_replay(*command, exit_code);
  add_report(*command, exit_code);
}

}  // namespace flashcheck::cli
