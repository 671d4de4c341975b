// `flashcheck external`: registers external workers as subjects
// (docs/external-subjects.md), then runs one of the usual commands with them:
//   flashcheck external --cmd 'python3 external/torch_sdpa.py' --name torch-flash run -s torch-flash -p '...'
//   flashcheck external --config external/torch_sdpa.json fuzz --subjects torch-flash,hopper --minutes 10 --out OUT
#include <fmt/core.h>

#include <memory>

#include "flashcheck/cli/commands.hpp"
#include "flashcheck/external/subject.hpp"

namespace flashcheck::cli {

namespace {

/// What `external` was given; registered on first use (CLI11 stores every
/// option before it runs any command's callback).
struct ExternalOptions {
  std::string command, name, config;
  double watchdog_seconds = 0, startup_seconds = 0;  // 0: the config's, else the default
  bool used = false;  // `external` was on the command line
  bool registered = false;
};

ExternalOptions& external_options() {
  static ExternalOptions options;
  return options;
}

void register_named_workers(const ExternalOptions& options) {
  external::register_from_environment();  // a parent's registrations, $FLASHCHECK_EXTERNAL
  std::vector<external::WorkerSpec> specs;
  if (!options.config.empty()) specs = external::read_config(options.config);
  if (!options.command.empty()) {
    external::WorkerSpec spec;
    spec.name = options.name;
    spec.command = options.command;
    specs.push_back(spec);
  }
  for (external::WorkerSpec& spec : specs) {  // the command line's limits override the config's
    if (options.watchdog_seconds > 0) spec.watchdog_seconds = options.watchdog_seconds;
    if (options.startup_seconds > 0) spec.startup_seconds = options.startup_seconds;
  }
  if (!specs.empty()) external::register_workers(specs);
}

}  // namespace

void ensure_external_registered() {
  ExternalOptions& options = external_options();
  if (options.registered) return;
  options.registered = true;
  if (options.used && options.command.empty() && options.config.empty())
    throw CLI::ValidationError("external", "needs --cmd and --name, or --config");
  // A worker that cannot start, a config that does not parse, a name that is
  // taken: the user's input, not an internal error.
  try {
    register_named_workers(options);
  } catch (const std::runtime_error& error) {
    throw std::invalid_argument(error.what());
  }
}

void add_external(CLI::App& app, int& exit_code) {
  ExternalOptions& options = external_options();
  CLI::App* command = app.add_subcommand(
      "external", "Check programs outside this binary (PyTorch, Triton, JAX workers) as subjects: registers each "
                  "worker (docs/external-subjects.md), then runs list, run, bench, fuzz, replay or report with them");
  auto* cmd = command->add_option("--cmd", options.command, "The worker's command line (no shell operators; needs --name)");
  command->add_option("--name", options.name, "The subject name the worker serves (no spaces or commas)")->needs(cmd);
  cmd->needs(command->get_option("--name"));
  command->add_option("--config", options.config,
                      "A JSON file listing workers: {\"workers\": [{\"name\", \"cmd\", \"cwd\", \"startup_s\", "
                      "\"watchdog_s\"}]}")
      ->check(CLI::ExistingFile);
  command->add_option("--watchdog", options.watchdog_seconds,
                      "Seconds a worker may take per case before it is killed (default: 30 s + 1 s per 1e8 "
                      "multiply-adds)")
      ->check(finite_in(0, kMaxSeconds, true));
  command->add_option("--startup-timeout", options.startup_seconds,
                      "Seconds a worker may take to start and shake hands (default: the config's, else 300)")
      ->check(finite_in(0, kMaxSeconds, true));
  command->footer(fmt::format(
      "Example: flashcheck external --cmd 'python3 external/torch_sdpa.py' --name torch-flash run -s torch-flash \\\n"
      "           -p 'b=1 hq=8 sq=512 skv=512 d=64 dtype=bf16'\n"
      "The command after it (list, run, bench, fuzz, replay, report) gives the exit code.\n{}",
      kExitCodesLine));
  command->require_subcommand(1);
  // Checked when the workers are registered, before the command after
  // `external` does anything (CLI11 runs a parent's callback after its
  // subcommand's).
  command->preparse_callback([](std::size_t) { external_options().used = true; });
  add_list(*command, exit_code);
  add_run(*command, exit_code);
  add_bench(*command, exit_code);
  add_fuzz(*command, exit_code);
  add_replay(*command, exit_code);
  add_report(*command, exit_code);
}

}  // namespace flashcheck::cli
