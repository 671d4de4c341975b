// decode: attention for a few queries (seqlen_q <= 16) against a long key
// sequence, where the cost is reading K and V once.
//
// Lineage: article 004 (a decode kernel with GQA: a block per (batch, head,
// query position), Q in shared memory, 64-key score tiles, shared-memory
// reductions). What changes from the article: a block per (batch, K/V head,
// 4 query rows) instead of per query head, so every query head of a GQA group
// and every query position shares each K/V load (the article reads K/V once
// per query head: 4x the bytes at GQA 4); keys are read with 16-byte loads,
// 8 loads in flight per lane before any is used, by 12 warps that take 8-key
// steps round robin (kernels/decode/decode_block.cuh); logits are warp-level
// dot products (a butterfly over the lanes of one key row); each warp keeps an
// online softmax in registers and the warps merge once, in shared memory, in a
// fixed order (deterministic, no atomics). No tensor cores: at seqlen_q = 1 a
// K/V byte feeds 4 multiply-adds per query row, far below what memory delivers.
// Why 12 warps, one block per SM: at the target (B=16, Hkv=8) there are 128
// blocks for 132 SMs, and each SM needs about 4.3 TB/s / 132 x ~700 ns = 23 KB
// of loads in flight. The 4 rows' queries and outputs (64 f32 registers) and
// 8 loads (32 registers) need ~160 registers a thread; 12 warps of 168 fill
// the register file, and 12 x 32 lanes x 8 x 16 bytes = 48 KB is issued per
// step, so the SM stays covered while a third of its warps compute. (16 warps
// at 128 registers spill.) With few (batch, K/V head) pairs the grid is
// small: that is what splitkv is for.
// Domain: f16 and bf16 storage, f32 logits, softmax and accumulation; d = dv in
// {64, 128, 256}; seqlen_q <= 16, any seqlen_kv (tails predicated; 0 gives
// O = 0 and LSE = -inf); none/causal_tl/causal_br/window masks; GQA/MQA (any
// group size: groups of more than 4 rows take several blocks); padded batches;
// LSE; BHSD and BSHD; Inf/NaN inputs (masked keys are absent, never 0-weighted).
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10, 3
// input sets): bf16 B=16 Hq=32 Hkv=8 Sq=1 Skv=32768 d=128: 0.714 ms, 3009 GB/s,
// 71.5% of the 4211 GB/s device-to-device copy measured in the same run (the
// target was 70%); cuDNN 0.486 ms, 4416 GB/s. An earlier run that day (same
// bench, sm_90a build): B=4 Hq=32 Hkv=8 Sq=4 Skv=8192 causal_br 0.181 ms,
// cuDNN 0.114 ms.
#include "decode/decode.cuh"
#include "decode/decode_block.cuh"

namespace flashcheck::kernels {
namespace {

// One block per (chunk of 4 query rows, batch x K/V head).
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kDecodeWarps * 32, 1) decode_kernel(const gpu::AttentionArgs a) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto& shared = *reinterpret_cast<DecodeShared<kHeadDim, kDecodeWarps>*>(shared_bytes);
  const int b = blockIdx.y / a.heads_kv, hk = blockIdx.y % a.heads_kv;
  const int lq = query_length(a, b), lk = key_length(a, b);
  if (blockIdx.x * kDecodeRows >= lq * (a.heads_q / a.heads_kv)) return;  // only padding rows (block-uniform)
  const DecodeRows rows = decode_rows(a, hk, blockIdx.x, lq, lk, 0, lk - 1);
  decode_pass<Element, kHeadDim, kDecodeWarps>(a, b, hk, rows, shared);

  // A thread per (row, 8 columns) writes O; the first of each row writes LSE.
  constexpr int kChunks = kHeadDim / 8;
  static_assert(kDecodeRows * kChunks <= kDecodeWarps * 32, "one pass of the block covers the output");
  const int r = threadIdx.x / kChunks, column = threadIdx.x % kChunks * 8;
  if (r >= kDecodeRows) return;
  const DecodeRow row = decode_row(a, hk, blockIdx.x, r, lq, lk, 0, lk - 1);
  if (!row.active) return;
  const DecodeMerged merged = decode_merge<kHeadDim, kDecodeWarps>(shared, r, column);
  float out[8];
  float lse;
  if (merged.max == -INFINITY) {
    // No visible key: O = 0, LSE = -inf. Every visible logit -inf: the plain formula's 0/0.
    const bool saw_keys = row.keys.first <= row.keys.last;
    for (float& x : out) x = saw_keys ? quiet_nan() : 0.0f;
    lse = saw_keys ? quiet_nan() : -INFINITY;
  } else {
    const float inverse = 1.0f / merged.sum;
    for (int c = 0; c < 8; ++c) out[c] = merged.o[c] * inverse;
    lse = merged.max + logf(merged.sum);
  }
  const int h = row.head, i = row.position;
  *reinterpret_cast<uint4*>(static_cast<Element*>(a.o) + b * a.o_batch_stride + h * a.o_head_stride +
                            i * a.o_seq_stride + column) = pack8<Element>(out);
  if (a.lse && column == 0) a.lse[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] = lse;
}

template <typename Element, int kHeadDim>
void launch_decode_for(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  const int group_rows = a.heads_q / a.heads_kv * a.seqlen_q;
  const dim3 grid((group_rows + kDecodeRows - 1) / kDecodeRows, a.batch * a.heads_kv);
  if (grid.x == 0 || grid.y == 0) return;
  constexpr int kSharedBytes = sizeof(DecodeShared<kHeadDim, kDecodeWarps>);
  // Above 48 KB, dynamic shared memory needs an opt-in (once per instantiation).
  static const cudaError_t opted_in = cudaFuncSetAttribute(
      decode_kernel<Element, kHeadDim>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  gpu::check(opted_in, "cudaFuncSetAttribute (decode_kernel)", site);
  decode_kernel<Element, kHeadDim><<<grid, kDecodeWarps * 32, kSharedBytes, a.stream>>>(a);
  gpu::check_launch("decode_kernel", site);
}

void launch_decode(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  dispatch_decode(a, [&]<typename Element, int kHeadDim>() { launch_decode_for<Element, kHeadDim>(a, site); });
}

gpu::KernelRegistration registration("decode",
                                     "decode: a block per (batch, K/V head, 4 query rows), 12 warps streaming K/V "
                                     "with 16-byte loads (f16/bf16)",
                                     kDecodeCapabilities, launch_decode);

}  // namespace
}  // namespace flashcheck::kernels
