// minimal_rowthread: FlashAttention-1's loop, a thread per query row, O kept in global memory.
//
// Lineage: article 000, section 3 (flash-attention-minimal), the first tiled
// kernel of the fp32 family; it grows from the plain formula
// (kernels/cpu/plain.cpp). What changes from flash-attention-minimal: a block
// per Br-row query tile (grid over query tiles, heads and batch) instead of one
// block per head walking every query tile, so a row's running max and sum stay
// in registers instead of global l/m buffers; the Q tile sits in shared memory
// with an odd row stride (a thread per row reads a column without bank
// conflicts); K/V tiles are loaded a warp per key row, coalesced; Lq != Lk,
// predicated tails, masks, GQA and padded batches; L = m + log(l) is written.
// What it keeps, deliberately: the FlashAttention-1 update, in which a row's O
// lives normalised in global memory and is read, rescaled and written back after
// every K/V tile. That traffic is what fa2_rowthread removes, so this version
// is the family's baseline for it. Tiles outside every row's masked range are
// skipped; only tiles not inside every row's range test the mask.
// Domain: f32 storage and arithmetic; d, dv <= 128; any seqlen_q/seqlen_kv
// (tails predicated); none/causal_tl/causal_br/window masks; GQA/MQA; padded
// batches; LSE; BHSD and BSHD.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10):
//   f32 B=4 H=16 N=M=1024 d=64: 10.267 ms, 1.67 TFLOP/s; causal_br 6.538 ms, 1.32 TFLOP/s
//   f32 B=2 H=16 N=M=2048 d=128: 50.920 ms, 1.35 TFLOP/s
//   decode f32 B=16 Hq=32 Hkv=8 Sq=1 Skv=8192 d=128: 130.750 ms
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/attention.cuh"

