// What CUDA devices this process can use, and whether a subject can run on
// them. gpu_devices() is compiled with CUDA (device_info.cpp) or as a stub
// that reports GPU support was not built (device_info_none.cpp); the decision,
// unavailable_reason, is the same code in both builds.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "flashcheck/core/subject.hpp"

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
  int current = 0;   // the index of the device this process runs on (cudaGetDevice)
  std::string note;  // why there are none, when there are none
};

GpuInventory gpu_devices();

/// Why a subject with this domain cannot run on the machine the inventory
/// describes, or nullopt when it can (always, for a CPU subject): GPU support
/// not built, no usable device or driver (the inventory's note says which),
/// or a device older than Capabilities::min_compute_capability. A pure
/// function of its arguments, so that a made-up inventory tests it.
std::optional<std::string> unavailable_reason(const Capabilities& caps, const GpuInventory& gpus);

/// unavailable_reason on this machine (gpu_devices(), queried once per process).
std::optional<std::string> unavailable_reason(const Capabilities& caps);

}  // namespace flashcheck
