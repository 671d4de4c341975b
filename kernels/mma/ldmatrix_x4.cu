// ldmatrix_x4: four 8x8 matrices per ldmatrix for K and V (article 002's v4).
//
// What changed from pipelined: the fragments of K come in as 8 keys x 32 dims
// (two k-steps) per ldmatrix.x4, and those of V as 16 keys x 16 dims (two
// n-tiles) per ldmatrix.x4.trans, instead of one x2 per mma. Why: Q already
// sits in registers, so the products are bound by issuing B-fragment loads;
// x4 halves the ldmatrix instructions (and their address arithmetic) for the
// same bytes.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10 after 3
// warm-ups, 3 input sets; bf16 B=4 H=16 N=M=4096 unless said; TFLOP/s):
//   d=128 288.6, d=128 causal_br 266.9, d=64 234.8, d=256 214.9, f16 d=128 288.1.
//   Registers (ptxas, sm_90a, bf16): 255, 8 B spilled (d=128) / 255, 120 B spilled (d=256).
//   Within noise of pipelined: halving the ldmatrix count did not move it,
// the loop is not bound by issuing them.
#include "kernels/mma/mma_common.cuh"

namespace flashcheck::kernels::mma {
namespace {

template <int D>
inline constexpr int kBlockKv = D == 256 ? 32 : 64;

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) ldmatrix_x4_kernel(const gpu::AttentionArgs a, int bh_base) {
  constexpr int kTilesN = kBlockKv<D> / 8, kTilesD = D / 8;
  constexpr std::uint32_t kKvTileBytes = kBlockKv<D> * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  // Q [kBlockQ][D] | K [2][kBlockKv][D] | V [2][kBlockKv][D], swizzled.
  const std::uint32_t q_tile = shared_address(smem);
  const std::uint32_t k_tiles = q_tile + kBlockQ * D * 2, v_tiles = k_tiles + 2 * kKvTileBytes;

  const BlockTensors<T> t = block_tensors<T>(a, bh_base);
  if (t.q0 >= t.lq) return;  // past this sequence's end (block-uniform)
  const KeyPlan<kBlockKv<D>> plan = plan_keys<kBlockKv<D>, MmaFlaw::none>(a, t.q0, kBlockQ, t.lq, t.lk);
  const int warp_row = threadIdx.x / 32 * 16;
  const ThreadRows rows = thread_rows<MmaFlaw::none>(a, t.q0 + warp_row, t.lq, t.lk);
  float acc[kTilesD][4] = {};
  RowState state;

  // Starts the copies of K and V tile `tile` into buffer `stage`, as two
  // groups; empty groups past the last tile keep the waits' counts uniform.
  const auto prefetch = [&](int tile, int stage) {
    const int j0 = tile * kBlockKv<D>;
    if (tile < plan.end)
      copy_tile<kBlockKv<D>, D, true>(k_tiles + stage * kKvTileBytes, t.k + j0 * a.k_seq_stride, a.k_seq_stride,
                                      t.lk - j0);
    cp_async_commit();
    if (tile < plan.end)
      copy_tile<kBlockKv<D>, D, true>(v_tiles + stage * kKvTileBytes, t.v + j0 * a.v_seq_stride, a.v_seq_stride,
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
      const int j0 = tile * kBlockKv<D>;
      prefetch(tile + 1, stage ^ 1);  // that buffer's readers finished before the last barrier
      cp_async_wait<3>();             // this tile's K has landed (its V and the next pair may not)
      __syncthreads();

      float s[kTilesN][4] = {};
      qk_x4<T, D, true>(s, q, k_tiles + stage * kKvTileBytes);
      if (!plan.whole(tile)) mask_tile(s, j0, rows.rows);
      std::uint32_t p[kTilesN / 2][4];
      online_softmax<T>(s, state, acc, p, scale_log2);

      cp_async_wait<2>();  // this tile's V has landed
      __syncthreads();
      pv_x4<T, D, true>(acc, p, v_tiles + stage * kKvTileBytes);
      __syncthreads();  // the next iteration prefetches into this stage
    }
  }
  store_rows<T>(a, t.b, t.h, t.q0, t.lq, t.o, warp_row, acc, state);
}

template <typename T, int D>
struct LdmatrixX4 {
  static void launch(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
    launch_mma(ldmatrix_x4_kernel<T, D>, (kBlockQ + 4 * kBlockKv<D>)*D * 2, a, site, "ldmatrix_x4_kernel");
  }
};

void launch_ldmatrix_x4(const gpu::AttentionArgs& a, const gpu::CallSite& site) { dispatch<LdmatrixX4>(a, site); }

gpu::KernelRegistration registration("mma-ldmatrix-x4", "mma.sync: pipelined with ldmatrix.x4 for K and V (f16/bf16)",
                                     kMmaCapabilities, launch_ldmatrix_x4);

}  // namespace
}  // namespace flashcheck::kernels::mma
