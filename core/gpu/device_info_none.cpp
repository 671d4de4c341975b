// gpu_devices() for builds without CUDA.
#include "flashcheck/core/gpu/device_info.hpp"

namespace flashcheck {

GpuInventory gpu_devices() {
  GpuInventory inventory;
  inventory.note = "built without CUDA (FLASHCHECK_CUDA=OFF or no toolkit found)";
  return inventory;
}

}  // namespace flashcheck
