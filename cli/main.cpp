// flashcheck: differential testing and numerical verification of attention kernels.
#include <fmt/core.h>

#include <exception>

#include "cli/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"flashcheck: differential testing and numerical verification of FlashAttention kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "flashcheck 0.1.0");
  int exit_code = flashcheck::cli::kExitPass;
  flashcheck::cli::add_list(app, exit_code);
  flashcheck::cli::add_run(app, exit_code);
  flashcheck::cli::add_bench_oracle(app, exit_code);
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
