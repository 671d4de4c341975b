// --require-gpu, shared by run, fuzz and bench: where a GPU must be used (a GPU
// machine's unattended checks), a subject that cannot run here is a failure,
// not a skip.
#include <fmt/core.h>

#include "cli/commands.hpp"
#include "core/gpu/device_info.hpp"

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

}  // namespace flashcheck::cli
