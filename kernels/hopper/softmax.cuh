// The Hopper kernel's online softmax. The arithmetic is shared with the mma
// family (kernels/common/softmax.cuh), on the m16n8 C layout each warp's
// slice of a wgmma accumulator has. What is Hopper's own is the split, which
// lets the softmax of tile j run while the tensor cores compute O += P V of
// tile j - 1 (FlashAttention-3's intra-warpgroup overlap):
//   exponentiate(S_j)   max, exp2 and row sums: touches S and the row state only,
//                       so it may run while the PV wgmma reads P_{j-1} and writes O;
//   rescale(O)          O *= exp(old max - new max), after that wgmma completes;
//   to_fragments(S_j)   P_j as the register A operand of the next PV wgmma.
// A logit softcap (AttentionArgs::softcap, C > 0) comes first, on the tile's
// products before the mask: s <- C tanh(scale s / C), after which the
// softmax's scale is 1 (FlashAttention-3 folds the scale into the cap the
// same way). tanh is relative-accurate everywhere, as the cap multiplies it
// back: for |x| < 1/4 its series to x^9 (the next term is below 2^-26 of
// tanh there), beyond 1 - 2 / (exp2(2 x log2 e) + 1) on ex2.approx (relative
// error below 2^-19). tanh.approx.f32's relative 2^-11 would move a logit of
// 30 by 0.015, several times bf16's rounding of P; and the exp form alone
// loses all relative accuracy near 0, where a large cap puts every logit
// (measured: softcap=131072 moved an LSE by 5e-3, SoftcapToInfinityIsNone).
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "common/softmax.cuh"
#include "hopper/mask.cuh"

namespace flashcheck::kernels::hopper {

/// tanh(x) with a relative error below 2^-19 (see the file's header). Saturates
/// to +-1 (exp2 overflows to inf, whose reciprocal is 0); NaN stays NaN.
__device__ __forceinline__ float softcap_tanh(float x) {
  const float x2 = x * x;
  const float series =
      fmaf(x * x2, fmaf(x2, fmaf(x2, fmaf(x2, 62.0f / 2835.0f, -17.0f / 315.0f), 2.0f / 15.0f), -1.0f / 3.0f), x);
  const float e = fast_exp2(x * 2.8853900817779268f);  // exp(2x)
  const float far = 1.0f - __fdividef(2.0f, e + 1.0f);
  return fabsf(x) < 0.25f ? series : far;
}

/// The factor between the logits the softmax sees and the scaled logits: the
/// scale, or 1 once a softcap has applied it (the mutant caps unscaled logits).
template <HopperFlaw kFlaw>
__device__ __forceinline__ float logit_scale(const gpu::AttentionArgs& a) {
  return a.softcap > 0.0f && kFlaw != HopperFlaw::softcap_before_scale ? 1.0f : a.scale;
}

/// The largest of row r's values in a tile (s[nt][2r] and s[nt][2r + 1] for
/// every nt), as a tree of depth log2(2 kTilesN).
template <int kWidth, int kTilesN>
__device__ __forceinline__ void fold_max(float (&m)[kTilesN]) {
  if constexpr (kWidth > 0) {  // a level of the tree per instantiation: ptxas kept a runtime loop in local memory
#pragma unroll
    for (int i = 0; i < kWidth; ++i) m[i] = fmaxf(m[i], m[i + kWidth]);
    fold_max<kWidth / 2>(m);
  }
}

template <int kTilesN>
__device__ __forceinline__ float tree_max(const float (&s)[kTilesN][4], int r) {
  float m[kTilesN];
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt) m[nt] = fmaxf(s[nt][2 * r], s[nt][2 * r + 1]);
  fold_max<kTilesN / 2>(m);
  return m[0];
}

/// O's correction after a tile (Correction's factors) and whether any row of
/// the warp has a factor other than 1 (warp-uniform: O is rescaled only then).
struct TileCorrection : Correction {
  bool any = true;
};

struct OnlineSoftmax {
  RowState state;
  float scale_log2;   // the logit scale * log2(e): the exponentials are exp2
  float cap = 0.0f;   // the softcap C (0: none)
  float cap_in;       // what s is multiplied by inside the tanh: scale / C

  template <HopperFlaw kFlaw>
  __device__ __forceinline__ static OnlineSoftmax make(const gpu::AttentionArgs& a) {
    OnlineSoftmax softmax;
    softmax.scale_log2 = logit_scale<kFlaw>(a) * 1.4426950408889634f;
    softmax.cap = a.softcap;
    softmax.cap_in = (kFlaw == HopperFlaw::softcap_before_scale ? 1.0f : a.scale) / a.softcap;
    return softmax;
  }

  /// The softcap on a tile of products (before its mask: a masked -inf is set after).
  template <int kTilesN>
  __device__ __forceinline__ void apply_softcap(float (&s)[kTilesN][4]) const {
    if (cap == 0.0f) return;  // block-uniform
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = cap * softcap_tanh(s[nt][e] * cap_in);
  }

