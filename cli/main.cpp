// flashcheck: differential testing and numerical verification of attention kernels.
#include <fmt/core.h>

#include <exception>
#include <string_view>

#include "flashcheck/cli/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"flashcheck: differential testing and numerical verification of FlashAttention kernels"};
  int exit_code = flashcheck::cli::kExitPass;
  flashcheck::cli::add_commands(app, exit_code);
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
  } catch (...) {
    return flashcheck::cli::exit_code_of(std::current_exception());
  }
  return exit_code;
}
