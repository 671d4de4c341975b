// The online softmax on m16n8 C fragments (common/mask.cuh describes the
// layout), for the rows a thread holds: the running maximum and sum, the
// exponentials, O's correction, and P packed as the A operand of the second
// product. Used by
//  - the mma family (kernels/mma/: basic, swizzled, pipelined, ldmatrix_x4,
//    kv_pipelined and its mutants), through online_softmax(), the three steps
//    in a row;
//  - the Hopper kernel (kernels/hopper/softmax.cuh), which calls the steps
//    apart: exponentiate() runs while the previous tile's P V wgmma is in
//    flight, rescale() after it completes, and its epilogue reads RowState.
//
// 2026-11-25 (issue 20): the online softmax's per-tile correction of the row
// sum and O is now exp2 of the difference of the two shifts as rounded, so it
// is exactly 1 while a row's maximum holds. It was contracted by ptxas into an
// fma that returned the shift's own rounding error, and every tile multiplied
// the sum by exp2(-that): at 131072 keys (2048 tiles) LSE drifted by up to
// 3.5e-4 (bound 2.2e-4) on every kernel of the mma family. In the Hopper kernel
// (exponentiate() too, with 128-key tiles) the host emulation gives half that.
// O was unaffected: its factors cancel in acc / sum. docs/perf.md has the host
// emulation's numbers. (Moved here from kernels/mma/mma_common.cuh, unchanged.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention.cuh"
#include "common/ptx.cuh"

namespace flashcheck::kernels {

/// The running state of this thread's two rows: the largest logit so far
/// (unscaled) and the partial sum of this thread's weights (the 4 threads of a
/// row each sum their own columns; they are added once, in the epilogue).
struct RowState {
  float max[2] = {-INFINITY, -INFINITY};
  float sum[2] = {0.0f, 0.0f};
};

/// What O's rows must be multiplied by after a tile: exp(old max - new max).
struct Correction {
  float factor[2];
};

/// The first half of the online softmax, which touches only S and the row
/// state: folds the tile's maxima into the state and turns S into weights
/// exp(scale * (s - max)), summed into the state. scale_log2 = softmax scale *
/// log2(e), so the exponentials are exp2. Returns O's correction, which
/// rescale() applies (the Hopper kernel runs this half while O's product of
/// the previous tile is still in flight, and rescales after it completes).
template <int kTilesN>
__device__ __forceinline__ Correction exponentiate(float (&s)[kTilesN][4], RowState& state, float scale_log2) {
  Correction correction;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt) tile_max = fmaxf(tile_max, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 2));
    const float grown = fmaxf(state.max[r], tile_max);
    // While every key so far is masked, subtract 0: masked weights are then
    // exp2(-inf) = 0, not exp2(-inf + inf) = NaN.
    const float shift = grown == -INFINITY ? 0.0f : __fmul_rn(grown, scale_log2);
    // The weights summed so far are exp2(s * scale_log2 - old shift), the old
    // shift rounded to f32 as above: the correction is exp2(old shift - shift)
    // with both shifts rounded the same way, so exactly 1 while the maximum
    // holds. __fmul_rn keeps ptxas from contracting max * scale_log2 - shift
    // into one fma, whose result is the shift's own rounding error (up to
    // 2^-24 |shift|), not 0: every tile then multiplied the sum and O by
    // exp2(-that), a drift that grows with the number of tiles. O's factors
    // cancel in acc / sum; LSE's do not (issue 20: LSE off by 3.5e-4 at 131072
    // keys; docs/perf.md, 2026-11-25).
    correction.factor[r] = fast_exp2(__fmul_rn(state.max[r], scale_log2) - shift);
    state.max[r] = grown;
    state.sum[r] *= correction.factor[r];
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        s[nt][e] = fast_exp2(fmaf(s[nt][e], scale_log2, -shift));
        state.sum[r] += s[nt][e];
      }
  }
  return correction;
}

/// The second half: O's rows times their correction.
template <int kTilesD>
__device__ __forceinline__ void rescale(float (&o)[kTilesD][4], const Correction& correction) {
#pragma unroll
  for (int dt = 0; dt < kTilesD; ++dt) {
    o[dt][0] *= correction.factor[0];
    o[dt][1] *= correction.factor[0];
    o[dt][2] *= correction.factor[1];
    o[dt][3] *= correction.factor[1];
  }
}

/// The weights packed as the A fragments of the second product (P for 16
/// keys per fragment).
template <typename T, int kTilesN>
__device__ __forceinline__ void to_fragments(const float (&s)[kTilesN][4], std::uint32_t (&p)[kTilesN / 2][4]) {
#pragma unroll
  for (int kk = 0; kk < kTilesN / 2; ++kk) {
    p[kk][0] = pack<T>(s[2 * kk][0], s[2 * kk][1]);
    p[kk][1] = pack<T>(s[2 * kk][2], s[2 * kk][3]);
    p[kk][2] = pack<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    p[kk][3] = pack<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

/// Folds a tile's logits into the state, rescales O and packs the weights:
/// the three steps above in a row.
template <typename T, int kTilesN, int kTilesD>
__device__ __forceinline__ void online_softmax(float (&s)[kTilesN][4], RowState& state, float (&o)[kTilesD][4],
                                               std::uint32_t (&p)[kTilesN / 2][4], float scale_log2) {
  rescale(o, exponentiate(s, state, scale_log2));
  to_fragments<T>(s, p);
}

}  // namespace flashcheck::kernels
