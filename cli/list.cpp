#include <fmt/core.h>

#include "cli/commands.hpp"
#include "core/gpu/device_info.hpp"
#include "core/subject.hpp"

namespace flashcheck::cli {

void add_list(CLI::App& app, int& exit_code) {
  auto* command = app.add_subcommand("list", "Print the registered subjects and their capability domains");
  command->callback([&exit_code] {
    ensure_external_registered();
    const auto& subjects = Registry::instance().subjects();
    const GpuInventory gpus = gpu_devices();
    fmt::print("{} subject(s):\n", subjects.size());
    for (Subject* subject : subjects) {
      fmt::print("  {:<20} {}\n", subject->name(), subject->description());
      fmt::print("  {:<20} {}\n", "", describe(subject->capabilities()));
      // With a GPU present, say which subjects it cannot run (too old for them).
      if (!gpus.devices.empty())
        if (auto why = unavailable_reason(subject->capabilities(), gpus))
          fmt::print("  {:<20} UNAVAILABLE here: {}\n", "", *why);
    }
    // flashcheck-testing links mutants and fixtures too.
    const auto print_names = [](std::string_view what, const std::vector<Subject*>& list) {
      if (list.empty()) return;
      fmt::print("{} {}(s):\n", list.size(), what);
      for (Subject* subject : list) fmt::print("  {:<28} {}\n", subject->name(), subject->description());
    };
    // Smoke tests exercise the pipeline but cannot fail on accuracy: listed
    // apart, marked, and never in `all`.
    const auto& smoke = Registry::instance().smoke_tests();
    if (!smoke.empty())
      fmt::print("{} smoke test(s), not in 'all' (judged against themselves: they check the pipeline, not accuracy):\n",
                 smoke.size());
    for (Subject* subject : smoke) {
      fmt::print("  {:<20} [smoke] {}\n", subject->name(), subject->description());
      fmt::print("  {:<20} {}\n", "", describe(subject->capabilities()));
    }
    print_names("mutant", Registry::instance().mutants());
    print_names("fixture", Registry::instance().fixtures());
    if (gpus.devices.empty()) fmt::print("GPU: none ({}); GPU subjects are unavailable here (not run, not tested)\n", gpus.note);
    for (const GpuDevice& gpu : gpus.devices)
      fmt::print("GPU {}: {} (sm_{}, {} SMs, {:.0f} GiB)\n", gpu.index, gpu.name, gpu.compute_capability,
                 gpu.multiprocessors, gpu.memory_gib);
    exit_code = kExitPass;
  });
}

}  // namespace flashcheck::cli
