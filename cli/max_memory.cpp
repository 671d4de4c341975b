// --max-memory, shared by the commands that take problems (run, replay, fuzz,
// bench): the most memory a problem may be estimated to need before it is
// refused as bad input (core/problem.hpp, memory_limit_bytes).
#include <fmt/core.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "flashcheck/cli/commands.hpp"

namespace flashcheck::cli {

namespace {
constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;
}  // namespace

CLI::Option* add_max_memory(CLI::App& command) {
  const CLI::Validator positive_gib(
      [](std::string& text) -> std::string {
        double gib = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), gib);
        if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(gib) || gib <= 0)
          return fmt::format("'{}' is not a positive finite number of GiB", printable_excerpt(text));
        return {};
      },
      "");  // the type name says GIB
  return command
      .add_option_function<std::string>(
          "--max-memory",
          [](const std::string& text) {
            set_memory_limit_bytes(std::stod(text) * kBytesPerGiB);
            // Sweep workers are child processes: they read the limit from here.
            ::setenv("FLASHCHECK_MAX_MEMORY", text.c_str(), 1);
          },
          fmt::format("Refuse a problem estimated to need more than this many GiB of host memory (default: "
                      "half of this host's memory, {:.1f} GiB)",
                      physical_memory_bytes() / 2 / kBytesPerGiB))
      ->type_name("GIB")
      ->check(positive_gib);
}

}  // namespace flashcheck::cli
