// CTest resource allocation for GPU tests. With
//   ctest -L gpu --resource-spec-file docs/ctest-gpus.json -j N
// every `gpu` test of the subject suite asks for one slot of one GPU
// (RESOURCE_GROUPS gpus:1), and CTest tells the test which one through
// CTEST_RESOURCE_GROUP_0_GPUS="id:<id>,slots:1". The test then sees only that
// device, so N tests spread over the box's GPUs. Without a spec file CTest
// sets nothing and the tests use the default device.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace flashcheck {

/// The device id in a CTest allocation such as "id:3,slots:1", or nothing.
inline std::optional<std::string> ctest_gpu_id(std::string_view allocation) {
  const std::size_t at = allocation.find("id:");
  if (at == std::string_view::npos) return std::nullopt;
  const std::size_t begin = at + 3, end = allocation.find(',', begin);
  const std::string id(allocation.substr(begin, end == std::string_view::npos ? end : end - begin));
  if (id.empty()) return std::nullopt;
  return id;
}

/// Restricts this process to the GPU CTest allocated to it, if any (call
/// before the first CUDA call).
inline void use_ctest_gpu() {
  const char* allocation = std::getenv("CTEST_RESOURCE_GROUP_0_GPUS");
  if (!allocation) return;
  if (const auto id = ctest_gpu_id(allocation)) setenv("CUDA_VISIBLE_DEVICES", id->c_str(), 1);
}

}  // namespace flashcheck
