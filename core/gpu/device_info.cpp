#include <cuda_runtime.h>

#include "flashcheck/core/gpu/device_info.hpp"

namespace flashcheck {

GpuInventory gpu_devices() {
  GpuInventory inventory;
  inventory.built_with_cuda = true;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    inventory.note = cudaGetErrorString(status);
    cudaGetLastError();  // clear the non-sticky error
    return inventory;
  }
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) continue;
    inventory.devices.push_back({index, properties.name, properties.major * 10 + properties.minor,
                                 properties.multiProcessorCount,
                                 static_cast<double>(properties.totalGlobalMem) / (1u << 30)});
  }
  if (inventory.devices.empty()) inventory.note = "no CUDA device";
  if (cudaGetDevice(&inventory.current) != cudaSuccess) cudaGetLastError();
  return inventory;
}

}  // namespace flashcheck
