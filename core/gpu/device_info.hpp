// What CUDA devices this process can use. Compiled only when CUDA is enabled;
// without it, gpu_devices() reports that GPU support was not built.
#pragma once

#include <string>
#include <vector>

namespace flashcheck {

struct GpuDevice {
  int index = 0;
  std::string name;
  int compute_capability = 0;  // major * 10 + minor
  int multiprocessors = 0;
  double memory_gib = 0;
};

struct GpuInventory {
  bool built_with_cuda = false;
  std::vector<GpuDevice> devices;
  std::string note;  // why there are none, when there are none
};

GpuInventory gpu_devices();

}  // namespace flashcheck
