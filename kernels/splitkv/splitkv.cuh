// splitkv's domain, flaws, workspace and subject, shared with its mutants
// (kernels/mutants/splitkv_mutants.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "flashcheck/core/gpu/gpu_subject.hpp"
#include "decode/decode.cuh"

namespace flashcheck::kernels {

/// Deliberate flaws, for mutants; `none` is the real kernel.
enum class SplitKvFlaw {
  none,
  unshifted_combine,      // the combine sums exp(L_s) without subtracting their maximum
  empty_split_unwritten,  // a split that sees no key exits without writing its slot
};

/// The most splits a call may ask for (grid.y, and the combine reads each).
inline constexpr int kSplitKvMaxSplits = 1024;

/// decode's domain, split over blocks: the same rows and keys per block, so the
/// same capabilities, plus the split count (Subject::set_split_count).
inline constexpr Capabilities kSplitKvCapabilities = [] {
  Capabilities caps = kDecodeCapabilities;
  caps.split_kv = true;
  caps.tile_kv = 64;  // keys per block step at d <= 128 (4 warps x 16, splitkv_mma_kernel.cuh)
  return caps;
}();

/// Programmatic dependent launch (sm_90 and newer): each split block lets the
/// combine launch as soon as it starts, so the combine's launch overlaps the
/// split kernel instead of following it, and the combine waits
/// (griddepcontrol.wait: every split block done, its writes visible) before
/// it reads a slot. Code built for an older GPU has neither instruction, and
/// its combine is launched without the attribute (launch_splitkv_combine).
__device__ __forceinline__ void let_combine_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_splits() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// Where the splits leave their results: for slot (split s, row n), n =
/// (b * heads_q + h) * seqlen_q + i, O_s (f32, normalised) at o[(s * rows + n) * d]
/// and LSE_s (natural log; -inf where the split saw no key) at lse[s * rows + n].
struct SplitKvPartials {
  float* o;
  float* lse;
  std::int64_t rows;
};

/// The partial results between the two kernels, a device buffer the subject
/// keeps across calls: it grows when a call needs more and is never freed per
/// call, so no call waits on cudaMalloc or cudaFree once it is large enough.
class SplitKvWorkspace {
 public:
  /// At least `bytes` bytes, valid for work enqueued on `stream` from now on.
  /// New memory is filled with NaN (all bits set): a slot that no split writes
  /// then makes its rows NaN instead of merging whatever the memory held.
  void* reserve(std::size_t bytes, cudaStream_t stream, const gpu::CallSite& site);

 private:
  gpu::DeviceBuffer buffer_;
};

/// Enqueues the split and combine kernels on args.stream: `splits` ways, or
/// the heuristic's count when `splits` is 0. Throws gpu::CudaError.
template <SplitKvFlaw kFlaw>
void launch_splitkv(const gpu::AttentionArgs& args, int splits, SplitKvWorkspace& workspace,
                    const gpu::CallSite& site);

/// splitkv (or a mutant of it) as a subject: a GpuSubject that keeps the
/// workspace and the split count.
template <SplitKvFlaw kFlaw>
class SplitKvSubject final : public gpu::GpuSubject {
 public:
  SplitKvSubject(std::string_view name, std::string_view description) : name_(name), description_(description) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  const Capabilities& capabilities() const override { return kSplitKvCapabilities; }
  bool set_split_count(int splits) override {
    if (splits < 0 || splits > kSplitKvMaxSplits) return false;
    splits_ = splits;
    return true;
  }

 private:
  void launch(const Problem&, const gpu::AttentionArgs& args, const gpu::CallSite& site) override {
    launch_splitkv<kFlaw>(args, splits_, workspace_, site);
  }
  std::string_view name_, description_;
  int splits_ = 0;  // 0: the heuristic
  SplitKvWorkspace workspace_;
};

}  // namespace flashcheck::kernels
