// The Hopper kernel's epilogue: O = acc / sum and LSE for a consumer
// warpgroup's 64 rows.
//  - A slab of 64 rows wholly inside the sequence is written to shared
//    memory (the 128-byte swizzle TMA expects), fenced into the async proxy
//    and stored by TMA, one box per 64 columns, issued by one thread.
//  - A slab that crosses the sequence's end (the last tile, or a padded
//    batch's shorter sequence) is stored from registers, row by row, so rows
//    past a sequence's length are never written.
// A row that saw no key has sum 0: O = 0 and LSE = -inf.
#pragma once

#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "hopper/mainloop.cuh"
#include "hopper/scheduler.cuh"

namespace flashcheck::kernels::hopper {

/// Row r's two values of an accumulator fragment, divided by the row's sum and packed.
template <typename T>
__device__ __forceinline__ std::uint32_t normalized(const float (&fragment)[4], int r, bool seen, float inverse) {
  return seen ? pack<T>(fragment[2 * r] * inverse, fragment[2 * r + 1] * inverse) : 0u;
}

/// O is written in Element<T>::Out (bf16 for fp8 inputs), times V's descale
/// (AttentionArgs::v_descale: 1 unless fp8).
template <typename T, int D, HopperFlaw kFlaw>
__device__ __forceinline__ void store_tile(const gpu::AttentionArgs& a, const CUtensorMap& map_o,
                                           const Smem<T, D>& smem, const Tile& tile, int lq, int c,
                                           float (&o)[D / 8][4], const RowState& state) {
  using Out = typename Element<T>::Out;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32 % 4;
  const int row0 = 64 * c + 16 * warp + lane / 4;  // this thread's first row in the tile; the second is row0 + 8
  const bool elected = threadIdx.x % 128 == 0;
  float inverse[2];
  bool seen[2];  // O's registers are undefined for a row (a tile) that saw no key
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = state.sum[r];
    sum += __shfl_xor_sync(kFullWarp, sum, 1);
    sum += __shfl_xor_sync(kFullWarp, sum, 2);
    seen[r] = sum > 0.0f;
    inverse[r] = seen[r] ? a.v_descale / sum : 0.0f;
    const int i = tile.q0 + row0 + 8 * r;
    if (a.lse && lane % 4 == 0 && i < lq)
      a.lse[(static_cast<std::int64_t>(tile.b) * a.heads_q + tile.h) * a.seqlen_q + i] =
          sum > 0.0f ? state.max[r] * logit_scale<kFlaw>(a) + logf(sum) : -INFINITY;
  }

  if (tile.q0 + 64 * c + 64 <= lq) {
    if (elected) bulk_wait_read<0>();  // the previous tile's store has read the staging buffer
    warpgroup_sync(1 + c);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        const std::uint32_t at = smem.o() + (dt / 8) * kBlockM * 128 + row * 128 +
                                 ((static_cast<std::uint32_t>(dt % 8) ^ (row & 7)) << 4) + lane % 4 * 4;
        store_shared(at, normalized<Out>(o[dt], r, seen[r], inverse[r]));
      }
    if constexpr (kFlaw != HopperFlaw::no_proxy_fence) fence_proxy_async();
    warpgroup_sync(1 + c);
    if (elected) {
      for (int p = 0; p < D / 64; ++p)
        tma_store_4d(&map_o, smem.o() + p * kBlockM * 128 + c * 64 * 128, 64 * p, tile.q0 + 64 * c, tile.h, tile.b);
      bulk_commit();
    }
    return;
  }
  Out* out = static_cast<Out*>(a.o) + tile.b * a.o_batch_stride + tile.h * a.o_head_stride + lane % 4 * 2;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = tile.q0 + row0 + 8 * r;
    if (i >= lq) continue;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<std::uint32_t*>(out + i * a.o_seq_stride + dt * 8) = normalized<Out>(o[dt], r, seen[r], inverse[r]);
  }
}

}  // namespace flashcheck::kernels::hopper
