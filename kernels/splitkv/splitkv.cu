// splitkv: flash-decoding. Blocks over slices of the keys, then a combine
// kernel that merges the slices through their LSE. This file's kernel is
// version 5 (issue 24; docs/perf.md, "splitkv v4" and "splitkv v5").
//
// v5 changed from v4: the combine is launched as the split kernel's
// programmatic dependent (sm_90 and newer, where the running code has the
// wait): each split block lets it launch as it starts, and the combine waits
// in-kernel (griddepcontrol.wait) for every split block's writes, so its
// launch no longer follows the split kernel's end. The blocks are v4's.
//  Speed (v5): H100, 2026-11-27, `flashcheck bench -s splitkv --problems
//  <issue 24's decode lines>` (cuDNN 9.14 in the same run; % of the measured
//  3020 GB/s read ceiling), bf16 d=128: B=1 Hq=8 Hkv=1 Skv=131072 0.047 ms,
//  47% (v4 0.049; 0.97x cuDNN, v4 0.92x), paged page=16 0.047 ms (1.14x
//  cuDNN); Skv=32768 0.026 ms, 21% (v4 0.029; 1.04x cuDNN); Skv=262144 0.073
//  ms, 61%; B=1 Hq=32 Hkv=8 Skv=32768 0.066 ms, 67%; B=64 Skv=8192 0.770 ms,
//  92% (unchanged); Sq=8 and Sq=4 causal_br 68% and 62% (unchanged).
//
// v4 changed from v3: at d <= 128 the split block runs on tensor cores
// (splitkv_mma_kernel.cuh): a block per (batch, K/V head, chunk of 16 rows,
// split), the rows being the GQA group's heads at every query position, one
// m16 tile of mma.sync.m16n8k16, so that up to 16 rows read the slice's K and
// V once (v3: blocks of 4 rows each read it, 4 warps of CUDA-core dot
// products at about 650 instructions per 4 KB of K/V). K and V go straight
// from global memory to registers, 16 bytes a lane, a step ahead; each load is
// read as two k16 steps' fragments (a dot product's columns may be summed in
// any order, so Q's fragments take the same permutation), and V's fragments
// are transposed in registers by movmatrix. Steps where the rows see
// different keys (causal or window edges with several query positions) add P V
// on the CUDA cores, row by row, so a masked key never meets a zero weight.
// The split count is the same wave rule, up to one wave of the resident blocks
// (was: at most 128), and the combine is a block per row whose warps take the
// splits in parallel (v3: a warp walked every split of its row in turn).
// d = 256 keeps v3's block (decode_block.cuh), with the new combine.
//  Speed (v4): H100, 2026-11-27, `flashcheck bench -s decode,splitkv --problems
//  .devrun/bench-decode24.problems` (cuDNN 9.14 in the same run; % of the
//  measured 3029 GB/s read ceiling), bf16 d=128: B=64 Hq=32 Hkv=8 Sq=1
//  Skv=8192 0.771 ms, 92% (cuDNN 98%); B=1 Hq=8 Hkv=1 Skv=131072 0.049 ms, 45%
//  (v3: 0.099 ms, 23%; cuDNN 48%); Skv=262144 59%; B=1 Hq=32 Hkv=8 Skv=32768
//  65%; B=8 Hq=32 Hkv=8 Sq=8 Skv=16384 causal_br 0.263 ms, 68% (v3 1.647 ms,
//  11%; cuDNN 0.409 ms); B=4 Sq=4 causal_br 0.072 ms, 62% (v3 0.179; cuDNN
//  0.118); paged B=16 page=16 92%.
//
// v3 and before, as d = 256 still runs:
// Lineage: decode (kernels/decode/decode.cu). What changes: the keys of each
// sequence are cut into `splits` equal slices and the grid runs over
// (batch x K/V head x chunk of 4 query rows) x split, each block a 4-warp
// decode pass over its slice (the same 16-byte loads, 8 in flight per lane,
// warp dot products and online softmax; kernels/decode/decode_block.cuh). A
// block writes its rows' O_s = o / l (f32) and L_s = m + log(l) into a
// workspace slot (O_s = 0, L_s = -inf when it sees no key: a block whose rows
// see none of its keys exits early, after writing that); the combine (a warp
// per query row until v4, a block per row since) merges L = m + log sum_s
// exp(L_s - m) with m = max_s L_s and O = sum_s exp(L_s - L) O_s in a fixed
// order (deterministic, no atomics).
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
          "splitkv",
          "flash-decoding: key slices merged through their LSE; a block per 16 rows of a K/V group on mma.sync "
          "(d <= 128), decode's blocks at d = 256 (f16/bf16)");
    });
  }
} registration;

}  // namespace
}  // namespace flashcheck::kernels
