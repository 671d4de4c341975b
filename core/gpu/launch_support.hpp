// What GpuSubject's forward (gpu_subject.cpp) and backward (gpu_backward.cpp)
// paths share around a launch: strides, the device check, the lengths'
// upload, the poison test, the after-launch checks (guard bands, inputs left
// unchanged) and the timing loop. Internal to core/gpu.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashcheck/core/gpu/gpu_subject.hpp"
#include "flashcheck/core/gpu/runtime.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck::gpu::detail {

/// Element strides of a [batch, heads, seq, dim] tensor in a layout (the last axis contiguous).
void strides(Layout layout, std::int64_t heads, std::int64_t seqlen, std::int64_t dim, std::int64_t& batch,
             std::int64_t& head, std::int64_t& seq);

/// Why this machine cannot run a subject of `caps` (no device, no driver, too
/// old a device), or nullopt.
std::optional<std::string> device_refusal(const Capabilities& caps);

/// A copy of `bytes` host bytes on the device, stream-ordered on `stream` and
/// enqueued there (the host copy must live until the stream is synchronised).
DeviceBuffer upload(const void* host, std::int64_t bytes, cudaStream_t stream, const CallSite& site, const char* what);

/// A padded problem's per-sequence lengths on the device (empty buffers for
/// an unpadded one). The host copies live here until the stream is synchronised.
struct DeviceLengths {
  DeviceBuffer q, kv;
  std::vector<std::int32_t> host_q, host_kv;
};
/// Fills `lengths` (the host copies are the asynchronous copies' sources: the
/// struct must not move until the stream is synchronised).
void upload_lengths(const Problem& p, cudaStream_t stream, const CallSite& site, DeviceLengths& lengths);

/// The geometry and strides of `p` in args (the pointers and the stream left to the caller).
void fill_geometry(const Problem& p, AttentionArgs& args);

/// Whether element `at` of a tensor downloaded from a GuardedBuffer still holds the poison's exact bits.
bool still_poisoned(const HostTensor& tensor, std::int64_t at);

/// An output's guard bands as they came back: the buffer, the host copy of its whole storage (GuardedBuffer::add_to).
struct ReturnedOutput {
  const GuardedBuffer* buffer;
  const unsigned char* storage;
  const char* label;
};
/// One violation per output whose guard bands were written: "out-of-bounds
/// write: N element(s) of O's guard bands written, the first at element ...".
void guard_violations(std::initializer_list<ReturnedOutput> outputs, std::vector<std::string>& violations);

/// A handed input: its host bytes, and the device copy the launch received as it came back after the launch.
struct HandedInput {
  const void* host;
  std::int64_t bytes;
  const unsigned char* after;
  const char* label;
};
/// One violation per input whose device copy no longer equals the host
/// bytes ("input modification: the `who` wrote to K").
void input_violations(std::initializer_list<HandedInput> inputs, const char* who, std::vector<std::string>& violations);

/// The violations joined with "; " (empty when there are none).
std::string join_violations(const std::vector<std::string>& violations);

/// Times launch(n) for n = 0, 1, ... with CUDA events on `stream`: `warmup`
/// untimed calls, then (after any warm-up) until the median of 5 settles
/// within 2% (at most 1 s), then `repeats` timed ones.
Timing time_launches(const std::function<void(int)>& launch, cudaStream_t stream, int warmup, int repeats,
                     const CallSite& site);

}  // namespace flashcheck::gpu::detail
