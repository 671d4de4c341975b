// kv_pipelined's kernel (included by kv_pipelined.cu and the mutants in
// kernels/mutants/mma_mutants.cu), with the flaws its mutants are built with;
// kv_pipelined.cu's header tells its story.
#pragma once

#include "common/mask.cuh"
#include "common/softmax.cuh"
#include "mma/epilogue.cuh"
#include "mma/launch.cuh"
#include "mma/ptx.cuh"
#include "mma/tiles.cuh"

namespace flashcheck::kernels::mma {

/// Deliberate flaws of the flagship kv_pipelined, for its mutants
/// (kernels/mutants/mma_mutants.cu); `none` is the real kernel.
enum class MmaFlaw {
  none,
  swizzle_write_only,  // tiles written swizzled, read as if they were not
  short_wait,          // every cp.async wait allows one group too many in flight (a race)
  br_as_tl,            // bottom-right causal computed as top-left
  key_tail_unmasked,   // keys past the sequence's end in the last tile are not masked
  window_off_by_one,   // the sliding window sees one key too many on its left
  truncating_epilogue, // bf16 O rounded toward zero in the epilogue instead of to nearest
};

/// The mask's share of a flaw (common/mask.cuh applies it).
constexpr MaskFlaw mask_flaw(MmaFlaw flaw) {
  switch (flaw) {
    case MmaFlaw::br_as_tl: return MaskFlaw::br_as_tl;
    case MmaFlaw::key_tail_unmasked: return MaskFlaw::key_tail_unmasked;
    case MmaFlaw::window_off_by_one: return MaskFlaw::window_off_by_one;
    default: return MaskFlaw::none;
  }
}

/// A block's geometry: kM m16 tiles a warp (kM x 16 query rows) and kWarps
/// warps.
template <int kMTiles, int kBlockWarps>
struct KvGeometry {
  static constexpr int kM = kMTiles, kWarps = kBlockWarps, kThreads = 32 * kBlockWarps;
  static constexpr int kRows = 16 * kMTiles * kBlockWarps;
};
/// The geometry at head dim D: 32 query rows a warp (two m16 tiles; 16 at d =
/// 256, where a second tile's O accumulators would not fit in registers), 4
/// warps (8 at d = 256, so that a block still owns 128 rows): 128 query rows
/// x 64-key tiles at every head dim, FlashAttention-2's forward tile on sm_90.
template <int D>
using KvDefault = KvGeometry<D == 256 ? 1 : 2, D == 256 ? 8 : kWarps>;
inline constexpr int kKvBlockKv = 64;

/// S += Q K^T for the warp's kM m16 tiles. Q fragments come from shared memory
/// per 32 dims (two k-steps, one ldmatrix.x4 each per m-tile); each K fragment
/// (8 keys x 32 dims, one ldmatrix.x4) feeds 2 kM mma.
template <typename T, int D, bool kSwizzle, int kM, int kTilesN>
__device__ __forceinline__ void qk_shared(float (&s)[kM][kTilesN][4], std::uint32_t q_tile, std::uint32_t k_tile) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < D / 32; ++kk) {
    std::uint32_t q[kM][2][4];
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        ldmatrix_x4(q[m][half], q_tile + tile_offset<D, kSwizzle>((warp * kM + m) * 16 + lane % 16,
                                                                   kk * 32 + half * 16 + lane / 16 * 8));
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt) {
      std::uint32_t kf[4];
      ldmatrix_x4(kf, k_tile + tile_offset<D, kSwizzle>(nt * 8 + lane % 8, kk * 32 + lane / 8 * 8));
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma_16816<T>(s[m][nt], q[m][0], kf[0], kf[1]);
        mma_16816<T>(s[m][nt], q[m][1], kf[2], kf[3]);
      }
    }
  }
}

/// O += P V for the warp's kM m16 tiles; each V fragment (16 keys x 16 dims,
/// one ldmatrix.x4.trans) feeds 2 kM mma.
template <typename T, int D, bool kSwizzle, int kM, int kTilesK>
__device__ __forceinline__ void pv_shared(float (&o)[kM][D / 8][4], const std::uint32_t (&p)[kM][kTilesK][4],
                                          std::uint32_t v_tile) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kTilesK; ++kk)
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt) {
      std::uint32_t vf[4];
      ldmatrix_x4_trans(vf, v_tile + tile_offset<D, kSwizzle>(kk * 16 + lane % 16, dt * 16 + lane / 16 * 8));
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma_16816<T>(o[m][2 * dt], p[m][kk], vf[0], vf[1]);
        mma_16816<T>(o[m][2 * dt + 1], p[m][kk], vf[2], vf[3]);
      }
    }
}

