// splitkv: flash-decoding. decode's block body on a slice of the keys per
// block, then a combine kernel that merges the slices through their LSE.
//
// Lineage: decode (kernels/decode/decode.cu). What changes: the keys of each
// sequence are cut into `splits` equal slices and the grid runs over
// (batch x K/V head x chunk of 4 query rows) x split, each block a 4-warp
// decode pass over its slice (the same 16-byte loads, 8 in flight per lane,
// warp dot products and online softmax; kernels/decode/decode_block.cuh). A
// block writes its rows' O_s = o / l (f32) and L_s = m + log(l) into a
// workspace slot (O_s = 0, L_s = -inf when it sees no key: a block whose rows
// see none of its keys exits early, after writing that); a warp per query row
// then merges L = m + log sum_s exp(L_s - m) with m = max_s L_s and O = sum_s
// exp(L_s - L) O_s, in split order (deterministic, no atomics).
// Why: decode runs one block per (batch, K/V head, 4 rows), so it fills the
// GPU only when there are >= ~132 of them; with few sequences or heads, or
// long keys per head, splitting the keys gives every SM work. The split count
// is FlashAttention's wave rule over the resident blocks (3 per SM of 4
// warps, 168 registers; flashcheck/kernels/splitkv/split_rule.hpp): e.g. 3
// splits at B=16 Hkv=8 (384 blocks in 396 slots), 109 for one sequence of
// 131072 keys and one K/V head (up to 128 splits since 2026-11-27; 64
// before), 1 where the grid already fills the GPU. Subject::set_split_count
// overrides it (the SplitCountsAgree property runs 1, 2, 3 and 7; `bench
// --splits N` times a fixed count).
// Workspace: kept by the subject across calls and grown on demand (no per-call
// allocation); the combine poisons each LSE slot after reading it, so a slot
// that a later call fails to write turns its rows NaN instead of merging stale
// values.
// Domain: decode's (f16/bf16, d = dv in {64, 128, 256}, seqlen_q <= 16, any
// seqlen_kv, every mask, GQA/MQA, padded batches, LSE, both layouts, Inf/NaN,
// paged K/V of 16 keys a page or more: decode_pass reads through the table).
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10, 3
// input sets): bf16 B=16 Hq=32 Hkv=8 Sq=1 Skv=32768 d=128 (the heuristic picks
// 3 splits): 0.697 ms, 3081 GB/s, 73.2% of the 4211 GB/s copy measured in the
// same run; decode 0.714 ms, cuDNN 0.486 ms. Small batches (B=1), where it
// should matter most, were not timed yet.
#include <memory>

#include "splitkv/splitkv_kernel.cuh"

namespace flashcheck::kernels {

void* SplitKvWorkspace::reserve(std::size_t bytes, cudaStream_t stream, const gpu::CallSite& site) {
  if (bytes > buffer_.bytes()) {
    // The old buffer goes first (cudaFree waits for the work still using it).
    buffer_ = gpu::DeviceBuffer();
    buffer_ = gpu::DeviceBuffer(bytes, site);
    gpu::check(cudaMemsetAsync(buffer_.get(), 0xff, bytes, stream), "cudaMemsetAsync (splitkv workspace)", site);
  }
  return buffer_.get();
}

template void launch_splitkv<SplitKvFlaw::none>(const gpu::AttentionArgs&, int, SplitKvWorkspace&,
                                                const gpu::CallSite&);

namespace {

struct Registration {
  Registration() {
    Registry::instance().add([] {
      return std::make_unique<SplitKvSubject<SplitKvFlaw::none>>(
          "splitkv", "flash-decoding: decode's blocks over key slices, merged through their LSE (f16/bf16)");
    });
  }
} registration;

}  // namespace
}  // namespace flashcheck::kernels
