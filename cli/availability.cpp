// --require-gpu, shared by run, fuzz and bench: where a GPU must be used (a GPU
// machine's unattended checks), a subject that cannot run here is a failure,
// not a skip. --every-row, shared by run and fuzz: the same for the every-row
// reference (the Kokkos reference on the GPU).
#include <fmt/core.h>

#include <string>

#include "flashcheck/cli/commands.hpp"
#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

namespace flashcheck::cli {

CLI::Option* add_require_gpu(CLI::App& command, bool& flag) {
  return command.add_flag(
      "--require-gpu", flag,
      "Fail (exit 1) when a chosen subject is unavailable here (no GPU, no driver, too old a compute\n"
      "capability), or when no GPU is usable at all, with one line per subject saying why. Without it,\n"
      "unavailable subjects are reported UNAVAILABLE and skipped, never passed");
}

int check_required_gpu(const std::vector<Subject*>& subjects) {
  const GpuInventory gpus = gpu_devices();
  int unavailable = 0;
  for (const Subject* subject : subjects)
    if (auto why = unavailable_reason(subject->capabilities(), gpus)) {
      fmt::print(stderr, "flashcheck: --require-gpu: {} is unavailable here: {}\n", subject->name(), *why);
      ++unavailable;
    }
  if (unavailable == 0 && gpus.devices.empty()) {
    fmt::print(stderr, "flashcheck: --require-gpu: no GPU is usable here ({}), and none of the chosen subjects needs one\n",
               gpus.note);
    return kExitFail;
  }
  return unavailable > 0 ? kExitFail : kExitPass;
}

CLI::Option* add_every_row(CLI::App& command, EveryRowMode& mode) {
  const auto choose = [&mode](const std::string& word) {
    mode = word == "off" ? EveryRowMode::off : word == "on" ? EveryRowMode::on : EveryRowMode::automatic;
  };
  return command
      .add_option_function<std::string>(
          "--every-row", choose,
          "Where a case's rows were sampled (--rows), judge it again on every row with the Kokkos reference\n"
          "and baseline on the GPU (a CUDA Kokkos, docs/kokkos-cuda.md). auto: where that can run here, else\n"
          "the sampled verdict stands and the record says why (rows_basis, every_row_unavailable); on: it must\n"
          "run (exit 1, with one line, where it cannot); off: sampled rows only (default: auto). A case that\n"
          "fails on its sampled rows keeps that verdict: every row finds more, it never clears a failure")
      ->check(CLI::IsMember({"off", "auto", "on"}))
      ->default_str("auto");
}

EveryRow judge_every_row_option(EveryRowMode mode) {
  return mode == EveryRowMode::off ? EveryRow::off : EveryRow::device;
}

int check_every_row(EveryRowMode mode) {
  if (mode != EveryRowMode::on || kokkos_device_available()) return kExitPass;
  fmt::print(stderr,
             "flashcheck: --every-row on: the Kokkos reference cannot run on a GPU here: {} (docs/kokkos-cuda.md)\n",
             kokkos_description());
  return kExitFail;
}

}  // namespace flashcheck::cli