// Launch bounds: G::kThreads, at least one block an SM (ptxas may then take
// up to 255 registers a thread at every geometry).
template <typename T, int D, MmaFlaw kFlaw, int kBlockKv, typename G>
__global__ void __launch_bounds__(G::kThreads, 1) kv_pipelined_kernel(const gpu::AttentionArgs a, int bh_base) {
  constexpr int kM = G::kM, kRows = G::kRows, kBlockThreads = G::kThreads;
  constexpr int kTilesN = kBlockKv / 8, kTilesD = D / 8;
  constexpr std::uint32_t kKvTileBytes = kBlockKv * D * 2;
  constexpr bool kReadSwizzled = kFlaw != MmaFlaw::swizzle_write_only;
  constexpr int kSlack = kFlaw == MmaFlaw::short_wait ? 1 : 0;  // the flaw: each wait leaves one group too many
  extern __shared__ __align__(128) unsigned char smem[];
  // Q [kRows][D] | K [2][kBlockKv][D] | V [kBlockKv][D], all swizzled.
  const std::uint32_t q_tile = shared_address(smem);
  const std::uint32_t k_tiles = q_tile + kRows * D * 2, v_tile = k_tiles + 2 * kKvTileBytes;

  const BlockTensors<T> t = block_tensors<T, kRows>(a, bh_base);
  if (t.q0 >= t.lq) return;  // past this sequence's end (block-uniform)
  const KeyPlan<kBlockKv> plan = plan_keys<kBlockKv, mask_flaw(kFlaw)>(a, t.q0, kRows, t.lq, t.lk);
  const int warp_row = threadIdx.x / 32 * 16 * kM;
  float acc[kM][kTilesD][4] = {};
  RowState state[kM];

  if (plan.begin < plan.end) {
    ThreadRows rows[kM];
#pragma unroll
    for (int m = 0; m < kM; ++m) rows[m] = thread_rows<mask_flaw(kFlaw)>(a, t.q0 + warp_row + 16 * m, t.lq, t.lk);
    const float scale_log2 = a.scale * 1.4426950408889634f;
    copy_tile<kRows, D, true, T, kBlockThreads>(q_tile, t.q, a.q_seq_stride, t.lq - t.q0);
    cp_async_commit();
    copy_tile<kBlockKv, D, true, T, kBlockThreads>(
        k_tiles, t.k + static_cast<std::int64_t>(plan.begin) * kBlockKv * a.k_seq_stride, a.k_seq_stride,
        t.lk - plan.begin * kBlockKv);
    cp_async_commit();

    // Two barriers a tile. Past the first, this tile's K (and Q) have
    // landed, and every warp is done with the tile before (its P V read V's
    // buffer, its S the other K buffer), so V's and the next K's copies may
    // overwrite them; past the second, V has landed.
    for (int tile = plan.begin; tile < plan.end; ++tile) {
      const int j0 = tile * kBlockKv;
      const std::uint32_t k_tile = k_tiles + ((tile - plan.begin) & 1) * kKvTileBytes;
      cp_async_wait<kSlack>();  // Q and this K tile have landed
      __syncthreads();
      // V of this tile streams in while the first product runs.
      copy_tile<kBlockKv, D, true, T, kBlockThreads>(v_tile, t.v + j0 * a.v_seq_stride, a.v_seq_stride, t.lk - j0);
      cp_async_commit();

      float s[kM][kTilesN][4] = {};
      qk_shared<T, D, kReadSwizzled>(s, q_tile, k_tile);

      // The next K tile streams into the other buffer during softmax and P V
      // (that buffer's last reader, the previous tile's S, is behind the first
      // barrier). The group is committed even when empty, so that the waits'
      // counts hold on the last tile too.
      if (tile + 1 < plan.end)
        copy_tile<kBlockKv, D, true, T, kBlockThreads>(k_tiles + ((tile + 1 - plan.begin) & 1) * kKvTileBytes,
                                                       t.k + (j0 + kBlockKv) * a.k_seq_stride, a.k_seq_stride,
                                                       t.lk - j0 - kBlockKv);
      cp_async_commit();

      std::uint32_t p[kM][kTilesN / 2][4];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (!plan.whole(tile)) mask_tile(s[m], j0, rows[m].rows);
        online_softmax<T>(s[m], state[m], acc[m], p[m], scale_log2);
      }

      cp_async_wait<1 + kSlack>();  // V has landed; the next K may be in flight
      __syncthreads();
      pv_shared<T, D, kReadSwizzled>(acc, p, v_tile);
    }
  }
#pragma unroll
  for (int m = 0; m < kM; ++m)
    store_rows<T, kTilesD, kFlaw == MmaFlaw::truncating_epilogue>(a, t.b, t.h, t.q0, t.lq, t.o, warp_row + 16 * m,
                                                                  acc[m], state[m]);
}

/// d = 128 without a mask: 8 warps of 32 rows, 256 query rows a block, so
/// that each K and V tile copied serves twice the rows (one block an SM, as
/// the default's two of 4 warps). Under a mask the larger block computes more
/// of the diagonal's masked logits, and it measured slower there (and at
/// d = 64); docs/perf.md, "mma-kv-pipelined versions 3 and 4".
using KvWide128 = KvGeometry<2, 8>;

template <typename T, int D, MmaFlaw kFlaw, int kBlockKv = kKvBlockKv>
struct KvPipelined {
  template <typename G>
  static void launch_with(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
    constexpr int kSmem = (G::kRows + 3 * kBlockKv) * D * 2;
    launch_mma(kv_pipelined_kernel<T, D, kFlaw, kBlockKv, G>, kSmem, a, site, "kv_pipelined_kernel", G::kRows,
               G::kThreads);
  }
  static void launch(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
    if constexpr (D == 128) {
      if (a.mask == kMaskNone) return launch_with<KvWide128>(a, site);
    }
    launch_with<KvDefault<D>>(a, site);
  }
};

template <MmaFlaw kFlaw>
struct KvPipelinedWith {
  template <typename T, int D>
  using Kernel = KvPipelined<T, D, kFlaw>;
};

/// Enqueues kv_pipelined (with a flaw, for the mutants) on args.stream.
template <MmaFlaw kFlaw>
void launch_kv_pipelined(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  dispatch<KvPipelinedWith<kFlaw>::template Kernel>(a, site);
}

}  // namespace flashcheck::kernels::mma
