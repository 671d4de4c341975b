// The command line as one app (main and the option test build the same one),
// and the exit code of an error: bad input is 2, anything unexpected is 3.
#include <fmt/core.h>

#include <exception>
#include <stdexcept>
#include <string_view>

#include "flashcheck/cli/commands.hpp"

namespace flashcheck::cli {

void add_commands(CLI::App& app, int& exit_code) {
  app.require_subcommand(1);
  app.set_version_flag("--version", "flashcheck 0.1.0");
  add_list(app, exit_code);
  add_run(app, exit_code);
  add_bench_oracle(app, exit_code);
  add_bench(app, exit_code);
  add_fuzz(app, exit_code);
  add_replay(app, exit_code);
  add_report(app, exit_code);
  add_external(app, exit_code);
  // After the commands: CLI11 copies a parent's footer into the subcommands it adds.
  app.footer(fmt::format("Example: flashcheck run -s cpu-plain -p 'b=1 hq=2 sq=64 skv=64 d=64 dtype=bf16'\n{}",
                         kExitCodesLine));
}

int exit_code_of(std::exception_ptr error) {
  // One line each: a message that spans lines is joined.
  const auto one_line = [](std::string text) {
    for (char& c : text)
      if (c == '\n' || c == '\r') c = ' ';
    return text;
  };
  try {
    std::rethrow_exception(error);
  } catch (const CLI::Error& bad) {  // a parse error, or a check of the options in a command
    fmt::print(stderr, "flashcheck: {} (see flashcheck --help)\n", one_line(bad.what()));
    return kExitBadInput;
  } catch (const BadInput& bad) {  // a problem line, a file of them, a subject's domain
    fmt::print(stderr, "flashcheck: {}\n", one_line(bad.what()));
    return kExitBadInput;
  } catch (const std::invalid_argument& bad) {  // the commands' own checks of what they were given
    fmt::print(stderr, "flashcheck: {}\n", one_line(bad.what()));
    return kExitBadInput;
  } catch (const std::exception& unexpected) {
    fmt::print(stderr, "flashcheck: internal error: {}\n", one_line(unexpected.what()));
    return kExitInternalError;
  } catch (...) {
    fmt::print(stderr, "flashcheck: internal error: an exception of unknown type\n");
    return kExitInternalError;
  }
}

}  // namespace flashcheck::cli
