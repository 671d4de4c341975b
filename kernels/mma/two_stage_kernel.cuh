// The two-stage loop of pipelined and ldmatrix_x4 (kernels/mma/pipelined.cu
// and ldmatrix_x4.cu, whose headers tell their story): K and V each have two
// swizzled buffers, and tile n + 1's copies (a K group, then a V group) are in
// flight while tile n computes. kX4: the products load fragments with
// ldmatrix.x4 (ldmatrix_x4) or one ldmatrix.x2 per mma (pipelined).
#pragma once

#include "common/mask.cuh"
#include "common/softmax.cuh"
#include "mma/epilogue.cuh"
#include "mma/launch.cuh"
#include "mma/products.cuh"
#include "mma/tiles.cuh"

namespace flashcheck::kernels::mma {

template <int D>
inline constexpr int kTwoStageBlockKv = D == 256 ? 32 : 64;

template <typename T, int D, bool kX4>
__global__ void __launch_bounds__(kThreads) two_stage_kernel(const gpu::AttentionArgs a, int bh_base) {
  constexpr int kBlockKv = kTwoStageBlockKv<D>;
  constexpr int kTilesN = kBlockKv / 8, kTilesD = D / 8;
  constexpr std::uint32_t kKvTileBytes = kBlockKv * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  // Q [kBlockQ][D] | K [2][kBlockKv][D] | V [2][kBlockKv][D], swizzled.
  const std::uint32_t q_tile = shared_address(smem);
  const std::uint32_t k_tiles = q_tile + kBlockQ * D * 2, v_tiles = k_tiles + 2 * kKvTileBytes;

  const BlockTensors<T> t = block_tensors<T>(a, bh_base);
  if (t.q0 >= t.lq) return;  // past this sequence's end (block-uniform)
  const KeyPlan<kBlockKv> plan = plan_keys<kBlockKv, MaskFlaw::none>(a, t.q0, kBlockQ, t.lq, t.lk);
  const int warp_row = threadIdx.x / 32 * 16;
  const ThreadRows rows = thread_rows<MaskFlaw::none>(a, t.q0 + warp_row, t.lq, t.lk);
  float acc[kTilesD][4] = {};
  RowState state;

  // Starts the copies of K and V tile `tile` into buffer `stage`, as two
  // groups; empty groups past the last tile keep the waits' counts uniform.
  const auto prefetch = [&](int tile, int stage) {
    const int j0 = tile * kBlockKv;
    if (tile < plan.end)
      copy_tile<kBlockKv, D, true>(k_tiles + stage * kKvTileBytes, t.k + j0 * a.k_seq_stride, a.k_seq_stride,
                                      t.lk - j0);
    cp_async_commit();
    if (tile < plan.end)
      copy_tile<kBlockKv, D, true>(v_tiles + stage * kKvTileBytes, t.v + j0 * a.v_seq_stride, a.v_seq_stride,
                                      t.lk - j0);
    cp_async_commit();
  };

  if (plan.begin < plan.end) {
    copy_tile<kBlockQ, D, true>(q_tile, t.q, a.q_seq_stride, t.lq - t.q0);
    cp_async_commit();
    prefetch(plan.begin, 0);
    cp_async_wait<2>();  // Q has landed; the first K and V may be in flight
    __syncthreads();
    std::uint32_t q[D / 16][4];
    load_q_fragments<D, true>(q, q_tile);
    const float scale_log2 = a.scale * 1.4426950408889634f;

    for (int tile = plan.begin; tile < plan.end; ++tile) {
      const int stage = (tile - plan.begin) & 1;
      const int j0 = tile * kBlockKv;
      prefetch(tile + 1, stage ^ 1);  // that buffer's readers finished before the last barrier
      cp_async_wait<3>();             // this tile's K has landed (its V and the next pair may not)
      __syncthreads();

      float s[kTilesN][4] = {};
      if constexpr (kX4) qk_x4<T, D, true>(s, q, k_tiles + stage * kKvTileBytes);
      else qk_x2<T, D, true>(s, q, k_tiles + stage * kKvTileBytes);
      if (!plan.whole(tile)) mask_tile(s, j0, rows.rows);
      std::uint32_t p[kTilesN / 2][4];
      online_softmax<T>(s, state, acc, p, scale_log2);

      cp_async_wait<2>();  // this tile's V has landed
      __syncthreads();
      if constexpr (kX4) pv_x4<T, D, true>(acc, p, v_tiles + stage * kKvTileBytes);
      else pv_x2<T, D, true>(acc, p, v_tiles + stage * kKvTileBytes);
      __syncthreads();  // the next iteration prefetches into this stage
    }
  }
  store_rows<T>(a, t.b, t.h, t.q0, t.lq, t.o, warp_row, acc, state);
}

template <bool kX4>
struct TwoStage {
  template <typename T, int D>
  struct Kernel {
    static void launch(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
      launch_mma(two_stage_kernel<T, D, kX4>, (kBlockQ + 4 * kTwoStageBlockKv<D>)*D * 2, a, site, "two_stage_kernel");
    }
  };
};

}  // namespace flashcheck::kernels::mma
