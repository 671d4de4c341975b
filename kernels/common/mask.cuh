// Which keys a query block visits, and the -inf mask of the boundary tiles, on
// the m16n8 C fragment layout: lane l of a warp holds rows l/4 and l/4 + 8 of
// an m16 tile, at columns 2(l%4) and 2(l%4) + 1 of each n8 tile. That is the
// layout of an mma.m16n8k16 accumulator and of each warp's slice of a wgmma
// m64 accumulator, so both families use this file:
//  - the mma family (kernels/mma/: basic, swizzled, pipelined, ldmatrix_x4,
//    kv_pipelined and its mutants, kernels/mutants/mma_mutants.cu);
//  - the Hopper kernel (kernels/hopper/mask.cuh binds it to its tile and its
//    flaws; kernel.cuh's producer plans with plan_keys).
// The rules are visible_keys()'s (common/attention.cuh), per block: a tile
// outside every row's keys is skipped, a tile every row sees whole is not
// masked, a boundary tile is masked per element.
#pragma once

#include <cuda_runtime.h>

#include <climits>

#include "common/attention.cuh"

namespace flashcheck::kernels {

/// The mask's deliberate flaws, for the mutants: kv_pipelined's
/// (kernels/mma/kv_pipelined_kernel.cuh: mask_flaw) and Hopper's
/// (kernels/hopper/mask.cuh); `none` is the real mask.
enum class MaskFlaw {
  none,
  br_as_tl,           // bottom-right causal computed as top-left
  key_tail_unmasked,  // keys past the sequence's end in the last tile are not masked
  window_off_by_one,  // the sliding window sees one key too many on its left
};

/// The keys [first, last] query i sees (empty when first > last), as
/// visible_keys(), with a flaw applied for the mutants.
template <MaskFlaw kFlaw>
__device__ __forceinline__ KeyRange row_keys(const gpu::AttentionArgs& a, int i, int lq, int lk) {
  const int diagonal = i + lk - lq;
  KeyRange range{0, kFlaw == MaskFlaw::key_tail_unmasked ? INT_MAX : lk - 1};
  if (a.mask == kMaskCausalTopLeft) range.last = min(range.last, i);
  if (a.mask == kMaskCausalBottomRight) range.last = min(range.last, kFlaw == MaskFlaw::br_as_tl ? i : diagonal);
  if (a.mask == kMaskWindow) {
    if (a.window_left >= 0)
      range.first = max(range.first, diagonal - a.window_left - (kFlaw == MaskFlaw::window_off_by_one ? 1 : 0));
    if (a.window_right >= 0) range.last = min(range.last, diagonal + a.window_right);
  }
  return range;
}

/// A query block's key tiles: it visits tiles [begin, end); a tile inside
/// `inner` (and inside the sequence) is seen whole by every row of the block
/// and needs no mask. Every mask's first and last key grow with the row, so
/// the block's union of keys runs from its first row's first key to its last
/// row's last, and its intersection from the last row's first to the first
/// row's last.
template <int kBlockKv>
struct KeyPlan {
  int begin, end;
  KeyRange inner;
  int lk;
  bool tail_masked;

  __device__ __forceinline__ bool whole(int tile) const {
    const int j0 = tile * kBlockKv;
    return j0 >= inner.first && j0 + kBlockKv - 1 <= inner.last && (!tail_masked || j0 + kBlockKv <= lk);
  }
};

/// The plan of the block whose rows are [q0, q0 + rows) (clipped to lq).
template <int kBlockKv, MaskFlaw kFlaw>
__device__ __forceinline__ KeyPlan<kBlockKv> plan_keys(const gpu::AttentionArgs& a, int q0, int rows, int lq, int lk) {
  KeyPlan<kBlockKv> plan;
  const int q_last = min(q0 + rows, lq) - 1;
  const KeyRange top = row_keys<kFlaw>(a, q0, lq, lk), bottom = row_keys<kFlaw>(a, q_last, lq, lk);
  const int first = max(top.first, 0), last = min(bottom.last, lk - 1);
  plan.begin = first / kBlockKv;
  plan.end = first <= last ? last / kBlockKv + 1 : plan.begin;
  plan.inner = {bottom.first, top.last};
  plan.lk = lk;
  plan.tail_masked = kFlaw != MaskFlaw::key_tail_unmasked;
  return plan;
}

/// The key ranges of this thread's two rows in an m16 tile whose row 0 is
/// query `tile_row` (the thread holds rows lane/4 and lane/4 + 8), for the
/// boundary tiles' masks.
struct ThreadRows {
  KeyRange rows[2];
};

template <MaskFlaw kFlaw>
__device__ __forceinline__ ThreadRows thread_rows(const gpu::AttentionArgs& a, int tile_row, int lq, int lk) {
  const int row = tile_row + static_cast<int>(threadIdx.x) % 32 / 4;
  return {{row_keys<kFlaw>(a, row, lq, lk), row_keys<kFlaw>(a, row + 8, lq, lk)}};
}

/// Sets the logits of keys a row does not see to -inf, in a boundary tile's S
/// fragments (keys j0 ... j0 + 8 * kTilesN - 1).
template <int kTilesN>
__device__ __forceinline__ void mask_tile(float (&s)[kTilesN][4], int j0, const KeyRange (&rows)[2]) {
  const int column = j0 + threadIdx.x % 4 * 2;
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (!sees(rows[e / 2], column + nt * 8 + e % 2)) s[nt][e] = -INFINITY;
}

}  // namespace flashcheck::kernels
