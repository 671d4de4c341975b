// The tensor-core family's shared pieces (kernels/mma/*.cu): the PTX wrappers
// (cp.async, ldmatrix, mma.m16n8k16), the shared-memory tile layout, the key
// plan of a query block (which key tiles to visit and which need a mask), the
// online softmax on mma fragments, the epilogue, the domain and the launcher.
// What differs between versions (how tiles move global -> shared -> registers)
// stays in each version's file.
//
// 2026-11-25 (issue 20): the online softmax's per-tile correction of the row
// sum and O is now exp2 of the difference of the two shifts as rounded, so it
// is exactly 1 while a row's maximum holds. It was contracted by ptxas into an
// fma that returned the shift's own rounding error, and every tile multiplied
// the sum by exp2(-that): at 131072 keys (2048 tiles) LSE drifted by up to
// 3.5e-4 (bound 2.2e-4) on every kernel of the family. In the Hopper kernel
// (kernels/hopper/softmax.cuh uses exponentiate() too, with 128-key tiles) the
// host emulation gives half that. O was unaffected: its factors cancel in acc / sum.
// docs/perf.md has the host emulation's numbers.
//
// Geometry shared by every version: a block of 4 warps owns 64 query rows, a
// warp owns 16 of them (one m16 tile), so the S and O accumulators of a warp
// are 16 x kBlockKv and 16 x D. Lane l of a warp holds, in every m16n8 C
// fragment, rows l/4 and l/4 + 8 at columns 2(l%4) and 2(l%4) + 1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "common/attention.cuh"

namespace flashcheck::kernels::mma {

inline constexpr int kWarps = 4, kThreads = 32 * kWarps, kBlockQ = 16 * kWarps;
/// DType values as AttentionArgs::dtype carries them (core/dtype.hpp).
inline constexpr int kDTypeF16 = 1, kDTypeBf16 = 2;

/// Deliberate flaws of the flagship kv_pipelined, for its mutants
/// (kernels/mutants/mma_mutants.cu); `none` is the real kernel, and the only
/// value the other versions use.
enum class MmaFlaw {
  none,
  swizzle_write_only,  // tiles written swizzled, read as if they were not
  short_wait,          // every cp.async wait allows one group too many in flight (a race)
  br_as_tl,            // bottom-right causal computed as top-left
  key_tail_unmasked,   // keys past the sequence's end in the last tile are not masked
  window_off_by_one,   // the sliding window sees one key too many on its left
  truncating_epilogue, // bf16 O rounded toward zero in the epilogue instead of to nearest
};

// ---- PTX wrappers ----------------------------------------------------------

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared, bypassing L1; zero-filled when !valid (src must
/// still be a mapped address: callers pass the tensor's base then).
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x2(std::uint32_t (&r)[2], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x2_trans(std::uint32_t (&r)[2], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

/// d += a * b for one m16n8k16 tile, f32 accumulation.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// 2^x on the special function unit (ex2.approx.ftz: 2 ulp; -inf -> +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Two floats rounded (to nearest even) to T and packed, `low` in the low half.
/// kTowardZero (a mutant's flaw) rounds bf16 toward zero instead.
template <typename T, bool kTowardZero = false>
__device__ __forceinline__ std::uint32_t pack(float low, float high) {
  if constexpr (kTowardZero && std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __halves2bfloat162(__float2bfloat16_rz(low), __float2bfloat16_rz(high));
    return *reinterpret_cast<const std::uint32_t*>(&pair);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const std::uint32_t*>(&pair);
  } else {
    const __half2 pair = __floats2half2_rn(low, high);
    return *reinterpret_cast<const std::uint32_t*>(&pair);
  }
}

// ---- shared-memory tiles ---------------------------------------------------

/// Byte offset of element (row, col) of a [rows][D] tile of 2-byte elements,
/// col a multiple of 8 (one 16-byte chunk). Swizzled, chunk c of row r lives at
/// chunk c ^ (r % 8): the 8 rows an ldmatrix reads at one column then fall in
/// 8 different 16-byte bank groups instead of one (a row is 128, 256 or 512 B,
/// a multiple of the 128 B the 32 banks span).
template <int D, bool kSwizzle>
__device__ __forceinline__ std::uint32_t tile_offset(int row, int col) {
  const int chunk = col / 8;
  return static_cast<std::uint32_t>(row * D * 2 + (kSwizzle ? chunk ^ (row % 8) : chunk) * 16);
}

/// Starts copying rows [0, kRows) of a [rows][D] global tile (row stride
/// `stride` elements) into shared memory at `dst`; rows >= valid_rows are
/// zero-filled. Every thread of the block takes part; the caller commits.
template <int kRows, int D, bool kSwizzle, typename T>
__device__ __forceinline__ void copy_tile(std::uint32_t dst, const T* src, std::int64_t stride, int valid_rows) {
  constexpr int kChunks = D / 8, kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRows % kRowStep == 0, "each thread copies the same chunks of its rows");
  const int row = static_cast<int>(threadIdx.x) / kChunks, column = static_cast<int>(threadIdx.x) % kChunks * 8;
  const T* from = src + row * stride + column;
#pragma unroll
  for (int n = 0; n < kRows / kRowStep; ++n) {
    const bool valid = row + n * kRowStep < valid_rows;
    cp_async_16(dst + tile_offset<D, kSwizzle>(row + n * kRowStep, column), valid ? from + n * kRowStep * stride : src,
                valid);
  }
}

/// Loads this warp's 16 query rows (rows 16 * warp ...) of a [kBlockQ][D]
/// shared tile into A fragments, one per 16 columns.
template <int D, bool kSwizzle>
__device__ __forceinline__ void load_q_fragments(std::uint32_t (&q)[D / 16][4], std::uint32_t tile) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(q[kk], tile + tile_offset<D, kSwizzle>(warp * 16 + lane % 16, kk * 16 + lane / 16 * 8));
}

// ---- the two products, per warp ----------------------------------------------

/// S += Q K^T over a [kTilesN * 8][D] K tile, one ldmatrix.x2 (8 keys x 16
/// dims, one k-step) per mma.
template <typename T, int D, bool kSwizzle, int kTilesN>
__device__ __forceinline__ void qk_x2(float (&s)[kTilesN][4], const std::uint32_t (&q)[D / 16][4],
                                      std::uint32_t k_tile) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t kf[2];
      ldmatrix_x2(kf, k_tile + tile_offset<D, kSwizzle>(nt * 8 + lane % 8, kk * 16 + lane / 8 % 2 * 8));
      mma_16816<T>(s[nt], q[kk], kf[0], kf[1]);
    }
}