namespace flashcheck::kernels {
namespace {

constexpr int kMinimalRows = 64;  // Br: query rows per block, a thread each
constexpr int kMinimalKeys = 32;  // Bc: keys per shared-memory K/V tile
constexpr int kMinimalMaxHeadDim = 128;
constexpr int kMinimalWarps = kMinimalRows / 32;
static_assert(kMinimalKeys == 32, "a tile's visible keys are one 32-bit mask");
static_assert(kMinimalRows % 32 == 0, "tiles are loaded a warp per row");

// Dynamic shared memory: Q [Br][d|1], K [Bc][d], V [Bc][dv] (floats).
std::size_t minimal_shared_bytes(int head_dim, int head_dim_v) {
  const std::size_t floats = static_cast<std::size_t>(kMinimalRows) * (head_dim | 1) +
                             static_cast<std::size_t>(kMinimalKeys) * (head_dim + head_dim_v);
  return floats * sizeof(float);
}

__global__ void __launch_bounds__(kMinimalRows) minimal_rowthread_kernel(const gpu::AttentionArgs a) {
  extern __shared__ float shared[];
  const int b = blockIdx.z, h = blockIdx.y, hk = h / (a.heads_q / a.heads_kv);
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int row_begin = blockIdx.x * kMinimalRows;
  if (row_begin >= lq) return;  // the whole block is past this sequence (uniform: safe before barriers)
  const int rows = min(kMinimalRows, lq - row_begin);
  const int d = a.head_dim, dv = a.head_dim_v, q_stride = d | 1;
  float* q_tile = shared;
  float* k_tile = q_tile + kMinimalRows * q_stride;
  float* v_tile = k_tile + kMinimalKeys * d;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool active = static_cast<int>(threadIdx.x) < rows;
  const int i = row_begin + (active ? static_cast<int>(threadIdx.x) : 0);
  const float* q = static_cast<const float*>(a.q) + b * a.q_batch_stride + h * a.q_head_stride;
  const float* k = static_cast<const float*>(a.k) + b * a.k_batch_stride + hk * a.k_head_stride;
  const float* v = static_cast<const float*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;
  float* out = static_cast<float*>(a.o) + b * a.o_batch_stride + h * a.o_head_stride + i * a.o_seq_stride;

  // Read only after the first tile's barrier.
  for (int r = warp; r < rows; r += kMinimalWarps)
    for (int c = lane; c < d; c += 32) q_tile[r * q_stride + c] = q[(row_begin + r) * a.q_seq_stride + c];

  // The masks' ranges grow with the row: the block's union runs from its first
  // row's first key to its last row's last, and the keys every row sees from
  // its last row's first to its first row's last.
  const KeyRange range = visible_keys(a, i, lq, lk);
  const KeyRange first_row = visible_keys(a, row_begin, lq, lk);
  const KeyRange last_row = visible_keys(a, row_begin + rows - 1, lq, lk);
  const int block_first = first_row.first, block_last = last_row.last;
  const int inner_first = last_row.first, inner_last = first_row.last;

  float running_max = -INFINITY, running_sum = 0.0f;
  bool saw_key = false;
  for (int tile = block_first / kMinimalKeys * kMinimalKeys; tile <= block_last; tile += kMinimalKeys) {
    for (int r = warp; r < kMinimalKeys; r += kMinimalWarps) {
      const int j = tile + r;
      for (int c = lane; c < d; c += 32) k_tile[r * d + c] = j < lk ? k[j * a.k_seq_stride + c] : 0.0f;
      for (int c = lane; c < dv; c += 32) v_tile[r * dv + c] = j < lk ? v[j * a.v_seq_stride + c] : 0.0f;
    }
    __syncthreads();
    unsigned visible = 0;  // bit n: this row sees key tile + n
    if (active) {
      if (tile >= inner_first && tile + kMinimalKeys - 1 <= inner_last) {
        visible = ~0u;
      } else {
#pragma unroll
        for (int n = 0; n < kMinimalKeys; ++n) visible |= sees(range, tile + n) ? 1u << n : 0u;
      }
    }
    if (visible != 0) {
      float logits[kMinimalKeys];
#pragma unroll
      for (int n = 0; n < kMinimalKeys; ++n) logits[n] = 0.0f;
      const float* q_row = q_tile + static_cast<int>(threadIdx.x) * q_stride;
      for (int c = 0; c < d; ++c) {
        const float q_c = q_row[c];
#pragma unroll
        for (int n = 0; n < kMinimalKeys; ++n) logits[n] += q_c * k_tile[n * d + c];
      }
      float tile_max = -INFINITY;
      bool tile_nan = false;
#pragma unroll
      for (int n = 0; n < kMinimalKeys; ++n) {
        logits[n] *= a.scale;
        if (!(visible >> n & 1u)) continue;
        if (isnan(logits[n])) tile_nan = true;
        else tile_max = fmaxf(tile_max, logits[n]);
      }
      const float grown = tile_nan || isnan(running_max) ? quiet_nan() : fmaxf(running_max, tile_max);
      // While every logit seen is -inf, subtract 0: such keys weigh 0, not NaN.
      const float subtrahend = grown == -INFINITY ? 0.0f : grown;
      const float correction = saw_key ? __expf(running_max - subtrahend) : 0.0f;
      const float kept_sum = running_sum * correction;
      float sum = kept_sum;
#pragma unroll
      for (int n = 0; n < kMinimalKeys; ++n) {
        if (!(visible >> n & 1u)) continue;  // masked keys are absent, never weighted by 0
        logits[n] = __expf(logits[n] - subtrahend);
        sum += logits[n];
      }
      // Global O holds acc / l, the FlashAttention-1 form; while l is 0 (every
      // logit so far -inf) it holds acc itself, so that no 0/0 enters it.
      const float inverse = sum > 0.0f ? 1.0f / sum : 1.0f;
      const float kept = (running_sum > 0.0f ? kept_sum : correction) * inverse;
      for (int c = 0; c < dv; ++c) {
        float weighted = 0.0f;
#pragma unroll
        for (int n = 0; n < kMinimalKeys; ++n)
          if (visible >> n & 1u) weighted += logits[n] * v_tile[n * dv + c];
        // The first tile a row sees must not read O: it still holds the poison.
        out[c] = saw_key ? out[c] * kept + weighted * inverse : weighted * inverse;
      }
      running_max = grown;
      running_sum = sum;
      saw_key = true;
    }
    __syncthreads();  // the next tile overwrites k_tile/v_tile
  }
  if (!active) return;
  float lse;
  if (!saw_key) {  // fully masked, and O never written: O = 0, LSE = -inf
    for (int c = 0; c < dv; ++c) out[c] = 0.0f;
    lse = -INFINITY;
  } else if (!(running_sum > 0.0f)) {  // every visible logit -inf (0/0), or a NaN: the plain formula's NaN
    for (int c = 0; c < dv; ++c) out[c] = quiet_nan();
    lse = quiet_nan();
  } else {
    lse = running_max + logf(running_sum);
  }
  if (a.lse) a.lse[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] = lse;
}

void launch_minimal_rowthread(const gpu::AttentionArgs& args, const gpu::CallSite& site) {
  const dim3 grid(static_cast<unsigned>((static_cast<std::int64_t>(args.seqlen_q) + kMinimalRows - 1) / kMinimalRows),
                  args.heads_q, args.batch);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  const std::size_t shared_bytes = minimal_shared_bytes(args.head_dim, args.head_dim_v);
  if (shared_bytes > 48 * 1024)
    gpu::check(cudaFuncSetAttribute(minimal_rowthread_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared_bytes)),
               "cudaFuncSetAttribute", site);
  minimal_rowthread_kernel<<<grid, kMinimalRows, shared_bytes, args.stream>>>(args);
  gpu::check_launch("minimal_rowthread_kernel", site);
}

constexpr Capabilities kCapabilities = {
    .dtypes = {DType::f32},
    .min_head_dim = 1,
    .max_head_dim = kMinimalMaxHeadDim,
    .max_head_dim_v = kMinimalMaxHeadDim,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .tile_q = kMinimalRows,
    .tile_kv = kMinimalKeys,
    .needs_gpu = true,
    .min_compute_capability = 80,
};

gpu::KernelRegistration registration("minimal-rowthread",
                                      "FlashAttention-1 loop, a thread per query row, O rescaled in global memory per K/V tile (f32)",
                                      kCapabilities, launch_minimal_rowthread);

}  // namespace
}  // namespace flashcheck::kernels
