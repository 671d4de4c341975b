#include <fmt/core.h>

#include "cli/commands.hpp"
#include "core/subject.hpp"

namespace flashcheck::cli {

void add_list(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand("list", "Print the registered subjects and their capability domains");
  command->callback([&exit_code] {
    const auto& subjects = Registry::instance().subjects();
    fmt::print("{} subject(s):\n", subjects.size());
    for (Subject* subject : subjects) {
      fmt::print("  {:<20} {}\n", subject->name(), subject->description());
      fmt::print("  {:<20} {}\n", "", describe(subject->capabilities()));
    }
    exit_code = kExitPass;
  });
}

}  // namespace flashcheck::cli