/// S += Q K^T with one ldmatrix.x4 (8 keys x 32 dims, two k-steps) per two mma.
template <typename T, int D, bool kSwizzle, int kTilesN>
__device__ __forceinline__ void qk_x4(float (&s)[kTilesN][4], const std::uint32_t (&q)[D / 16][4],
                                      std::uint32_t k_tile) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk) {
      std::uint32_t kf[4];
      ldmatrix_x4(kf, k_tile + tile_offset<D, kSwizzle>(nt * 8 + lane % 8, kk * 32 + lane / 8 * 8));
      mma_16816<T>(s[nt], q[2 * kk], kf[0], kf[1]);
      mma_16816<T>(s[nt], q[2 * kk + 1], kf[2], kf[3]);
    }
}

/// O += P V over a [kTilesK * 16][D] V tile, one ldmatrix.x2.trans (16 keys x
/// 8 dims) per mma.
template <typename T, int D, bool kSwizzle, int kTilesK>
__device__ __forceinline__ void pv_x2(float (&o)[D / 8][4], const std::uint32_t (&p)[kTilesK][4],
                                      std::uint32_t v_tile) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kTilesK; ++kk)
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      std::uint32_t vf[2];
      ldmatrix_x2_trans(vf, v_tile + tile_offset<D, kSwizzle>(kk * 16 + lane % 16, dt * 8));
      mma_16816<T>(o[dt], p[kk], vf[0], vf[1]);
    }
}

/// O += P V with one ldmatrix.x4.trans (16 keys x 16 dims, two n-tiles) per two mma.
template <typename T, int D, bool kSwizzle, int kTilesK>
__device__ __forceinline__ void pv_x4(float (&o)[D / 8][4], const std::uint32_t (&p)[kTilesK][4],
                                      std::uint32_t v_tile) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kTilesK; ++kk)
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt) {
      std::uint32_t vf[4];
      ldmatrix_x4_trans(vf, v_tile + tile_offset<D, kSwizzle>(kk * 16 + lane % 16, dt * 16 + lane / 16 * 8));
      mma_16816<T>(o[2 * dt], p[kk], vf[0], vf[1]);
      mma_16816<T>(o[2 * dt + 1], p[kk], vf[2], vf[3]);
    }
}

