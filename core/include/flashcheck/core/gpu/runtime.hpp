// The device runtime: checked CUDA calls, RAII buffers and streams, and guarded
// output buffers. Compiled only with CUDA; included only by CUDA sources.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace flashcheck::gpu {

/// A failed CUDA call. `sticky` errors (illegal address, misaligned access, a
/// trap) poison the context: the process must not use the device again.
class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const std::string& message, bool sticky)
      : std::runtime_error(message), code_(code), sticky_(sticky) {}
  cudaError_t code() const { return code_; }
  bool sticky() const { return sticky_; }

 private:
  cudaError_t code_;
  bool sticky_;
};

/// A refusal discovered at launch time (a library declining a configuration):
/// the call becomes Status::unsupported carrying the library's message.
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Whether an error leaves the CUDA context unusable.
bool is_sticky(cudaError_t code);

/// What a failed call was doing, for its message.
struct CallSite {
  std::string kernel;
  std::string problem;  // the problem line
};

/// Throws CudaError naming the call, the kernel and the problem when `status` is an error.
void check(cudaError_t status, const char* call, const CallSite& site);

/// Checks the last launch error (call right after a <<<>>> launch).
void check_launch(const char* kernel, const CallSite& site);

/// True once a sticky error has been seen in this process (the context is gone).
bool context_poisoned();

/// Whether a CUDA device can be used (and why not, when it cannot).
bool device_available(std::string* why = nullptr);
/// Compute capability of the current device (major*10 + minor), 0 without one.
int device_compute_capability();

/// A device allocation of `bytes` bytes, freed on destruction. Given a stream,
/// it is stream-ordered: cudaMallocAsync and cudaFreeAsync on that stream, from
/// the device's default pool, which this process sets to keep freed memory for
/// the next allocation. A plain cudaFree waits for the whole device, and in a
/// test tier that shares the GPU among many processes every such wait queues
/// behind the others' work. The stream must outlive the buffer.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t bytes, const CallSite& site);
  DeviceBuffer(std::size_t bytes, cudaStream_t stream, const CallSite& site);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : pointer_(std::exchange(other.pointer_, nullptr)), bytes_(other.bytes_), stream_(other.stream_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(pointer_, other.pointer_);
    std::swap(bytes_, other.bytes_);
    std::swap(stream_, other.stream_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return pointer_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;  // stream-ordered when set
};

/// Device-to-host copies enqueued on one stream and waited for together, so
/// that a case's outputs, guard bands and inputs come back with one
/// synchronisation instead of one per copy. The copies land in pinned host
/// memory (this thread's staging buffer, grown as needed and kept); past
/// kPinnedLimit bytes in all, or while another Downloads of this thread holds
/// the staging buffer, in pageable memory (each copy then waits for itself).
class Downloads {
 public:
  static constexpr std::size_t kPinnedLimit = std::size_t{256} << 20;
  Downloads(cudaStream_t stream, const CallSite& site) : stream_(stream), site_(site) {}
  ~Downloads();
  Downloads(const Downloads&) = delete;
  Downloads& operator=(const Downloads&) = delete;
  /// Schedules a copy of `bytes` bytes from `device`; returns its index.
  std::size_t add(const void* device, std::size_t bytes);
  /// Enqueues every copy, then synchronises the stream (once). `what` names the wait in an error.
  void wait(const char* what);
  /// Copy `index`'s bytes, valid after wait() until this object dies.
  const unsigned char* bytes(std::size_t index) const { return base_ + offsets_[index]; }

 private:
  cudaStream_t stream_;
  const CallSite& site_;
  std::vector<std::pair<const void*, std::size_t>> copies_;
  std::vector<std::size_t> offsets_;
  unsigned char* base_ = nullptr;
  bool holds_staging_ = false;
  std::vector<unsigned char> pageable_;
};

/// A stream, destroyed on destruction.
class Stream {
 public:
  explicit Stream(const CallSite& site);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

/// A CUDA event, destroyed with its owner (also when a check throws).
class Event {
 public:
  explicit Event(const CallSite& site);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

/// Fills `count` words of `word_bytes` (2 or 4) with `pattern` on a stream (a kernel).
void fill_words(void* data, std::int64_t count, int word_bytes, std::uint32_t pattern, cudaStream_t stream);

/// Elements of guard band before and after each guarded output.
inline constexpr std::int64_t kGuardElements = 1024;

/// A device buffer of `count` elements of `element_bytes` (2 or 4) with guard
/// bands of kGuardElements on both sides, stream-ordered on `stream`. The bands
/// and (by poison()) the body hold a NaN bit pattern whose payload no
/// arithmetic produces, so a touched band is an out-of-bounds write and a body
/// element still holding it was never written. After a launch, the whole
/// storage (bands and body) comes back in one copy (add_to), and the checks
/// read that copy.
class GuardedBuffer {
 public:
  GuardedBuffer(std::int64_t count, int element_bytes, cudaStream_t stream, const CallSite& site);
  void* data() const { return static_cast<char*>(storage_.get()) + kGuardElements * element_bytes_; }
  std::int64_t count() const { return count_; }
  /// Fills bands and body with the poison pattern.
  void poison(cudaStream_t stream, const CallSite& site);
  /// Schedules the copy of the whole storage; returns its index in `downloads`.
  std::size_t add_to(Downloads& downloads) const { return downloads.add(storage_.get(), storage_.bytes()); }
  /// Elements of the bands (in `storage`, a host copy of the whole storage)
  /// that no longer hold the pattern; the first such offset relative to the
  /// body (negative: before it) in *first.
  std::int64_t touched_guard_elements(const unsigned char* storage, std::int64_t* first) const;
  /// Copies the body out of `storage` (a host copy of the whole storage) to `host`.
  void copy_body(const unsigned char* storage, void* host) const;

  /// The poison patterns (quiet NaNs with a distinctive payload).
  static constexpr std::uint32_t kPoison32 = 0x7FC0DEADu;
  static constexpr std::uint16_t kPoison16 = 0x7E5Bu;  // f16 quiet NaN; in bf16 too (exp all ones, payload != 0)

 private:
  DeviceBuffer storage_;
  std::int64_t count_;
  int element_bytes_;
};

}  // namespace flashcheck::gpu
