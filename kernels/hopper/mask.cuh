// The Hopper kernel's masking: which key tiles a query tile visits, and the
// -inf mask of the boundary ones. The rules are shared with the mma family
// (kernels/common/mask.cuh: row_keys, plan_keys, mask_tile), which work on
// the m16n8 C layout that each warp's slice of a wgmma m64 accumulator has;
// this file binds them to the Hopper tile and the kernel's flaws.
//  - Tiles wholly outside every row's keys (causal, sliding window, the
//    sequence's end) are never loaded or computed.
//  - Tiles that every row sees whole are not masked.
//  - A boundary tile is masked per element, which includes the keys past the
//    sequence that TMA filled with zeros (S = 0 there is not -inf).
#pragma once

#include "common/mask.cuh"

namespace flashcheck::kernels::hopper {

/// The kernel as written, or with one deliberate flaw (kernels/mutants/hopper_mutants.cu).
enum class HopperFlaw {
  none,
  early_read,      // consumers read the Q stage (refilled every tile) without waiting for its mbarrier
  tail_unmasked,   // the zero-filled keys past the sequence are not masked: S = 0 joins the softmax
  no_proxy_fence,  // O written to shared memory and stored by TMA without fence.proxy.async
  softcap_before_scale,  // the cap taken of the unscaled q.k (C tanh(q.k / C)), the scale applied after it
  fp8_descale_missing,   // fp8: Q's and K's descale factors left out of the logit scale
};

template <int kBlockN, HopperFlaw kFlaw>
struct TileMask {
  static constexpr MaskFlaw kMaskFlaw = kFlaw == HopperFlaw::tail_unmasked ? MaskFlaw::key_tail_unmasked : MaskFlaw::none;

  KeyPlan<kBlockN> plan;
  ThreadRows rows;

  /// The plan of the tile whose rows are [q0, q0 + block_rows), for this
  /// thread's rows, which start at query `warp_row` (row 0 of its warp's m16 slice).
  __device__ __forceinline__ TileMask(const gpu::AttentionArgs& a, int q0, int block_rows, int warp_row, int lq, int lk)
      : plan(plan_keys<kBlockN, kMaskFlaw>(a, q0, block_rows, lq, lk)),
        rows(thread_rows<kMaskFlaw>(a, warp_row, lq, lk)) {}

  template <int kTilesN>
  __device__ __forceinline__ void apply(float (&s)[kTilesN][4], int tile) const {
    if (!plan.whole(tile)) mask_tile(s, tile * kBlockN, rows.rows);
  }
};

}  // namespace flashcheck::kernels::hopper