// ---- which keys a query block visits ------------------------------------------

/// The keys [first, last] query i sees (empty when first > last), as
/// visible_keys(), with a flaw applied for the mutants.
template <MmaFlaw kFlaw>
__device__ __forceinline__ KeyRange row_keys(const gpu::AttentionArgs& a, int i, int lq, int lk) {
  const int diagonal = i + lk - lq;
  KeyRange range{0, kFlaw == MmaFlaw::key_tail_unmasked ? INT_MAX : lk - 1};
  if (a.mask == kMaskCausalTopLeft) range.last = min(range.last, i);
  if (a.mask == kMaskCausalBottomRight) range.last = min(range.last, kFlaw == MmaFlaw::br_as_tl ? i : diagonal);
  if (a.mask == kMaskWindow) {
    if (a.window_left >= 0)
      range.first = max(range.first, diagonal - a.window_left - (kFlaw == MmaFlaw::window_off_by_one ? 1 : 0));
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
template <int kBlockKv, MmaFlaw kFlaw>
__device__ __forceinline__ KeyPlan<kBlockKv> plan_keys(const gpu::AttentionArgs& a, int q0, int rows, int lq, int lk) {
  KeyPlan<kBlockKv> plan;
  const int q_last = min(q0 + rows, lq) - 1;
  const KeyRange top = row_keys<kFlaw>(a, q0, lq, lk), bottom = row_keys<kFlaw>(a, q_last, lq, lk);
  const int first = max(top.first, 0), last = min(bottom.last, lk - 1);
  plan.begin = first / kBlockKv;
  plan.end = first <= last ? last / kBlockKv + 1 : plan.begin;
  plan.inner = {bottom.first, top.last};
  plan.lk = lk;
  plan.tail_masked = kFlaw != MmaFlaw::key_tail_unmasked;
  return plan;
}

/// The key ranges of this thread's two rows in an m16 tile whose row 0 is
/// query `tile_row` (the thread holds rows lane/4 and lane/4 + 8), for the
/// boundary tiles' masks.
struct ThreadRows {
  KeyRange rows[2];
};

template <MmaFlaw kFlaw>
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

// ---- online softmax and epilogue --------------------------------------------

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

/// Writes this thread's part of O = acc / sum for its two rows of the m16
/// tile whose row 0 is block row `tile_row` (rows >= lq are padding and not
/// written), and their LSE. A row that saw no key has sum 0: O = 0, LSE = -inf.
template <typename T, int kTilesD, bool kTowardZero = false>
__device__ __forceinline__ void store_rows(const gpu::AttentionArgs& a, int b, int h, int q0, int lq, T* o,
                                           int tile_row, const float (&acc)[kTilesD][4], const RowState& state) {
  const int lane = threadIdx.x % 32;
  const int row0 = tile_row + lane / 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = state.sum[r];
    sum += __shfl_xor_sync(kFullWarp, sum, 1);
    sum += __shfl_xor_sync(kFullWarp, sum, 2);
    const int i = q0 + row0 + 8 * r;
    if (i >= lq) continue;
    const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* out = o + static_cast<std::int64_t>(row0 + 8 * r) * a.o_seq_stride + lane % 4 * 2;
#pragma unroll
    for (int dt = 0; dt < kTilesD; ++dt)
      *reinterpret_cast<std::uint32_t*>(out + dt * 8) =
          pack<T, kTowardZero>(acc[dt][2 * r] * inverse, acc[dt][2 * r + 1] * inverse);
    if (a.lse && lane % 4 == 0)
      a.lse[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] =
          sum > 0.0f ? state.max[r] * a.scale + logf(sum) : -INFINITY;
  }
}

// ---- the block's tensors ---------------------------------------------------

/// The (batch, head) a block works on and its tensors' starting points: Q and
/// O at the block's first query row, K and V at key 0 of the head's group.
template <typename T>
struct BlockTensors {
  int b, h, lq, lk, q0;
  const T *q, *k, *v;
  T* o;
};

/// Blocks of kRows query rows run longest-first: blockIdx.x = 0 takes the last
/// query block, which under a causal mask sees the most keys, so the short
/// ones fill the tail.
template <typename T, int kRows = kBlockQ>
__device__ __forceinline__ BlockTensors<T> block_tensors(const gpu::AttentionArgs& a, int bh_base) {
  BlockTensors<T> t;
  const int bh = bh_base + static_cast<int>(blockIdx.y);
  t.b = bh / a.heads_q;
  t.h = bh % a.heads_q;
  const int hk = t.h / (a.heads_q / a.heads_kv);
  t.lq = query_length(a, t.b);
  t.lk = key_length(a, t.b);
  t.q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kRows;
  t.q = static_cast<const T*>(a.q) + t.b * a.q_batch_stride + t.h * a.q_head_stride + t.q0 * a.q_seq_stride;
  t.k = static_cast<const T*>(a.k) + t.b * a.k_batch_stride + hk * a.k_head_stride;
  t.v = static_cast<const T*>(a.v) + t.b * a.v_batch_stride + hk * a.v_head_stride;
  t.o = static_cast<T*>(a.o) + t.b * a.o_batch_stride + t.h * a.o_head_stride + t.q0 * a.o_seq_stride;
  return t;
}

// ---- domain and launch -----------------------------------------------------

/// The family's domain (each version and the mutants declare it): f16/bf16
/// storage with f32 accumulation; head dims 64, 128, 256 with dv = d; any
/// lengths (tails predicated); every mask; GQA/MQA; padded batches; LSE; BHSD
/// and BSHD (16-byte loads need the last axis contiguous and d a multiple of 8,
/// which these head dims are). NaN/Inf inputs are outside it: P V multiplies
/// the values of keys masked in a boundary tile by weight 0, and 0 * Inf = NaN.
inline constexpr Capabilities kMmaCapabilities = {
    .dtypes = {DType::f16, DType::bf16},
    .head_dims = {64, 128, 256},
    .head_dim_v_equal = true,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .nonfinite_inputs = false,
    .tile_q = kBlockQ,
    .tile_kv = 64,
    .needs_gpu = true,
    .min_compute_capability = 80,
    .accumulator_max = std::numeric_limits<float>::max(),  // one-pass softmax: O accumulates unnormalised in f32
};

/// A kernel of the family: kernel(args, bh_base), grid (query blocks, heads).
using MmaKernel = void (*)(gpu::AttentionArgs, int);

/// Launches `kernel` over every (batch, head) in chunks of 65535 (the grid's
/// y limit) and every block of `block_rows` queries, with `smem_bytes` of
/// dynamic shared memory.
inline void launch_mma(MmaKernel kernel, int smem_bytes, const gpu::AttentionArgs& a, const gpu::CallSite& site,
                       const char* name, int block_rows = kBlockQ) {
  const int query_blocks = (a.seqlen_q + block_rows - 1) / block_rows;
  const int heads = a.batch * a.heads_q;
  if (query_blocks == 0 || heads == 0) return;
  gpu::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
             "cudaFuncSetAttribute", site);
  for (int base = 0; base < heads; base += 65535) {
    const dim3 grid(query_blocks, min(65535, heads - base));
    kernel<<<grid, kThreads, smem_bytes, a.stream>>>(a, base);
    gpu::check_launch(name, site);
  }
}

/// Calls `go.template operator()<T, D>()` for the args' dtype (__nv_bfloat16
/// or __half) and head dim (64, 128 or 256; inside the domain).
template <typename Go>
void with_instance(const gpu::AttentionArgs& a, Go&& go) {
  if (a.dtype == kDTypeBf16) {
    if (a.head_dim == 64) go.template operator()<__nv_bfloat16, 64>();
    else if (a.head_dim == 128) go.template operator()<__nv_bfloat16, 128>();
    else go.template operator()<__nv_bfloat16, 256>();
  } else {
    if (a.head_dim == 64) go.template operator()<__half, 64>();
    else if (a.head_dim == 128) go.template operator()<__half, 128>();
    else go.template operator()<__half, 256>();
  }
}

/// Picks the instantiation for the args' dtype and head dim (inside the domain).
template <template <typename, int> class Kernel>
void dispatch(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  with_instance(a, [&]<typename T, int D>() { Kernel<T, D>::launch(a, site); });
}

}  // namespace flashcheck::kernels::mma
