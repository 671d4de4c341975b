// flashcheck: differential testing and numerical verification of attention kernels.
#include <fmt/core.h>

#include <exception>
#include <string_view>

#include "cli/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"flashcheck: differential testing and numerical verification of FlashAttention kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "flashcheck 0.1.0");
  int exit_code = flashcheck::cli::kExitPass;
  flashcheck::cli::add_list(app, exit_code);
  flashcheck::cli::add_run(app, exit_code);
  flashcheck::cli::add_bench_oracle(app, exit_code);
  flashcheck::cli::add_bench(app, exit_code);
  flashcheck::cli::add_fuzz(app, exit_code);
  flashcheck::cli::add_replay(app, exit_code);
  flashcheck::cli::add_report(app, exit_code);
  flashcheck::cli::add_external(app, exit_code);
  // CLI11 reports an unknown command only as "a subcommand is required": name it.
  const auto is_command = [&app](std::string_view name) {
    for (const CLI::App* command : app.get_subcommands({}))
      if (command->get_name() == name) return true;
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !is_command(argv[1])) {
    fmt::print(stderr, "flashcheck: unknown command '{}' (commands: list, run, bench, bench-oracle, fuzz, replay, report, external; see flashcheck --help)\n",
               argv[1]);
    return flashcheck::cli::kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    fmt::print(stderr, "flashcheck: {} (see flashcheck --help)\n", error.what());
    return flashcheck::cli::kExitBadInput;
  } catch (const std::exception& error) {
    fmt::print(stderr, "flashcheck: {}\n", error.what());
    return flashcheck::cli::kExitBadInput;
  }
  return exit_code;
}
