// The single-stage loop of basic and swizzled (kernels/mma/basic.cu and
// swizzled.cu, whose headers tell their story): one K and one V tile at a
// time; the block waits for both, computes, and only then loads the next pair.
// kSwizzle: tiles stored and read through the XOR swizzle (swizzled) or
// row-major (basic).
#pragma once

#include "common/mask.cuh"
#include "common/softmax.cuh"
#include "mma/epilogue.cuh"
#include "mma/launch.cuh"
#include "mma/products.cuh"
#include "mma/tiles.cuh"

namespace flashcheck::kernels::mma {

template <int D>
inline constexpr int kSingleStageBlockKv = D == 256 ? 32 : 64;

template <typename T, int D, bool kSwizzle>
__global__ void __launch_bounds__(kThreads) single_stage_kernel(const gpu::AttentionArgs a, int bh_base) {
  constexpr int kBlockKv = kSingleStageBlockKv<D>;
  constexpr int kTilesN = kBlockKv / 8, kTilesD = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  // Q [kBlockQ][D] | K [kBlockKv][D] | V [kBlockKv][D], swizzled or not.
  const std::uint32_t q_tile = shared_address(smem);
  const std::uint32_t k_tile = q_tile + kBlockQ * D * 2, v_tile = k_tile + kBlockKv * D * 2;

  const BlockTensors<T> t = block_tensors<T>(a, bh_base);
  if (t.q0 >= t.lq) return;  // past this sequence's end (block-uniform)
  const KeyPlan<kBlockKv> plan = plan_keys<kBlockKv, MaskFlaw::none>(a, t.q0, kBlockQ, t.lq, t.lk);
  const int warp_row = threadIdx.x / 32 * 16;
  const ThreadRows rows = thread_rows<MaskFlaw::none>(a, t.q0 + warp_row, t.lq, t.lk);
  float acc[kTilesD][4] = {};
  RowState state;

  if (plan.begin < plan.end) {
    copy_tile<kBlockQ, D, kSwizzle>(q_tile, t.q, a.q_seq_stride, t.lq - t.q0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    std::uint32_t q[D / 16][4];
    load_q_fragments<D, kSwizzle>(q, q_tile);
    const float scale_log2 = a.scale * 1.4426950408889634f;

    for (int tile = plan.begin; tile < plan.end; ++tile) {
      const int j0 = tile * kBlockKv;
      copy_tile<kBlockKv, D, kSwizzle>(k_tile, t.k + j0 * a.k_seq_stride, a.k_seq_stride, t.lk - j0);
      copy_tile<kBlockKv, D, kSwizzle>(v_tile, t.v + j0 * a.v_seq_stride, a.v_seq_stride, t.lk - j0);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();

      float s[kTilesN][4] = {};
      qk_x2<T, D, kSwizzle>(s, q, k_tile);
      if (!plan.whole(tile)) mask_tile(s, j0, rows.rows);
      std::uint32_t p[kTilesN / 2][4];
      online_softmax<T>(s, state, acc, p, scale_log2);
      pv_x2<T, D, kSwizzle>(acc, p, v_tile);
      __syncthreads();  // the next tile overwrites K and V
    }
  }
  store_rows<T>(a, t.b, t.h, t.q0, t.lq, t.o, warp_row, acc, state);
}

template <bool kSwizzle>
struct SingleStage {
  template <typename T, int D>
  struct Kernel {
    static void launch(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
      launch_mma(single_stage_kernel<T, D, kSwizzle>, (kBlockQ + 2 * kSingleStageBlockKv<D>)*D * 2, a, site,
                 "single_stage_kernel");
    }
  };
};

}  // namespace flashcheck::kernels::mma
