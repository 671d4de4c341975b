// block_row: a block per query row; its threads split the keys, block-wide reductions.
//
// Lineage: article 000, section 4 (its v1: a block computes one query row at a
// time). What changes from minimal_rowthread (a thread per row, O rescaled in
// global memory after every K/V tile): the whole block works on one row, so a
// short query (decode, or few rows per head) still fills the GPU. The threads
// split the row's visible keys for the dot products (a thread per key, not the
// article's split of each dot product over d, which needs a block reduction per
// key); the block then reduces the chunk's max and sum through warp shuffles and
// shared memory in a fixed order (deterministic), and splits the output columns
// (a thread accumulates sum_j p_j v_jc for its columns, in registers). Keys are
// processed in chunks of 1024 with an online softmax across chunks, so shared
// memory stays bounded for any sequence length. The chunks cover exactly the
// row's visible range [first, last], so no key is ever masked inside a chunk.
// Domain: f32 storage and arithmetic; d, dv <= 256; any seqlen_q/seqlen_kv;
// none/causal_tl/causal_br/window masks; GQA/MQA; padded batches; LSE; BHSD and
// BSHD.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10):
//   f32 B=4 H=16 N=M=1024 d=64: 9.005 ms, 1.91 TFLOP/s; causal_br 4.297 ms, 2.00 TFLOP/s
//   f32 B=2 H=16 N=M=2048 d=128: 25.672 ms, 2.68 TFLOP/s
//   decode f32 B=16 Hq=32 Hkv=8 Sq=1 Skv=8192 d=128: 1.486 ms
#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention.cuh"

