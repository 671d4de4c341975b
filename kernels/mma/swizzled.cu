// swizzled: XOR-swizzled shared memory (article 002's v2).
//
// What changed from basic: every tile is stored with its 16-byte chunks
// permuted, chunk c of row r at c ^ (r % 8), and ldmatrix reads through the
// same map. Why: a row of K or V is 128, 256 or 512 bytes, a multiple of the
// 128 bytes the 32 banks span, so the 8 row addresses of one ldmatrix phase
// (8 rows, one column chunk) all fell in the same 4 banks: an 8-way conflict
// on every fragment load. Swizzled, the 8 rows land on 8 different chunks.
// cp.async writes are unaffected (each thread writes whole 16-byte chunks).
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10 after 3
// warm-ups, 3 input sets; bf16 B=4 H=16 N=M=4096 unless said; TFLOP/s):
//   d=128 272.0, d=128 causal_br 251.0, d=64 262.1, d=256 219.6, f16 d=128 272.9.
//   Registers (ptxas, sm_90a, bf16): 223 (d=128) / 255, 28 B spilled (d=256).
//   4.8x basic: the bank conflicts were the whole difference.
#include "kernels/mma/mma_common.cuh"

namespace flashcheck::kernels::mma {
namespace {

template <int D>
inline constexpr int kBlockKv = D == 256 ? 32 : 64;

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) swizzled_kernel(const gpu::AttentionArgs a, int bh_base) {
  constexpr int kTilesN = kBlockKv<D> / 8, kTilesD = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  // Q [kBlockQ][D] | K [kBlockKv][D] | V [kBlockKv][D], swizzled.
  const std::uint32_t q_tile = shared_address(smem);
  const std::uint32_t k_tile = q_tile + kBlockQ * D * 2, v_tile = k_tile + kBlockKv<D> * D * 2;

  const BlockTensors<T> t = block_tensors<T>(a, bh_base);
  if (t.q0 >= t.lq) return;  // past this sequence's end (block-uniform)
  const KeyPlan<kBlockKv<D>> plan = plan_keys<kBlockKv<D>, MmaFlaw::none>(a, t.q0, kBlockQ, t.lq, t.lk);
  const int warp_row = threadIdx.x / 32 * 16;
  const ThreadRows rows = thread_rows<MmaFlaw::none>(a, t.q0 + warp_row, t.lq, t.lk);
  float acc[kTilesD][4] = {};
  RowState state;

  if (plan.begin < plan.end) {
    copy_tile<kBlockQ, D, true>(q_tile, t.q, a.q_seq_stride, t.lq - t.q0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    std::uint32_t q[D / 16][4];
    load_q_fragments<D, true>(q, q_tile);
    const float scale_log2 = a.scale * 1.4426950408889634f;

    for (int tile = plan.begin; tile < plan.end; ++tile) {
      const int j0 = tile * kBlockKv<D>;
      copy_tile<kBlockKv<D>, D, true>(k_tile, t.k + j0 * a.k_seq_stride, a.k_seq_stride, t.lk - j0);
      copy_tile<kBlockKv<D>, D, true>(v_tile, t.v + j0 * a.v_seq_stride, a.v_seq_stride, t.lk - j0);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();

      float s[kTilesN][4] = {};
      qk_x2<T, D, true>(s, q, k_tile);
      if (!plan.whole(tile)) mask_tile(s, j0, rows.rows);
      std::uint32_t p[kTilesN / 2][4];
      online_softmax<T>(s, state, acc, p, scale_log2);
      pv_x2<T, D, true>(acc, p, v_tile);
      __syncthreads();  // the next tile overwrites K and V
    }
  }
  store_rows<T>(a, t.b, t.h, t.q0, t.lq, t.o, warp_row, acc, state);
}

template <typename T, int D>
struct Swizzled {
  static void launch(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
    launch_mma(swizzled_kernel<T, D>, (kBlockQ + 2 * kBlockKv<D>)*D * 2, a, site, "swizzled_kernel");
  }
};

void launch_swizzled(const gpu::AttentionArgs& a, const gpu::CallSite& site) { dispatch<Swizzled>(a, site); }

gpu::KernelRegistration registration("mma-swizzled", "mma.sync: basic with XOR-swizzled shared memory (f16/bf16)",
                                     kMmaCapabilities, launch_swizzled);

}  // namespace
}  // namespace flashcheck::kernels::mma
