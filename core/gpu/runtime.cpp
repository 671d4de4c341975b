#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "flashcheck/core/gpu/runtime.hpp"

namespace flashcheck::gpu {
namespace {

std::atomic<bool> poisoned{false};
// The fault that poisoned the context, named by every refusal after it (a
// property's shrinking then reports it, not just "an earlier fault").
std::mutex first_fault_mutex;
std::string first_fault;

}  // namespace

bool is_sticky(cudaError_t code) {
  switch (code) {
    case cudaErrorIllegalAddress:
    case cudaErrorMisalignedAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

void check(cudaError_t status, const char* call, const CallSite& site) {
  if (status == cudaSuccess) return;
  const bool sticky = is_sticky(status);
  std::string message =
      fmt::format("{} failed: {} ({}){} in kernel {} on problem '{}'", call, cudaGetErrorString(status),
                  cudaGetErrorName(status), sticky ? " [sticky: the CUDA context is unusable]" : "", site.kernel,
                  site.problem);
  if (sticky) {
    const std::lock_guard lock(first_fault_mutex);
    if (!poisoned.exchange(true)) first_fault = message;
  } else {
    cudaGetLastError();  // clear a non-sticky error so it does not resurface later
  }
  throw CudaError(status, message, sticky);
}

void check_launch(const char* kernel, const CallSite& site) {
  check(cudaGetLastError(), fmt::format("launch of {}", kernel).c_str(), site);
}

bool context_poisoned() { return poisoned; }

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (why) *why = fmt::format("no usable CUDA device ({})", cudaGetErrorString(status));
    cudaGetLastError();
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  if (poisoned) {
    if (why) {
      const std::lock_guard lock(first_fault_mutex);
      *why = "the CUDA context was poisoned by an earlier fault: " + first_fault;
    }
    return false;
  }
  return true;
}

int device_compute_capability() {
  if (!device_available()) return 0;
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes, const CallSite& site) : bytes_(bytes) {
  if (bytes > 0) check(cudaMalloc(&pointer_, bytes), "cudaMalloc", site);
}

DeviceBuffer::~DeviceBuffer() {
  if (pointer_ && !poisoned) cudaFree(pointer_);
}

Stream::Stream(const CallSite& site) { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate", site); }

Stream::~Stream() {
  if (stream_ && !poisoned) cudaStreamDestroy(stream_);
}

Event::Event(const CallSite& site) { check(cudaEventCreate(&event_), "cudaEventCreate", site); }

Event::~Event() {
  if (event_ && !poisoned) cudaEventDestroy(event_);
}

GuardedBuffer::GuardedBuffer(std::int64_t count, int element_bytes, const CallSite& site)
    : storage_(static_cast<std::size_t>((count + 2 * kGuardElements) * element_bytes), site),
      count_(count),
      element_bytes_(element_bytes) {}

void GuardedBuffer::poison(cudaStream_t stream, const CallSite& site) {
  fill_words(storage_.get(), count_ + 2 * kGuardElements, element_bytes_,
             element_bytes_ == 4 ? kPoison32 : kPoison16, stream);
  check_launch("flashcheck::gpu::fill_words", site);
}

std::int64_t GuardedBuffer::touched_guard_elements(const CallSite& site, std::int64_t* first) const {
  std::int64_t touched = 0;
  *first = 0;
  const std::size_t band_bytes = static_cast<std::size_t>(kGuardElements * element_bytes_);
  std::vector<unsigned char> band(band_bytes);
  for (int side = 0; side < 2; ++side) {
    const char* source = static_cast<const char*>(storage_.get()) +
                         (side == 0 ? 0 : static_cast<std::size_t>((kGuardElements + count_) * element_bytes_));
    check(cudaMemcpy(band.data(), source, band_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (guard band)", site);
    for (std::int64_t i = 0; i < kGuardElements; ++i) {
      bool intact;
      if (element_bytes_ == 4) {
        std::uint32_t word;
        std::memcpy(&word, band.data() + i * 4, 4);
        intact = word == kPoison32;
      } else {
        std::uint16_t word;
        std::memcpy(&word, band.data() + i * 2, 2);
        intact = word == kPoison16;
      }
      if (intact) continue;
      if (touched == 0) *first = side == 0 ? i - kGuardElements : count_ + i;
      ++touched;
    }
  }
  return touched;
}

void GuardedBuffer::download(void* host, const CallSite& site) const {
  check(cudaMemcpy(host, data(), static_cast<std::size_t>(count_ * element_bytes_), cudaMemcpyDeviceToHost),
        "cudaMemcpy (output)", site);
}

}  // namespace flashcheck::gpu
