// basic: the first tensor-core version (article 002's v1).
//
// What it brings over the fp32 family: tiles move global -> shared with
// cp.async, shared -> registers with ldmatrix, and both products run on the
// tensor cores as mma.m16n8k16 (f16/bf16 in, f32 accumulate). Each warp owns
// 16 query rows, keeps its Q fragments in registers for the whole key loop,
// and keeps the online softmax state (row max, partial sums) and O in
// registers; P goes from the S accumulators straight into A fragments, never
// through shared memory. One K and one V tile at a time: the block waits for
// both, computes, and only then loads the next pair. Shared memory is
// row-major and unswizzled, so every ldmatrix phase hits one bank group.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10 after 3
// warm-ups, 3 input sets; bf16 B=4 H=16 N=M=4096 unless said; TFLOP/s):
//   d=128 56.3, d=128 causal_br 54.0, d=64 55.5, d=256 55.2, f16 d=128 56.4.
//   Registers (ptxas, sm_90a, bf16): 202 (d=128) / 255, 52 B spilled (d=256).
//   The unswizzled ldmatrix phases serialise 8 ways: a fifth of swizzled's speed.
#include "kernels/mma/mma_common.cuh"

namespace flashcheck::kernels::mma {
namespace {

template <int D>
inline constexpr int kBlockKv = D == 256 ? 32 : 64;

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) basic_kernel(const gpu::AttentionArgs a, int bh_base) {
  constexpr int kTilesN = kBlockKv<D> / 8, kTilesD = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  // Q [kBlockQ][D] | K [kBlockKv][D] | V [kBlockKv][D], row-major.
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
    copy_tile<kBlockQ, D, false>(q_tile, t.q, a.q_seq_stride, t.lq - t.q0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    std::uint32_t q[D / 16][4];
    load_q_fragments<D, false>(q, q_tile);
    const float scale_log2 = a.scale * 1.4426950408889634f;

    for (int tile = plan.begin; tile < plan.end; ++tile) {
      const int j0 = tile * kBlockKv<D>;
      copy_tile<kBlockKv<D>, D, false>(k_tile, t.k + j0 * a.k_seq_stride, a.k_seq_stride, t.lk - j0);
      copy_tile<kBlockKv<D>, D, false>(v_tile, t.v + j0 * a.v_seq_stride, a.v_seq_stride, t.lk - j0);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();

      float s[kTilesN][4] = {};
      qk_x2<T, D, false>(s, q, k_tile);
      if (!plan.whole(tile)) mask_tile(s, j0, rows.rows);
      std::uint32_t p[kTilesN / 2][4];
      online_softmax<T>(s, state, acc, p, scale_log2);
      pv_x2<T, D, false>(acc, p, v_tile);
      __syncthreads();  // the next tile overwrites K and V
    }
  }
  store_rows<T>(a, t.b, t.h, t.q0, t.lq, t.o, warp_row, acc, state);
}

template <typename T, int D>
struct Basic {
  static void launch(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
    launch_mma(basic_kernel<T, D>, (kBlockQ + 2 * kBlockKv<D>)*D * 2, a, site, "basic_kernel");
  }
};

void launch_basic(const gpu::AttentionArgs& a, const gpu::CallSite& site) { dispatch<Basic>(a, site); }

gpu::KernelRegistration registration("mma-basic", "mma.sync: cp.async, ldmatrix, m16n8k16, unswizzled (f16/bf16)",
                                     kMmaCapabilities, launch_basic);

}  // namespace
}  // namespace flashcheck::kernels::mma
