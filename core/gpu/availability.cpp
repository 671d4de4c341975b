// unavailable_reason: whether a subject can run on a machine, from the
// machine's GPU inventory. The same code with and without CUDA.
#include <fmt/format.h>

#include <algorithm>

#include "flashcheck/core/gpu/device_info.hpp"

namespace flashcheck {

std::optional<std::string> unavailable_reason(const Capabilities& caps, const GpuInventory& gpus) {
  if (!caps.needs_gpu) return std::nullopt;
  if (!gpus.built_with_cuda) return fmt::format("needs a GPU; {}", gpus.note);
  if (gpus.devices.empty())
    return fmt::format("needs a GPU; none is usable here ({})", gpus.note.empty() ? "no CUDA device" : gpus.note);
  const auto device = std::find_if(gpus.devices.begin(), gpus.devices.end(),
                                   [&](const GpuDevice& d) { return d.index == gpus.current; });
  const GpuDevice& used = device != gpus.devices.end() ? *device : gpus.devices.front();
  if (used.compute_capability < caps.min_compute_capability)
    return fmt::format("needs compute capability sm_{} or newer; GPU {} ({}) is sm_{}", caps.min_compute_capability,
                       used.index, used.name, used.compute_capability);
  return std::nullopt;
}

std::optional<std::string> unavailable_reason(const Capabilities& caps) {
  static const GpuInventory gpus = gpu_devices();  // devices do not come and go within a process
  return unavailable_reason(caps, gpus);
}

}  // namespace flashcheck
