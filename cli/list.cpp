#include <fmt/core.h>

#include "cli/commands.hpp"
#include "core/gpu/device_info.hpp"
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
    const GpuInventory gpus = gpu_devices();
    if (gpus.devices.empty()) fmt::print("GPU: none ({}); GPU subjects are not tested here\n", gpus.note);
    for (const GpuDevice& gpu : gpus.devices)
      fmt::print("GPU {}: {} (sm_{}, {} SMs, {:.0f} GiB)\n", gpu.index, gpu.name, gpu.compute_capability,
                 gpu.multiprocessors, gpu.memory_gib);
    exit_code = kExitPass;
  });
}

}  // namespace flashcheck::cli
