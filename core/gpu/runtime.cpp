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

namespace {

// The current device's default pool keeps what a stream-ordered free returns
// (its release threshold is 0 otherwise: every synchronisation would hand the
// memory back, and the next case would map it again). Once per device.
void keep_pool_memory(const CallSite& site) {
  static std::mutex mutex;
  static std::vector<int> kept;  // the devices whose pool is set
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice", site);
  const std::lock_guard lock(mutex);
  if (std::ranges::find(kept, device) != kept.end()) return;
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool", site);
  std::uint64_t keep_all = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
        "cudaMemPoolSetAttribute (release threshold)", site);
  kept.push_back(device);
}

// This thread's pinned staging buffer for Downloads: grown as needed, kept.
struct PinnedStaging {
  unsigned char* data = nullptr;
  std::size_t capacity = 0;
  bool in_use = false;
  ~PinnedStaging() {
    if (data && !poisoned) cudaFreeHost(data);
  }
};
thread_local PinnedStaging staging;

}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes, cudaStream_t stream, const CallSite& site)
    : bytes_(bytes), stream_(stream) {
  if (bytes == 0) return;
  keep_pool_memory(site);
  check(cudaMallocAsync(&pointer_, bytes, stream), "cudaMallocAsync", site);
}

DeviceBuffer::~DeviceBuffer() {
  if (!pointer_ || poisoned) return;
  if (stream_) cudaFreeAsync(pointer_, stream_);
  else cudaFree(pointer_);
}

Downloads::~Downloads() {
  if (holds_staging_) staging.in_use = false;
}

std::size_t Downloads::add(const void* device, std::size_t bytes) {
  copies_.emplace_back(device, bytes);
  return copies_.size() - 1;
}

void Downloads::wait(const char* what) {
  std::size_t total = 0;
  offsets_.clear();
  for (const auto& [source, bytes] : copies_) {
    offsets_.push_back(total);
    total += (bytes + 255) / 256 * 256;  // each copy 256-byte aligned
  }
  if (total <= kPinnedLimit && !staging.in_use) {
    if (staging.capacity < total) {
      if (staging.data) check(cudaFreeHost(staging.data), "cudaFreeHost (staging)", site_);
      staging.data = nullptr;
      staging.capacity = 0;
      const std::size_t capacity = std::max<std::size_t>(total, std::size_t{1} << 20);
      check(cudaHostAlloc(reinterpret_cast<void**>(&staging.data), capacity, cudaHostAllocDefault),
            "cudaHostAlloc (staging)", site_);
      staging.capacity = capacity;
    }
    staging.in_use = holds_staging_ = true;
    base_ = staging.data;
  } else {
    pageable_.resize(total);
    base_ = pageable_.data();
  }
  for (std::size_t n = 0; n < copies_.size(); ++n)
    if (copies_[n].second > 0)
      check(cudaMemcpyAsync(base_ + offsets_[n], copies_[n].first, copies_[n].second, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync (download)", site_);
  check(cudaStreamSynchronize(stream_), what, site_);
}

Stream::Stream(const CallSite& site) {
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate", site);
}

Stream::~Stream() {
  if (stream_ && !poisoned) cudaStreamDestroy(stream_);
}

Event::Event(const CallSite& site) { check(cudaEventCreate(&event_), "cudaEventCreate", site); }

Event::~Event() {
  if (event_ && !poisoned) cudaEventDestroy(event_);
}

GuardedBuffer::GuardedBuffer(std::int64_t count, int element_bytes, cudaStream_t stream, const CallSite& site)
    : storage_(static_cast<std::size_t>((count + 2 * kGuardElements) * element_bytes), stream, site),
      count_(count),
      element_bytes_(element_bytes) {}

void GuardedBuffer::poison(cudaStream_t stream, const CallSite& site) {
  fill_words(storage_.get(), count_ + 2 * kGuardElements, element_bytes_,
             element_bytes_ == 4 ? kPoison32 : kPoison16, stream);
  check_launch("flashcheck::gpu::fill_words", site);
}

std::int64_t GuardedBuffer::touched_guard_elements(const unsigned char* storage, std::int64_t* first) const {
  std::int64_t touched = 0;
  *first = 0;
  for (int side = 0; side < 2; ++side) {
    const unsigned char* band =
        storage + (side == 0 ? 0 : static_cast<std::size_t>((kGuardElements + count_) * element_bytes_));
    for (std::int64_t i = 0; i < kGuardElements; ++i) {
      bool intact;
      if (element_bytes_ == 4) {
        std::uint32_t word;
        std::memcpy(&word, band + i * 4, 4);
        intact = word == kPoison32;
      } else {
        std::uint16_t word;
        std::memcpy(&word, band + i * 2, 2);
        intact = word == kPoison16;
      }
      if (intact) continue;
      if (touched == 0) *first = side == 0 ? i - kGuardElements : count_ + i;
      ++touched;
    }
  }
  return touched;
}

void GuardedBuffer::copy_body(const unsigned char* storage, void* host) const {
  if (count_ > 0)
    std::memcpy(host, storage + kGuardElements * element_bytes_, static_cast<std::size_t>(count_ * element_bytes_));
}

}  // namespace flashcheck::gpu
