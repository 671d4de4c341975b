// warp_rows: a warp per query row, Br rows per block sharing K/V tiles in shared memory.
//
// Lineage: article 000, section 5 (its v2: Br rows per block, a warp each).
// What changes from block_row (a block per row, reading K and V straight from
// global memory): a block holds Br = 8 rows, one per warp, and loads each
// 32-key K/V tile into shared memory once for all of them, so K and V are read
// from global memory once per 8 query rows instead of once per row, and the
// reductions are warp shuffles with no barrier. Within a warp, lane j computes
// the logit of key j of the tile (K rows at an odd stride: no bank conflicts),
// the row max and sum are butterfly shuffles (every lane gets the same bits,
// so the result is deterministic), and lane l owns output columns l, l + 32,
// ... (up to 8 in registers), adding w_n v_n broadcast by shuffle in key order.
// Tiles outside every row's masked range are skipped; a warp tests the mask
// only on tiles its row's range does not cover.
// Domain: f32 storage and arithmetic; d, dv <= 256; any seqlen_q/seqlen_kv
// (tails predicated); none/causal_tl/causal_br/window masks; GQA/MQA; padded
// batches; LSE; BHSD and BSHD.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10):
//   f32 B=4 H=16 N=M=1024 d=64: 9.376 ms, 1.83 TFLOP/s; causal_br 5.483 ms, 1.57 TFLOP/s
//   f32 B=2 H=16 N=M=2048 d=128: 22.824 ms, 3.01 TFLOP/s
//   decode f32 B=16 Hq=32 Hkv=8 Sq=1 Skv=8192 d=128: 4.528 ms
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/attention.cuh"