namespace flashcheck::kernels {
namespace {

constexpr int kBlockRowThreads = 128;
constexpr int kBlockRowWarps = kBlockRowThreads / 32;
constexpr int kBlockRowChunk = 1024;  // keys per chunk: the logits held in shared memory
constexpr int kBlockRowMaxHeadDim = 256;
constexpr int kBlockRowColumns = kBlockRowMaxHeadDim / kBlockRowThreads;  // output columns per thread
static_assert(kBlockRowThreads % 32 == 0 && kBlockRowMaxHeadDim % kBlockRowThreads == 0);
static_assert(kBlockRowMaxHeadDim % 4 == 0, "the Q row is read as float4");


__global__ void __launch_bounds__(kBlockRowThreads) block_row_kernel(const gpu::AttentionArgs a) {
  __shared__ __align__(16) float q_row[kBlockRowMaxHeadDim];
  __shared__ float chunk_logits[kBlockRowChunk];  // logits, then their weights
  __shared__ float partial_max[kBlockRowWarps], partial_sum[kBlockRowWarps];
  __shared__ int partial_nan[kBlockRowWarps];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / (a.heads_q / a.heads_kv);
  const int lq = query_length(a, b), lk = key_length(a, b);
  if (i >= lq) return;  // padding row (uniform: the block is this row)
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int d = a.head_dim, dv = a.head_dim_v;
  const float* q = static_cast<const float*>(a.q) + b * a.q_batch_stride + h * a.q_head_stride + i * a.q_seq_stride;
  const float* k = static_cast<const float*>(a.k) + b * a.k_batch_stride + hk * a.k_head_stride;
  const float* v = static_cast<const float*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;
  float* out = static_cast<float*>(a.o) + b * a.o_batch_stride + h * a.o_head_stride + i * a.o_seq_stride;
  float* lse = a.lse ? a.lse + (static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i : nullptr;

  const KeyRange range = visible_keys(a, i, lq, lk);
  if (range.first > range.last) {  // fully masked (uniform): O = 0, LSE = -inf
    for (int c = tid; c < dv; c += kBlockRowThreads) out[c] = 0.0f;
    if (lse && tid == 0) *lse = -INFINITY;
    return;
  }
  for (int c = tid; c < d; c += kBlockRowThreads) q_row[c] = q[c];
  __syncthreads();
  // Same sum order either way: float4 only cuts the load instructions.
  const bool k_float4 = d % 4 == 0 && a.k_seq_stride % 4 == 0 && reinterpret_cast<std::uintptr_t>(k) % 16 == 0;

  float acc[kBlockRowColumns];
#pragma unroll
  for (int n = 0; n < kBlockRowColumns; ++n) acc[n] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;
  bool saw_key = false;
  for (int chunk = range.first; chunk <= range.last; chunk += kBlockRowChunk) {
    const int count = min(kBlockRowChunk, range.last - chunk + 1);
    // Logits: a thread per key, keys tid, tid + T, ...
    float local_max = -INFINITY;
    bool local_nan = false;
    for (int n = tid; n < count; n += kBlockRowThreads) {
      const float* key = k + (chunk + n) * a.k_seq_stride;
      float dot = 0.0f;
      if (k_float4) {
#pragma unroll 2
        for (int c = 0; c < d; c += 4) {
          const float4 k4 = *reinterpret_cast<const float4*>(key + c);
          const float4 q4 = *reinterpret_cast<const float4*>(q_row + c);
          dot += q4.x * k4.x;
          dot += q4.y * k4.y;
          dot += q4.z * k4.z;
          dot += q4.w * k4.w;
        }
      } else {
        for (int c = 0; c < d; ++c) dot += q_row[c] * key[c];
      }
      const float logit = dot * a.scale;
      chunk_logits[n] = logit;
      if (isnan(logit)) local_nan = true;
      else local_max = fmaxf(local_max, logit);
    }
    local_max = warp_max(local_max);
    local_nan = __any_sync(kFullWarp, local_nan);
    if (lane == 0) {
      partial_max[warp] = local_max;
      partial_nan[warp] = local_nan;
    }
    __syncthreads();
    float chunk_max = -INFINITY;
    bool chunk_nan = false;
#pragma unroll
    for (int w = 0; w < kBlockRowWarps; ++w) {
      chunk_max = fmaxf(chunk_max, partial_max[w]);
      chunk_nan = chunk_nan || partial_nan[w];
    }
    const float grown = chunk_nan || isnan(running_max) ? quiet_nan() : fmaxf(running_max, chunk_max);
    // While every logit seen is -inf, subtract 0: such keys weigh 0, not NaN.
    const float subtrahend = grown == -INFINITY ? 0.0f : grown;
    const float correction = saw_key ? __expf(running_max - subtrahend) : 0.0f;

    // Weights, each thread over its own keys (no barrier needed before).
    float local_sum = 0.0f;
    for (int n = tid; n < count; n += kBlockRowThreads) {
      const float weight = __expf(chunk_logits[n] - subtrahend);
      chunk_logits[n] = weight;
      local_sum += weight;
    }
    local_sum = warp_sum(local_sum);
    if (lane == 0) partial_sum[warp] = local_sum;
    __syncthreads();  // the weights and the partial sums, for every thread
    float chunk_sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kBlockRowWarps; ++w) chunk_sum += partial_sum[w];
    running_sum = running_sum * correction + chunk_sum;

    // Output columns tid, tid + T: the chunk's keys in order, V rows coalesced across threads.
    const float* value = v + chunk * a.v_seq_stride;
#pragma unroll
    for (int n = 0; n < kBlockRowColumns; ++n) acc[n] *= correction;
#pragma unroll 4
    for (int j = 0; j < count; ++j) {
      const float weight = chunk_logits[j];
      const float* value_row = value + j * a.v_seq_stride;
#pragma unroll
      for (int n = 0; n < kBlockRowColumns; ++n) {
        const int c = tid + n * kBlockRowThreads;
        if (c < dv) acc[n] += weight * value_row[c];
      }
    }
    running_max = grown;
    saw_key = true;
    __syncthreads();  // the next chunk overwrites chunk_logits and the partials
  }
  // The range is not empty, so saw_key holds here.
  if (running_max == -INFINITY) {  // every visible logit -inf: the plain formula's 0/0
    for (int c = tid; c < dv; c += kBlockRowThreads) out[c] = quiet_nan();
    if (lse && tid == 0) *lse = quiet_nan();
    return;
  }
  const float inverse = 1.0f / running_sum;
#pragma unroll
  for (int n = 0; n < kBlockRowColumns; ++n) {
    const int c = tid + n * kBlockRowThreads;
    if (c < dv) out[c] = acc[n] * inverse;
  }
  if (lse && tid == 0) *lse = running_max + logf(running_sum);
}

void launch_block_row(const gpu::AttentionArgs& args, const gpu::CallSite& site) {
  const dim3 grid(args.seqlen_q, args.heads_q, args.batch);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  block_row_kernel<<<grid, kBlockRowThreads, 0, args.stream>>>(args);
  gpu::check_launch("block_row_kernel", site);
}

constexpr Capabilities kCapabilities = {
    .dtypes = {DType::f32},
    .min_head_dim = 1,
    .max_head_dim = kBlockRowMaxHeadDim,
    .max_head_dim_v = kBlockRowMaxHeadDim,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .tile_q = 1,
    .tile_kv = kBlockRowChunk,
    .needs_gpu = true,
    .min_compute_capability = 80,
};

gpu::KernelRegistration registration("block-row",
                                      "a block per query row, threads split the keys, block-wide online softmax over 1024-key chunks (f32)",
                                      kCapabilities, launch_block_row);

}  // namespace
}  // namespace flashcheck::kernels