  /// exponentiate() moves a row's reference (the maximum its weights are
  /// taken against) only when the tile's maximum exceeds it by more than 2^8
  /// in weight (FlashAttention-4's conditional rescaling): otherwise the row
  /// keeps its reference, its weights may reach 2^8 (finite in every format P
  /// is rounded to: f16, bf16, e4m3's 448, e5m2), and O needs no rescale.
  /// After the first tiles of a row almost no tile moves it, so the
  /// consumers skip O's 64 multiplies a tile (TileCorrection::any). LSE is
  /// the reference's logit plus log(sum) whichever reference holds.
  /// Not for fp8 (kKeepReference false: the reference is the running
  /// maximum, as in FlashAttention-3's and cuDNN's fp8 kernels and v2): P is
  /// rounded to a format with 3 (e4m3) or 2 (e5m2) fraction bits, and a kept
  /// reference, a factor other than a power of two from the running maximum,
  /// rounds every weight at another point of its binade. Where many logits
  /// tie, those errors do not average out: hopper-fp8 with a kept reference
  /// failed `b=1 hq=1 sq=1 skv=1023 dtype=e5m2 values=sparse_int(3,0.5)`
  /// (O 0.105 off, bound 0.084; H100, 2026-11-27, Gpu_hopper_fp8.ValueAffineMap).
  static constexpr float kMoveAbove = 8.0f;  // log2 of the largest weight a kept reference allows

  /// Folds a tile's logits into the row state and turns them into weights
  /// exp2(s * scale_log2 - shift) (kernels::exponentiate's arithmetic, with
  /// the reference kept as above). The correction is exactly 1 for a row
  /// whose reference stays, and `any` says whether a row of the warp moved.
  template <bool kKeepReference, int kTilesN>
  __device__ __forceinline__ TileCorrection exponentiate(float (&s)[kTilesN][4]) {
    TileCorrection correction;
    bool moved = false;
    // Both rows' maxima first, as trees, then their shuffles side by side (a
    // row's maximum was a chain of 2 kTilesN dependent fmaxf; on the H100 the
    // trees and this order measured within the noise of it: docs/perf.md).
    float tile_max[2], shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) tile_max[r] = tree_max<kTilesN>(s, r);
#pragma unroll
    for (int lane_mask = 1; lane_mask <= 2; lane_mask *= 2)
#pragma unroll
      for (int r = 0; r < 2; ++r) tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(kFullWarp, tile_max[r], lane_mask));
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float old_shift = __fmul_rn(state.max[r], scale_log2);  // -inf while every key so far is masked
      const bool move = state.max[r] == -INFINITY ||
                        __fmul_rn(tile_max[r], scale_log2) - old_shift > (kKeepReference ? kMoveAbove : 0.0f);
      const float reference = move ? fmaxf(state.max[r], tile_max[r]) : state.max[r];
      // kernels::exponentiate says why both shifts are __fmul_rn and why a
      // reference of -inf shifts by 0.
      shift[r] = reference == -INFINITY ? 0.0f : __fmul_rn(reference, scale_log2);
      correction.factor[r] = move ? fast_exp2(old_shift - shift[r]) : 1.0f;
      moved = moved || move;
      state.max[r] = reference;
    }
    // The weights, both rows interleaved, and each row's sum as four partial sums.
    float partial[2][4] = {{state.sum[0] * correction.factor[0], 0.0f, 0.0f, 0.0f},
                           {state.sum[1] * correction.factor[1], 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = fast_exp2(fmaf(s[nt][e], scale_log2, -shift[e / 2]));
        partial[e / 2][(2 * nt + e) % 4] += s[nt][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) state.sum[r] = (partial[r][0] + partial[r][1]) + (partial[r][2] + partial[r][3]);
    correction.any = __any_sync(kFullWarp, moved);
    return correction;
  }
  /// O's rows times their correction, where a row of the warp moved its reference.
  template <int kTilesD>
  __device__ __forceinline__ static void rescale(float (&o)[kTilesD][4], const TileCorrection& correction) {
    if (correction.any) kernels::rescale(o, correction);
  }
  template <typename T, int kTilesN>
  __device__ __forceinline__ static void to_fragments(const float (&s)[kTilesN][4], std::uint32_t (&p)[kTilesN / 2][4]) {
    kernels::to_fragments<T>(s, p);
  }
  /// fp8: P (unnormalized, in [0, 1]) rounded to the format (cvt.rn.satfinite)
  /// as the m16n8k32 A fragment of each 32 keys: register 0 holds row g's
  /// slots 4t..4t+3, 1 row g + 8's, 2 and 3 the slots 16 on. Slot 4t + i takes
  /// key 2t + i (i < 2) or 8 + 2t + i - 2 of its 16 (the C layout's columns
  /// this thread holds), so no value moves between threads: V^T's keys are
  /// stored in that order instead (launch.cuh: transpose_v_fp8).
  template <typename T, int kTilesN>
  __device__ __forceinline__ static void to_fragments(const float (&s)[kTilesN][4], std::uint32_t (&p)[kTilesN / 4][4]) {
    constexpr __nv_fp8_interpretation_t kFormat = std::is_same_v<T, __nv_fp8_e5m2> ? __NV_E5M2 : __NV_E4M3;
    const auto pack4 = [](float a, float b, float c, float d) {
      const std::uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kFormat);
      const std::uint32_t high = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, kFormat);
      return low | high << 16;
    };
#pragma unroll
    for (int kc = 0; kc < kTilesN / 4; ++kc) {
      p[kc][0] = pack4(s[4 * kc][0], s[4 * kc][1], s[4 * kc + 1][0], s[4 * kc + 1][1]);
      p[kc][1] = pack4(s[4 * kc][2], s[4 * kc][3], s[4 * kc + 1][2], s[4 * kc + 1][3]);
      p[kc][2] = pack4(s[4 * kc + 2][0], s[4 * kc + 2][1], s[4 * kc + 3][0], s[4 * kc + 3][1]);
      p[kc][3] = pack4(s[4 * kc + 2][2], s[4 * kc + 2][3], s[4 * kc + 3][2], s[4 * kc + 3][3]);
    }
  }
};

}  // namespace flashcheck::kernels::hopper