namespace flashcheck::kernels {
namespace {

constexpr int kWarpRowsRows = 8;   // Br: query rows per block, a warp each
constexpr int kWarpRowsKeys = 32;  // Bc: keys per K/V tile, a lane each
constexpr int kWarpRowsThreads = kWarpRowsRows * 32;
constexpr int kWarpRowsMaxHeadDim = 256;
constexpr int kWarpRowsColumns = kWarpRowsMaxHeadDim / 32;  // output columns per lane
static_assert(kWarpRowsKeys == 32, "lane j takes key j of a tile");
static_assert(kWarpRowsMaxHeadDim % 32 == 0);


// Dynamic shared memory: Q rows [Br][d], K [Bc][d|1], V [Bc][dv] (floats).
std::size_t warp_rows_shared_bytes(int head_dim, int head_dim_v) {
  const std::size_t floats = static_cast<std::size_t>(kWarpRowsRows) * head_dim +
                             static_cast<std::size_t>(kWarpRowsKeys) * ((head_dim | 1) + head_dim_v);
  return floats * sizeof(float);
}

__global__ void __launch_bounds__(kWarpRowsThreads) warp_rows_kernel(const gpu::AttentionArgs a) {
  extern __shared__ float shared[];
  const int b = blockIdx.z, h = blockIdx.y, hk = h / (a.heads_q / a.heads_kv);
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int row_begin = blockIdx.x * kWarpRowsRows;
  if (row_begin >= lq) return;  // the whole block is past this sequence (uniform: safe before barriers)
  const int rows = min(kWarpRowsRows, lq - row_begin);
  const int d = a.head_dim, dv = a.head_dim_v, k_stride = d | 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool active = warp < rows;
  const int i = row_begin + (active ? warp : 0);
  float* q_row = shared + warp * d;
  float* k_tile = shared + kWarpRowsRows * d;
  float* v_tile = k_tile + kWarpRowsKeys * k_stride;
  const float* q = static_cast<const float*>(a.q) + b * a.q_batch_stride + h * a.q_head_stride + i * a.q_seq_stride;
  const float* k = static_cast<const float*>(a.k) + b * a.k_batch_stride + hk * a.k_head_stride;
  const float* v = static_cast<const float*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;

  // Read only after the first tile's barrier.
  if (active)
    for (int c = lane; c < d; c += 32) q_row[c] = q[c];

  // The masks' ranges grow with the row: the block's union runs from its first
  // row's first key to its last row's last.
  const KeyRange range = visible_keys(a, i, lq, lk);
  const int block_first = visible_keys(a, row_begin, lq, lk).first;
  const int block_last = visible_keys(a, row_begin + rows - 1, lq, lk).last;

  float acc[kWarpRowsColumns];
#pragma unroll
  for (int n = 0; n < kWarpRowsColumns; ++n) acc[n] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;
  bool saw_key = false;
  for (int tile = block_first / kWarpRowsKeys * kWarpRowsKeys; tile <= block_last; tile += kWarpRowsKeys) {
    // A warp per key row, lanes along the columns (coalesced); keys past lk are zeros.
    for (int r = warp; r < kWarpRowsKeys; r += kWarpRowsRows) {
      const int j = tile + r;
      for (int c = lane; c < d; c += 32) k_tile[r * k_stride + c] = j < lk ? k[j * a.k_seq_stride + c] : 0.0f;
      for (int c = lane; c < dv; c += 32) v_tile[r * dv + c] = j < lk ? v[j * a.v_seq_stride + c] : 0.0f;
    }
    __syncthreads();
    // Warp-uniform: this row sees some key of the tile.
    if (active && range.first <= range.last && tile <= range.last && tile + kWarpRowsKeys - 1 >= range.first) {
      const bool covered = tile >= range.first && tile + kWarpRowsKeys - 1 <= range.last;
      const bool visible = covered || sees(range, tile + lane);
      const float* key = k_tile + lane * k_stride;
      float dot = 0.0f;
#pragma unroll 4
      for (int c = 0; c < d; ++c) dot += q_row[c] * key[c];
      const float logit = dot * a.scale;
      const unsigned visible_lanes = __ballot_sync(kFullWarp, visible);
      const bool tile_nan = __any_sync(kFullWarp, visible && isnan(logit));
      const float tile_max = warp_max(visible && !isnan(logit) ? logit : -INFINITY);
      const float grown = tile_nan || isnan(running_max) ? quiet_nan() : fmaxf(running_max, tile_max);
      // While every logit seen is -inf, subtract 0: such keys weigh 0, not NaN.
      const float subtrahend = grown == -INFINITY ? 0.0f : grown;
      const float correction = saw_key ? __expf(running_max - subtrahend) : 0.0f;
      const float weight = visible ? __expf(logit - subtrahend) : 0.0f;
      running_sum = running_sum * correction + warp_sum(weight);  // a masked lane adds exactly 0
#pragma unroll
      for (int n = 0; n < kWarpRowsColumns; ++n) acc[n] *= correction;
#pragma unroll
      for (int key_n = 0; key_n < kWarpRowsKeys; ++key_n) {
        const float weight_n = __shfl_sync(kFullWarp, weight, key_n);
        if (!(visible_lanes >> key_n & 1u)) continue;  // masked keys are absent, never weighted by 0
        const float* value_row = v_tile + key_n * dv;
#pragma unroll
        for (int n = 0; n < kWarpRowsColumns; ++n) {
          const int c = lane + 32 * n;
          if (c < dv) acc[n] += weight_n * value_row[c];
        }
      }
      running_max = grown;
      saw_key = true;
    }
    __syncthreads();  // the next tile overwrites k_tile/v_tile
  }
  if (!active) return;
  float* out = static_cast<float*>(a.o) + b * a.o_batch_stride + h * a.o_head_stride + i * a.o_seq_stride;
  float lse;
  if (!saw_key) {  // fully masked: O = 0, LSE = -inf
    for (int c = lane; c < dv; c += 32) out[c] = 0.0f;
    lse = -INFINITY;
  } else if (running_max == -INFINITY) {  // every visible logit -inf: the plain formula's 0/0
    for (int c = lane; c < dv; c += 32) out[c] = quiet_nan();
    lse = quiet_nan();
  } else {
    const float inverse = 1.0f / running_sum;
#pragma unroll
    for (int n = 0; n < kWarpRowsColumns; ++n) {
      const int c = lane + 32 * n;
      if (c < dv) out[c] = acc[n] * inverse;
    }
    lse = running_max + logf(running_sum);
  }
  if (a.lse && lane == 0) a.lse[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] = lse;
}

void launch_warp_rows(const gpu::AttentionArgs& args, const gpu::CallSite& site) {
  const dim3 grid(static_cast<unsigned>((static_cast<std::int64_t>(args.seqlen_q) + kWarpRowsRows - 1) / kWarpRowsRows),
                  args.heads_q, args.batch);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  const std::size_t shared_bytes = warp_rows_shared_bytes(args.head_dim, args.head_dim_v);
  if (shared_bytes > 48 * 1024)
    gpu::check(cudaFuncSetAttribute(warp_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared_bytes)),
               "cudaFuncSetAttribute", site);
  warp_rows_kernel<<<grid, kWarpRowsThreads, shared_bytes, args.stream>>>(args);
  gpu::check_launch("warp_rows_kernel", site);
}

constexpr Capabilities kCapabilities = {
    .dtypes = {DType::f32},
    .min_head_dim = 1,
    .max_head_dim = kWarpRowsMaxHeadDim,
    .max_head_dim_v = kWarpRowsMaxHeadDim,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .tile_q = kWarpRowsRows,
    .tile_kv = kWarpRowsKeys,
    .needs_gpu = true,
    .min_compute_capability = 80,
};

gpu::KernelRegistration registration("warp-rows",
                                      "a warp per query row, 8 rows per block sharing 32-key K/V tiles, shuffle reductions (f32)",
                                      kCapabilities, launch_warp_rows);

}  // namespace
}  // namespace flashcheck::kernels
