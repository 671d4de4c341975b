// fa2-mma-bwd and fa2-mma-bwd-det's kernels (included by backward/mma.cu,
// whose file head says what they are and what each version changed, and by
// their mutants, kernels/mutants/mma_backward_mutants.cu).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .row.col; g = lane / 4,
// t = lane % 4):
//   A (16 x 16, 4 registers of two elements): a0 = (g, 2t..2t+1),
//     a1 = (g+8, 2t..2t+1), a2 = (g, 2t+8..2t+9), a3 = (g+8, 2t+8..2t+9).
//   B (16 x 8, 2 registers): b0 = (2t..2t+1, g), b1 = (2t+8..2t+9, g).
//   C (16 x 8, 4 floats): c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1).
// So two n-tiles of C (16 x 16), packed in pairs, are one A fragment with the
// C's columns as A's k (common/softmax.cuh: to_fragments): the backward turns
// its P^T and dS^T accumulators into the A operands of dV += P^T dO and
// dK += dS^T Q that way, as the forward turns P into P V's.
// ldmatrix gives thread `lane` of each 8x8 matrix row g, columns 2t..2t+1 (the
// B fragment of a matrix stored [n][k]); with .trans, rows 2t..2t+1 of column
// g (the B fragment of a matrix stored [k][n]). Every shared tile here is
// row-major [rows][cols] in 16-byte chunks, swizzled as mma/tiles.cuh lays
// them out.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backward/rowthread_kernel.cuh"
#include "common/attention.cuh"
#include "common/launch.cuh"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "flashcheck/kernels/backward/mma.hpp"
#include "mma/ptx.cuh"
#include "mma/tiles.cuh"

namespace flashcheck::kernels {

/// Deliberate flaws, for the mutants (kernels/mutants/mma_backward_mutants.cu,
/// issue 22's bug classes ported to these kernels); `none` is the real kernel.
enum class MmaBackwardFlaw {
  none,
  scale_missing_in_ds,  // dK and dQ without the softmax scale (dS's factor)
  gqa_not_reduced,      // dK and dV from the first query head of each GQA group only
  masked_keys_in_dk,    // dK adds the dS of keys the mask hides (P computed without the mask)
  delta_low_precision,  // D_i = rowsum(dO o O) accumulated in the storage dtype
  d256_only_wrong,      // dQ's last column left at 0 when d = 256
  p_flushed,            // dK/dV's P from ex2.approx.ftz: a subnormal P flushed to 0 (version 4's flaw)
};

namespace mma_bwd {

inline constexpr float kLog2e = 1.4426950408889634f;

/// The dK/dV kernel's shape at head dim D: kKeyWarps warps along the keys (16
/// keys each, so a block owns 16 kKeyWarps keys), kSplit warps along D (each
/// owns D / kSplit columns of its keys' dK and dV, 16 x D / kSplit f32 each,
/// in registers), and kStep query rows per step (S^T, P^T, dP^T and dS^T are
/// 16 keys x kStep a warp, in registers beside dK and dV).
/// - d = 64: 8 x 1 warps, 128 keys a block, steps of 64 rows.
/// - d = 128: 8 x 1 warps, steps of 32 rows (64 put dK, dV, S^T and dP^T past
///   ptxas's 255 registers).
/// - d = 256: 4 x 2 warps, 64 keys, steps of 32: dK and dV of 16 keys x 256
///   would take 256 registers a thread, so two warps share 16 keys, each owns
///   128 columns, and they add their halves of S^T and dP^T (each a product
///   over D) through shared memory.
template <int D>
struct KvShape {
  static constexpr int kKeyWarps = D == 256 ? 4 : 8;
  static constexpr int kSplit = D == 256 ? 2 : 1;
  static constexpr int kStep = D == 64 ? 64 : 32;
};
/// The deterministic dQ kernel's shape: kWarps warps of 16 query rows, walking
/// the keys kKeys at a time (32 at d = 256: dQ's 16 x 256 f32 accumulator
/// takes 128 registers, beside S and dP of 16 x kKeys). 8 warps at d = 256,
/// where the 128 KiB of a 4-warp block's tiles left one block of 4 warps an
/// SM (8 warps: 192 KiB, twice the warps an SM); 4 elsewhere, where 8 bought
/// nothing (registers already held two 4-warp blocks an SM; docs/perf.md).
/// kMinBlocks: at d = 64, three 4-warp blocks an SM (168 registers, 4 bytes
/// spilled; 179 held two), 12 warps an SM; a 16 x 32 key step (145
/// registers, no spill) measured no faster, and at d = 128 neither helped.
template <int D>
struct QShape {
  static constexpr int kWarps = D == 256 ? 8 : 4;
  static constexpr int kMinBlocks = D == 64 ? 3 : 1;
  static constexpr int kKeys = D == 256 ? 32 : 64;
};

/// Byte offset of element (row, col) of the atomic subject's dS^T tile,
/// [rows][kStep] 2-byte elements, swizzled so that the 8 rows an ldmatrix (or
/// the 8 lanes g of a fragment store) touch at one 16-byte chunk fall in 8
/// different bank groups: with 8 chunks a row (kStep = 64) chunk c of row r
/// lives at c ^ (r % 8), as mma::tile_offset; with 4 (kStep = 32, 64-byte rows,
/// two rows to 128 bytes) at c ^ (r / 2 % 4).
template <int kStep>
__device__ __forceinline__ std::uint32_t ds_offset(int row, int col) {
  constexpr int kChunks = kStep / 8;
  static_assert(kChunks == 8 || kChunks == 4, "dS^T rows of 32 or 64 queries");
  const int chunk = col / 8, swizzled = kChunks == 8 ? chunk ^ (row % 8) : chunk ^ (row / 2 % 4);
  return static_cast<std::uint32_t>(row * kStep * 2 + swizzled * 16 + col % 8 * 2);
}

/// C += A B^T for one warp over columns [c0, c0 + kCols) of the product's
/// inner dimension: A is rows [a_row0, a_row0 + 16) of a [*][D] tile, B rows
/// [0, 8 kTilesN) of a [*][D] tile (both row-major, swizzled). A comes in 16
/// rows x 32 columns (two k-steps) per two ldmatrix.x4, B in 8 rows x 32
/// columns per ldmatrix.x4 (its 4 matrices are b0, b1 of the first k-step and
/// b0, b1 of the second: B stored [n][k] reads as a B fragment without
/// .trans). S^T = K Q^T and dP^T = V dO^T (dK/dV kernel), S = Q K^T and
/// dP = dO V^T (dQ kernel).
/// kUnroll: how many 32-column steps ptxas may interleave. The dK/dV kernel
/// unrolls its 2 to 4 steps (version 7: the next step's ldmatrix issue under
/// this one's mma, 3-5% faster at d <= 128, 244-252 registers, no spill; it
/// spilled when versions 1-5 held more registers); the dQ kernel's loop stays
/// rolled (unrolled twice: no measured change, docs/perf.md).
template <typename T, int D, int kCols, int kTilesN, int kUnroll = 1>
__device__ __forceinline__ void product_abt(float (&c)[kTilesN][4], std::uint32_t a_tile, int a_row0,
                                            std::uint32_t b_tile, int c0) {
  const int lane = threadIdx.x % 32;
#pragma unroll kUnroll
  for (int kk = c0 / 32; kk < (c0 + kCols) / 32; ++kk) {
    std::uint32_t a[2][4];
#pragma unroll
    for (int half = 0; half < 2; ++half)
      mma::ldmatrix_x4(a[half],
                       a_tile + mma::tile_offset<D, true>(a_row0 + lane % 16, kk * 32 + half * 16 + lane / 16 * 8));
    // Every n-tile's B first, then the first k-step over them all and the
    // second: no mma waits on the one just issued (the same accumulator).
    std::uint32_t bf[kTilesN][4];
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt)
      mma::ldmatrix_x4(bf[nt], b_tile + mma::tile_offset<D, true>(nt * 8 + lane % 8, kk * 32 + lane / 8 * 8));
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < kTilesN; ++nt) mma::mma_16816<T>(c[nt], a[half], bf[nt][2 * half], bf[nt][2 * half + 1]);
  }
}

/// C += A B for one warp, columns [c0, c0 + kCols) of B and C: A in
/// registers (kTilesK fragments of 16 x 16, the product's k = 16 kTilesK rows
/// of B), B a [*][D] shared tile read with ldmatrix.x4.trans, 16 rows x 16
/// columns (two n-tiles) per two mma. dV += P^T dO, dK += dS^T Q, dQ += dS K.
template <typename T, int D, int kCols, int kTilesK>
__device__ __forceinline__ void product_ab(float (&c)[kCols / 8][4], const std::uint32_t (&a)[kTilesK][4],
                                           std::uint32_t b_tile, int c0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kTilesK; ++kk)
#pragma unroll
    for (int dt = 0; dt < kCols / 16; ++dt) {
      std::uint32_t bf[4];
      mma::ldmatrix_x4_trans(bf, b_tile + mma::tile_offset<D, true>(kk * 16 + lane % 16, c0 + dt * 16 + lane / 16 * 8));
      mma::mma_16816<T>(c[2 * dt], a[kk], bf[0], bf[1]);
      mma::mma_16816<T>(c[2 * dt + 1], a[kk], bf[2], bf[3]);
    }
}

/// Adds the partner warp's half of a product over D (kSplit = 2): both warps
/// hold the same fragment positions (the same 16 keys), so lane l's element e
/// goes to slot [warp][e][l] of `exchange` and comes back from the partner's.
/// Both warps end with the same bits (x + y == y + x). `barrier` names the
/// pair's barrier (bar.sync with 64 threads); the caller keeps the next write
/// to this exchange buffer behind a block-wide barrier.
template <int kTilesN>
__device__ __forceinline__ void add_partner(float (&x)[kTilesN][4], float* exchange, int warp, int partner,
                                            int barrier) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) exchange[(warp * kTilesN * 4 + nt * 4 + e) * 32 + lane] = x[nt][e];
  asm volatile("bar.sync %0, 64;\n" ::"r"(barrier) : "memory");
#pragma unroll
  for (int nt = 0; nt < kTilesN; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[nt][e] += exchange[(partner * kTilesN * 4 + nt * 4 + e) * 32 + lane];
}

/// A grid over (tile, pair) in one dimension, tile-major: block i owns tile
/// i / pairs of (batch, head) pair i % pairs (tile_of_block, pair_of_block),
/// so the blocks the hardware issues first are the same tile of every pair.
/// The kernels number the tiles so that the first is the one that sees the
/// most under a causal mask (the first key block; the last query block),
/// longest first: the short ones fill the last wave. Pair-major (a grid's y),
/// a causal dK/dV pass at 32 key blocks a pair on 132 SMs ran 1.6 times its
/// work's share (docs/perf.md, "Longest first"). Throws gpu::Unsupported past
/// 2^31 - 1 blocks.
inline unsigned tile_major_blocks(unsigned tiles, int pairs, const char* what) {
  const long long blocks = static_cast<long long>(tiles) * pairs;
  if (blocks > INT_MAX) throw gpu::Unsupported(std::string(what) + ": more than 2^31 - 1 blocks");
  return static_cast<unsigned>(blocks);
}
__device__ __forceinline__ int tile_of_block(int pairs) { return static_cast<int>(blockIdx.x) / pairs; }
__device__ __forceinline__ int pair_of_block(int pairs) { return static_cast<int>(blockIdx.x) % pairs; }

// ---------------------------------------------------------------------------
// The row kernels (D_i, the atomic subject's dQ conversion): blocks of 256
// threads, kChunkLanes<D> = D / 8 of them a query row, 16 bytes each.
template <int D>
inline constexpr int kChunkLanes = D / 8;
template <int D>
inline constexpr int kChunkRows = 256 / kChunkLanes<D>;

/// A row kernel thread's place: batch b, query head h, row i, first column c.
struct RowChunk {
  int b, h, i, c;
};
/// This thread's RowChunk in (batch, head) pair `pair` (head_pair()).
template <int D>
__device__ __forceinline__ RowChunk row_chunk(const gpu::AttentionArgs& a, int pair) {
  return {pair / a.heads_q, pair % a.heads_q,
          static_cast<int>(blockIdx.x * kChunkRows<D> + static_cast<int>(threadIdx.x) / kChunkLanes<D>),
          static_cast<int>(threadIdx.x % kChunkLanes<D> * 8)};
}

// D_i = rowsum(dO_i o O_i) in f32 (in T with the delta_low_precision flaw), a
// group of D / 8 threads per row, each reading 16 bytes of dO and of O, summed
// across the group with shuffles (a fixed order: deterministic). Rows past the
// sequence get 0.
template <typename T, int D, MmaBackwardFlaw kFlaw>
__global__ void __launch_bounds__(256) delta_kernel(const BackwardArgs args) {
  constexpr int kLanes = kChunkLanes<D>;
  const gpu::AttentionArgs& a = args.attention;
  const int pair = head_pair();
  if (pair >= a.batch * a.heads_q) return;  // the last grid slice's tail (block-uniform)
  const auto [b, h, i, c] = row_chunk<D>(a, pair);
  float sum = 0.0f;
  if (i < query_length(a, b)) {  // i < seqlen_q, so the row is inside the tensors
    const auto* dout = reinterpret_cast<const uint4*>(static_cast<const T*>(args.dout) + b * a.o_batch_stride +
                                                      h * a.o_head_stride + i * a.o_seq_stride + c);
    const auto* o = reinterpret_cast<const uint4*>(static_cast<const T*>(a.o) + b * a.o_batch_stride +
                                                   h * a.o_head_stride + i * a.o_seq_stride + c);
    const uint4 x = *dout, y = *o;
    const T* xs = reinterpret_cast<const T*>(&x);
    const T* ys = reinterpret_cast<const T*>(&y);
    if constexpr (kFlaw == MmaBackwardFlaw::delta_low_precision) {
      T partial = T(0.0f);
#pragma unroll
      for (int n = 0; n < 8; ++n) partial = partial + xs[n] * ys[n];
      sum = static_cast<float>(partial);
    } else {
#pragma unroll
      for (int n = 0; n < 8; ++n) sum += static_cast<float>(xs[n]) * static_cast<float>(ys[n]);
    }
  }
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullWarp, sum, offset);
    if constexpr (kFlaw == MmaBackwardFlaw::delta_low_precision) sum = static_cast<float>(T(sum) + T(other));
    else sum += other;
  }
  if (i < a.seqlen_q && threadIdx.x % kLanes == 0)
    args.delta[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] = sum;
}

/// The atomic subject's last step: dQ = scale x its f32 accumulator, in T, 8
/// elements (16 bytes) a thread; 0 past the sequence.
template <typename T, int D>
__global__ void __launch_bounds__(256) dq_from_accumulator_kernel(const BackwardArgs args) {
  const gpu::AttentionArgs& a = args.attention;
  const int pair = head_pair();
  if (pair >= a.batch * a.heads_q) return;  // the last grid slice's tail (block-uniform)
  const auto [b, h, i, c] = row_chunk<D>(a, pair);
  if (i >= a.seqlen_q) return;
  const bool live = i < query_length(a, b);
  const float4* accum = reinterpret_cast<const float4*>(
      args.dq_accum + ((static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i) * D + c);
  const float4 x = live ? accum[0] : float4{}, y = live ? accum[1] : float4{};
  const float s = a.scale;
  const uint4 packed{pack<T>(s * x.x, s * x.y), pack<T>(s * x.z, s * x.w), pack<T>(s * y.x, s * y.y),
                     pack<T>(s * y.z, s * y.w)};
  *reinterpret_cast<uint4*>(static_cast<T*>(args.dq) + b * a.q_batch_stride + h * a.q_head_stride +
                            i * a.q_seq_stride + c) = packed;
}

/// Adds two adjacent floats (8-byte aligned) to global memory atomically: one
/// red.global.add.v2.f32 on sm_90 and newer, two scalar atomics before.
__device__ __forceinline__ void add_pair(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y) : "memory");
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

// ---------------------------------------------------------------------------
// The atomic subject's dQ share of one step of the dK/dV kernel:
// dQ[step rows] += dS K over the block's kKeys keys, added to the f32
// accumulator with atomicAdd (unscaled: dq_from_accumulator_kernel scales).
// dS^T [kKeys][kStep] is in shared memory (every warp's keys), K [kKeys][D]
// too. The step's dQ tile (kStep x D) is cut into items of 16 rows x 32
// columns, dealt to the block's warps round-robin; each item sums the keys in
// k-steps of 16:
//   A = dS (16 queries x 16 keys) read from dS^T with ldmatrix.x4.trans:
//       matrix m = lane / 8 is a_m; a0 and a1 are keys 0-7 (stored rows),
//       queries 0-7 and 8-15 (stored columns), a2 and a3 keys 8-15;
//   B = K (16 keys x 16 columns) with ldmatrix.x4.trans.
template <typename T, int D, int kKeys, int kStep, int kWarps>
__device__ __forceinline__ void add_dq_atomic(float* dq_rows, int valid_rows, std::uint32_t ds_tile,
                                              std::uint32_t k_tile) {
  constexpr int kChunks = D / 32, kItems = kStep / 16 * kChunks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll 1  // one item's registers at a time, beside the caller's dK and dV
  for (int item = warp; item < kItems; item += kWarps) {
    const int mt = item / kChunks, chunk = item % kChunks;
    float acc[4][4] = {};
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      std::uint32_t a[4];
      const int ds_row = kk * 16 + lane / 16 * 8 + lane % 8, ds_column = mt * 16 + lane / 8 % 2 * 8;
      mma::ldmatrix_x4_trans(a, ds_tile + ds_offset<kStep>(ds_row, ds_column));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        std::uint32_t bf[4];
        mma::ldmatrix_x4_trans(bf, k_tile + mma::tile_offset<D, true>(kk * 16 + lane % 16,
                                                                       chunk * 32 + half * 16 + lane / 16 * 8));
        mma::mma_16816<T>(acc[2 * half], a, bf[0], bf[1]);
        mma::mma_16816<T>(acc[2 * half + 1], a, bf[2], bf[3]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = mt * 16 + lane / 4 + 8 * r;
      if (row >= valid_rows) continue;  // past the sequence: its dS is 0, and the accumulator may end
      float* dst = dq_rows + static_cast<std::int64_t>(row) * D + chunk * 32 + lane % 4 * 2;
#pragma unroll
      for (int n = 0; n < 4; ++n) add_pair(dst + n * 8, acc[n][2 * r], acc[n][2 * r + 1]);
    }
  }
}

/// What a step's rows tell the P computation: log2(e) LSE_i - kExp2Shift (so
/// that S scale log2(e) - lse_log2 is P's exponent shifted, for
/// exp2_shifted_keeping_subnormals), D_i, and the keys the row sees (empty
/// past the sequence and for rows that see no key, LSE = -inf: no gradient).
struct RowInfo {
  float lse_log2, delta;
  KeyRange keys;
};
__device__ __forceinline__ RowInfo row_info(const gpu::AttentionArgs& a, const float* lse, const float* delta, int i,
                                            int lq, int lk) {
  if (i >= lq) return {-INFINITY, 0.0f, {0, -1}};
  const float lse_i = lse[i];
  return {fmaf(lse_i, kLog2e, -kExp2Shift), delta[i], lse_i != -INFINITY ? visible_keys(a, i, lq, lk) : KeyRange{0, -1}};
}

// ---------------------------------------------------------------------------
// dK and dV (and, with kAtomicDq, dQ's share): a block per 16 kKeyWarps keys
// of one (batch, K/V head), KvShape<D>'s warps; warp w owns keys
// 16 (w % kKeyWarps) ... + 15 of the block as the rows (M) of its m16 tiles,
// and columns [c0, c0 + D / kSplit), c0 = (w / kKeyWarps) D / kSplit, of
// their dK and dV accumulators (f32, in registers). K and V of the block are
// loaded once. The block walks the query rows of every query head of the GQA
// group (the group's sum is this loop) in steps of kStep rows, skipping the
// steps none of whose rows sees a key of the block; the next step's Q, dO and
// row information load (cp.async, a second buffer) while this one computes:
//   S^T  = K Q^T                       (mma, f32; kSplit = 2: each warp of a
//                                       pair sums half of D, add_partner)
//   P^T  = exp2(S^T scale log2 e - LSE_i log2 e) where query i sees the key,
//          else 0
//   dV  += P^T dO                      (P^T rounded to T: A operand)
//   dP^T = V dO^T                      (mma, f32; halves added as S^T's)
//   dS^T = P^T o (dP^T - D_i)          (f32)
//   dK  += dS^T Q                      (dS^T rounded to T: A operand)
//   [kAtomicDq] dQ += dS K, atomically (add_dq_atomic)
// and at the end dK = scale dK. Keys past the sequence, and rows past it or
// that see no key, weigh exactly 0: P^T is set to 0 there, never computed
// (their zero-filled rows of K, V, Q and dO make the products 0 too).
template <typename T, int D, bool kAtomicDq, MmaBackwardFlaw kFlaw = MmaBackwardFlaw::none>
__global__ void __launch_bounds__(32 * KvShape<D>::kKeyWarps * KvShape<D>::kSplit) dkdv_kernel(const BackwardArgs args) {
  using Shape = KvShape<D>;
  constexpr int kKeyWarps = Shape::kKeyWarps, kSplit = Shape::kSplit, kStep = Shape::kStep;
  constexpr int kWarps = kKeyWarps * kSplit, kThreads = 32 * kWarps, kKeys = 16 * kKeyWarps, kCols = D / kSplit;
  constexpr int kTilesQ = kStep / 8;
  constexpr std::uint32_t kKeyTileBytes = kKeys * D * 2, kStepTileBytes = kStep * D * 2;
  constexpr std::uint32_t kStepOffset = 2 * kKeyTileBytes;  // buffer n: Q, then dO
  constexpr std::uint32_t kExchangeOffset = kStepOffset + 4 * kStepTileBytes;
  constexpr std::uint32_t kExchangeBytes = kSplit > 1 ? kWarps * kTilesQ * 4 * 32 * 4 : 0;
  constexpr std::uint32_t kDsOffset = kExchangeOffset + 2 * kExchangeBytes;
  constexpr std::uint32_t kDsTileBytes = kAtomicDq ? kKeys * kStep * 2 : 0;
  constexpr std::uint32_t kRowInfoOffset = kDsOffset + 2 * kDsTileBytes;
  static_assert(kStep <= kThreads, "a thread per row loads a step's row information");
  extern __shared__ __align__(128) unsigned char smem[];
  // K [kKeys][D] | V [kKeys][D] | 2 x (Q [kStep][D] | dO [kStep][D]) (swizzled)
  // | 2 x exchange (kSplit = 2: S^T's halves, dP^T's) | 2 x dS^T [kKeys][kStep] (kAtomicDq)
  // | 2 x per query row of the step: log2(e) LSE, D_i, its first and last key.
  const std::uint32_t k_tile = mma::shared_address(smem), v_tile = k_tile + kKeyTileBytes;
  const std::uint32_t ds_tile = k_tile + kDsOffset;
  float* exchange_s = reinterpret_cast<float*>(smem + kExchangeOffset);
  float* exchange_dp = reinterpret_cast<float*>(smem + kExchangeOffset + kExchangeBytes);

  const gpu::AttentionArgs& a = args.attention;
  const int pairs = a.batch * a.heads_kv, pair = pair_of_block(pairs);  // tile-major (tile_major_blocks)
  const int b = pair / a.heads_kv, hk = pair % a.heads_kv, group = a.heads_q / a.heads_kv;
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int key0 = tile_of_block(pairs) * kKeys;  // the first key block first: under a causal mask it sees the most
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key_warp = warp % kKeyWarps, c0 = warp / kKeyWarps * kCols;
  const int partner = (warp + kKeyWarps) % kWarps, pair_barrier = 1 + key_warp;
  const int warp_key0 = key0 + key_warp * 16;  // this thread's keys: warp_key0 + lane / 4 and + 8
  float dk_acc[kCols / 8][4] = {}, dv_acc[kCols / 8][4] = {};

  if (key0 < lk) {  // else every key of the block is padding: dK = dV = 0 (block-uniform)
    const int key_last = min(key0 + kKeys, lk) - 1;
    const T* k = static_cast<const T*>(a.k) + b * a.k_batch_stride + hk * a.k_head_stride;
    const T* v = static_cast<const T*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;
    // The steps: s = (h - hk group) steps_per_head + i0 / kStep, over the
    // group's query heads (only the first with the gqa_not_reduced flaw).
    const int steps_per_head = (lq + kStep - 1) / kStep;
    const int steps = (kFlaw == MmaBackwardFlaw::gqa_not_reduced ? 1 : group) * steps_per_head;
    auto sees_block = [&](int s) {
      const int i0 = s % steps_per_head * kStep;
      const KeyRange seen = rowthread_bwd::keys_of_rows(a, i0, min(i0 + kStep, lq) - 1, lq, lk);
      return seen.first <= key_last && seen.last >= key0;
    };
    auto next_step = [&](int s) {  // the first step from s on that a row of sees the block (block-uniform)
      while (s < steps && !sees_block(s)) ++s;
      return s;
    };
    auto head_of = [&](int s) { return hk * group + s / steps_per_head; };
    auto load_step = [&](int s, int buffer) {
      const int h = head_of(s), i0 = s % steps_per_head * kStep;
      const T* q = static_cast<const T*>(a.q) + b * a.q_batch_stride + h * a.q_head_stride;
      const T* dout = static_cast<const T*>(args.dout) + b * a.o_batch_stride + h * a.o_head_stride;
      const std::uint32_t q_tile = k_tile + kStepOffset + buffer * 2 * kStepTileBytes;
      mma::copy_tile<kStep, D, true, T, kThreads>(q_tile, q + i0 * a.q_seq_stride, a.q_seq_stride, lq - i0);
      mma::copy_tile<kStep, D, true, T, kThreads>(q_tile + kStepTileBytes, dout + i0 * a.o_seq_stride, a.o_seq_stride,
                                                  lq - i0);
    };
    auto load_row = [&](int s) {  // this thread's row of step s (threads < kStep)
      const std::int64_t row_base = (static_cast<std::int64_t>(b) * a.heads_q + head_of(s)) * a.seqlen_q;
      return row_info(a, a.lse + row_base, args.delta + row_base, s % steps_per_head * kStep + threadIdx.x, lq, lk);
    };
    auto add_dq_share = [&](int step, int buffer) {  // kAtomicDq: step's dQ += dS K, from dS^T's buffer
      const int i0 = step % steps_per_head * kStep;
      const std::int64_t row_base = (static_cast<std::int64_t>(b) * a.heads_q + head_of(step)) * a.seqlen_q;
      add_dq_atomic<T, D, kKeys, kStep, kWarps>(args.dq_accum + (row_base + i0) * D, lq - i0,
                                               ds_tile + buffer * kDsTileBytes, k_tile);
    };
    auto store_row = [&](const RowInfo& info, int buffer) {  // one float4 a row: one 16-byte load a column
      reinterpret_cast<float4*>(smem + kRowInfoOffset)[buffer * kStep + threadIdx.x] =
          float4{info.lse_log2, info.delta, __int_as_float(info.keys.first), __int_as_float(info.keys.last)};
    };

    // Rows past lk are zero-filled; key0 < lk, so the source's first row is inside the tensor.
    mma::copy_tile<kKeys, D, true, T, kThreads>(k_tile, k + key0 * a.k_seq_stride, a.k_seq_stride, lk - key0);
    mma::copy_tile<kKeys, D, true, T, kThreads>(v_tile, v + key0 * a.v_seq_stride, a.v_seq_stride, lk - key0);
    int s = next_step(0);
    if (s < steps) {
      load_step(s, 0);
      if (threadIdx.x < kStep) store_row(load_row(s), 0);
    }
    mma::cp_async_commit();  // K and V with the first step's Q and dO: one group

    // One barrier a step: past it, this step's copies have landed (every
    // thread's) and its row information is stored, and every warp is done
    // with the step before, so the other buffer (Q, dO, row information, and
    // dS^T with the atomic dQ) is free for the next step.
    int previous = -1;  // kAtomicDq: the step whose dS^T waits for its dQ share
    int buffer = 0;
    for (; s < steps; buffer ^= 1) {
      mma::cp_async_wait<0>();
      __syncthreads();
      const int next = next_step(s + 1);
      RowInfo next_row{};
      if (next < steps) {
        load_step(next, buffer ^ 1);
        if (threadIdx.x < kStep) next_row = load_row(next);  // stored after the products: the loads overlap them
      }
      mma::cp_async_commit();
      if constexpr (kAtomicDq) {
        // The step before's dQ share, from its dS^T (the other buffer): one
        // step late, so that no barrier waits between dS^T's writes and reads.
        if (previous >= 0) add_dq_share(previous, buffer ^ 1);
      }

      const std::uint32_t q_tile = k_tile + kStepOffset + buffer * 2 * kStepTileBytes, do_tile = q_tile + kStepTileBytes;
      const float4* rows = reinterpret_cast<const float4*>(smem + kRowInfoOffset) + buffer * kStep;
      const float scale_log2 = a.scale * kLog2e;

      // S^T = K Q^T, then P^T in place: element e of n-tile nt is key
      // warp_key0 + g + 8 (e / 2), query column nt * 8 + 2t + e % 2.
      float p[kTilesQ][4] = {};
      product_abt<T, D, kCols, kTilesQ, kCols / 32>(p, k_tile, key_warp * 16, q_tile, c0);
      if constexpr (kSplit > 1) add_partner(p, exchange_s, warp, partner, pair_barrier);
      [[maybe_unused]] float p_unmasked[kFlaw == MmaBackwardFlaw::masked_keys_in_dk ? kTilesQ : 1][4];
#pragma unroll
      for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int column = nt * 8 + lane % 4 * 2 + e % 2, key = warp_key0 + lane / 4 + e / 2 * 8;
          const float4 row = rows[column];  // log2(e) LSE, D_i, first key, last key
          const bool live = key >= __float_as_int(row.z) && key <= __float_as_int(row.w);
          // The handed LSE is natural-log (LSE = m + log l), as rowthread's forward writes it.
          const float shifted = fmaf(p[nt][e], scale_log2, -row.x);
          const float weight = kFlaw == MmaBackwardFlaw::p_flushed ? fast_exp2(shifted - kExp2Shift)
                                                                  : exp2_shifted_keeping_subnormals(shifted);
          if constexpr (kFlaw == MmaBackwardFlaw::masked_keys_in_dk)
            p_unmasked[nt][e] = key < lk && row.x != -INFINITY ? weight : 0.0f;
          p[nt][e] = live ? weight : 0.0f;
        }
      std::uint32_t fragments[kTilesQ / 2][4];
      to_fragments<T>(p, fragments);
      product_ab<T, D, kCols, kTilesQ / 2>(dv_acc, fragments, do_tile, c0);  // dV += P^T dO

      // dP^T = V dO^T, then dS^T = P^T o (dP^T - D_i) in place.
      float ds[kTilesQ][4] = {};
      product_abt<T, D, kCols, kTilesQ, kCols / 32>(ds, v_tile, key_warp * 16, do_tile, c0);
      if constexpr (kSplit > 1) add_partner(ds, exchange_dp, warp, partner, pair_barrier);
#pragma unroll
      for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float weight = p[nt][e];
          if constexpr (kFlaw == MmaBackwardFlaw::masked_keys_in_dk) weight = p_unmasked[nt][e];
          ds[nt][e] = weight * (ds[nt][e] - rows[nt * 8 + lane % 4 * 2 + e % 2].y);
        }
      to_fragments<T>(ds, fragments);
      if constexpr (kAtomicDq) {
        // dS^T to shared memory, for dQ's share below: the A fragments just
        // packed, so the same rounded values as dK's product. Fragment
        // kk = nt / 2, register (nt % 2) * 2 + r holds key g + 8r, queries
        // nt * 8 + 2t and + 1 (to_fragments' order). With kSplit = 2 both
        // warps of a pair hold them; the first writes.
        if (warp < kKeyWarps) {
#pragma unroll
          for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              *reinterpret_cast<std::uint32_t*>(smem + kDsOffset + buffer * kDsTileBytes +
                                                ds_offset<kStep>(key_warp * 16 + lane / 4 + 8 * r, nt * 8 + lane % 4 * 2)) =
                  fragments[nt / 2][nt % 2 * 2 + r];
        }
      }
      product_ab<T, D, kCols, kTilesQ / 2>(dk_acc, fragments, q_tile, c0);  // dK += dS^T Q (scaled at the end)
      if (next < steps && threadIdx.x < kStep) store_row(next_row, buffer ^ 1);
      previous = s;
      s = next;
    }
    if constexpr (kAtomicDq) {
      if (previous >= 0) {
        __syncthreads();  // every warp's keys of the last step's dS^T are written
        add_dq_share(previous, buffer ^ 1);  // the last step's buffer
      }
    }
    // Where every step was skipped, K and V's copies were never waited for:
    // none may still be writing shared memory when the block ends.
    mma::cp_async_wait<0>();
  }

  // Every key row of the padded shape is written: past the sequence 0 (and
  // keys no row sees have 0 accumulators).
  T* dk = static_cast<T*>(args.dk) + b * a.k_batch_stride + hk * a.k_head_stride;
  T* dv = static_cast<T*>(args.dv) + b * a.v_batch_stride + hk * a.v_head_stride;
  const float dk_scale = kFlaw == MmaBackwardFlaw::scale_missing_in_ds ? 1.0f : a.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = warp_key0 + lane / 4 + 8 * r;
    if (j >= a.seqlen_kv) continue;
    const bool live = j < lk;
#pragma unroll
    for (int dt = 0; dt < kCols / 8; ++dt) {
      const int column = c0 + dt * 8 + lane % 4 * 2;
      *reinterpret_cast<std::uint32_t*>(dk + j * a.k_seq_stride + column) =
          pack<T>(live ? dk_scale * dk_acc[dt][2 * r] : 0.0f, live ? dk_scale * dk_acc[dt][2 * r + 1] : 0.0f);
      *reinterpret_cast<std::uint32_t*>(dv + j * a.v_seq_stride + column) =
          pack<T>(live ? dv_acc[dt][2 * r] : 0.0f, live ? dv_acc[dt][2 * r + 1] : 0.0f);
    }
  }
}

// ---------------------------------------------------------------------------
// The deterministic subject's dQ: a block of QShape<D>'s warps per 16 kWarps
// query rows of one (batch, query head); warp w owns rows 16w ... 16w + 15
// (its m16 tile) and their dQ accumulator (16 x D, f32, registers). Q and dO
// of the block are loaded once; the block walks the key tiles that any of its
// rows sees, in order, kKeys at a time, the next tile's K and V loading
// (cp.async, a second buffer) while this one computes:
//   S  = Q K^T,  P = exp2(S scale log2 e - LSE_i log2 e) where row i sees the
//                key, else 0
//   dP = dO V^T, dS = P o (dP - D_i)
//   dQ += dS K  (dS rounded to T: A operand)
// and at the end dQ = scale dQ. One warp sums each element, in key order: no
// atomics, bitwise repeatable.
template <typename T, int D, MmaBackwardFlaw kFlaw = MmaBackwardFlaw::none>
__global__ void __launch_bounds__(32 * QShape<D>::kWarps, QShape<D>::kMinBlocks) dq_kernel(const BackwardArgs args) {
  constexpr int kWarps = QShape<D>::kWarps, kThreads = 32 * kWarps, kKeys = QShape<D>::kKeys;
  constexpr int kRows = 16 * kWarps, kTilesK = kKeys / 8;
  constexpr std::uint32_t kRowTileBytes = kRows * D * 2, kKeyTileBytes = kKeys * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  // Q [kRows][D] | dO [kRows][D] | 2 x (K [kKeys][D] | V [kKeys][D]), all swizzled.
  const std::uint32_t q_tile = mma::shared_address(smem), do_tile = q_tile + kRowTileBytes;
  const std::uint32_t key_tiles = do_tile + kRowTileBytes;

  const gpu::AttentionArgs& a = args.attention;
  const int pairs = a.batch * a.heads_q, pair = pair_of_block(pairs);  // tile-major (tile_major_blocks)
  const int b = pair / a.heads_q, h = pair % a.heads_q, hk = h / (a.heads_q / a.heads_kv);
  const int lq = query_length(a, b), lk = key_length(a, b);
  // The last query block first: under a causal mask it sees the most keys.
  const int q0 = ((a.seqlen_q + kRows - 1) / kRows - 1 - tile_of_block(pairs)) * kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row0 = q0 + warp * 16;  // this thread's rows: warp_row0 + lane / 4 and + 8
  float dq_acc[D / 8][4] = {};

  if (q0 < lq) {  // else every row of the block is padding: dQ = 0 (block-uniform)
    const T* q = static_cast<const T*>(a.q) + b * a.q_batch_stride + h * a.q_head_stride;
    const T* dout = static_cast<const T*>(args.dout) + b * a.o_batch_stride + h * a.o_head_stride;
    const T* k = static_cast<const T*>(a.k) + b * a.k_batch_stride + hk * a.k_head_stride;
    const T* v = static_cast<const T*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;
    auto load_keys = [&](int j0, int buffer) {
      // Rows past lk are zero-filled; j0 < lk, so the source's first row is inside the tensor.
      const std::uint32_t k_tile = key_tiles + buffer * 2 * kKeyTileBytes;
      mma::copy_tile<kKeys, D, true, T, kThreads>(k_tile, k + j0 * a.k_seq_stride, a.k_seq_stride, lk - j0);
      mma::copy_tile<kKeys, D, true, T, kThreads>(k_tile + kKeyTileBytes, v + j0 * a.v_seq_stride, a.v_seq_stride,
                                                  lk - j0);
    };
    mma::copy_tile<kRows, D, true, T, kThreads>(q_tile, q + q0 * a.q_seq_stride, a.q_seq_stride, lq - q0);
    mma::copy_tile<kRows, D, true, T, kThreads>(do_tile, dout + q0 * a.o_seq_stride, a.o_seq_stride, lq - q0);

    // This thread's two rows.
    const std::int64_t row_base = (static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q;
    RowInfo rows[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      rows[r] = row_info(a, a.lse + row_base, args.delta + row_base, warp_row0 + lane / 4 + 8 * r, lq, lk);
    const float scale_log2 = a.scale * kLog2e;

    const KeyRange block = rowthread_bwd::keys_of_rows(a, q0, min(q0 + kRows, lq) - 1, lq, lk);
    const int j_first = block.first / kKeys * kKeys;
    if (j_first <= block.last) load_keys(j_first, 0);
    mma::cp_async_commit();  // Q and dO with the first key tile: one group
    for (int j0 = j_first, buffer = 0; j0 <= block.last; j0 += kKeys, buffer ^= 1) {
      // One barrier a tile: past it, this tile's copies have landed (every
      // thread's), and every warp is done with the tile before, whose buffer
      // the next tile's copies then take.
      mma::cp_async_wait<0>();
      __syncthreads();
      if (j0 + kKeys <= block.last) load_keys(j0 + kKeys, buffer ^ 1);
      mma::cp_async_commit();
      const std::uint32_t k_tile = key_tiles + buffer * 2 * kKeyTileBytes, v_tile = k_tile + kKeyTileBytes;

      // S = Q K^T, then P in place: element e of n-tile nt is row
      // warp_row0 + g + 8 (e / 2), key j0 + nt * 8 + 2t + e % 2.
      float p[kTilesK][4] = {};
      product_abt<T, D, D, kTilesK>(p, q_tile, warp * 16, k_tile, 0);
#pragma unroll
      for (int nt = 0; nt < kTilesK; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j0 + nt * 8 + lane % 4 * 2 + e % 2;
          const RowInfo& row = rows[e / 2];
          p[nt][e] = sees(row.keys, key) ? exp2_shifted_keeping_subnormals(fmaf(p[nt][e], scale_log2, -row.lse_log2)) : 0.0f;
        }

      // dP = dO V^T, then dS = P o (dP - D_i) in place, and dQ += dS K.
      float ds[kTilesK][4] = {};
      product_abt<T, D, D, kTilesK>(ds, do_tile, warp * 16, v_tile, 0);
#pragma unroll
      for (int nt = 0; nt < kTilesK; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - rows[e / 2].delta);
      std::uint32_t fragments[kTilesK / 2][4];
      to_fragments<T>(ds, fragments);
      product_ab<T, D, D, kTilesK / 2>(dq_acc, fragments, k_tile, 0);
    }
    // Where the rows see no key, Q and dO's copies were never waited for:
    // none may still be writing shared memory when the block ends.
    mma::cp_async_wait<0>();
  }

  // Every row of the padded shape is written: past the sequence 0 (and rows
  // that see no key have 0 accumulators).
  T* dq = static_cast<T*>(args.dq) + b * a.q_batch_stride + h * a.q_head_stride;
  const float dq_scale = kFlaw == MmaBackwardFlaw::scale_missing_in_ds ? 1.0f : a.scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = warp_row0 + lane / 4 + 8 * r;
    if (i >= a.seqlen_q) continue;
    const bool live = i < lq;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const int column = dt * 8 + lane % 4 * 2;
      float x = live ? dq_scale * dq_acc[dt][2 * r] : 0.0f, y = live ? dq_scale * dq_acc[dt][2 * r + 1] : 0.0f;
      if (kFlaw == MmaBackwardFlaw::d256_only_wrong && D == 256 && column + 1 == D - 1) y = 0.0f;
      *reinterpret_cast<std::uint32_t*>(dq + i * a.q_seq_stride + column) = pack<T>(x, y);
    }
  }
}

// ---------------------------------------------------------------------------
// Host side.

/// Dynamic shared memory of each kernel (bytes), as the kernels lay it out.
template <int D, bool kAtomicDq>
inline constexpr int kDkdvSmemBytes = [] {
  using S = KvShape<D>;
  const int warps = S::kKeyWarps * S::kSplit, keys = 16 * S::kKeyWarps;
  return 2 * keys * D * 2 + 4 * S::kStep * D * 2 + (S::kSplit > 1 ? 2 * warps * S::kStep / 8 * 4 * 32 * 4 : 0) +
         (kAtomicDq ? 2 * keys * S::kStep * 2 : 0) + 2 * 4 * S::kStep * 4;
}();
template <int D>
inline constexpr int kDqSmemBytes = 2 * 16 * QShape<D>::kWarps * D * 2 + 4 * QShape<D>::kKeys * D * 2;

/// Calls `go.template operator()<T, D>()` for the args' dtype (__half or
/// __nv_bfloat16) and head dim (64, 128 or 256; inside the declared domain).
template <typename Go>
void with_backward_instance(const gpu::AttentionArgs& a, Go&& go) {
  auto by_dim = [&]<typename T>() {
    if (a.head_dim == 64) go.template operator()<T, 64>();
    else if (a.head_dim == 128) go.template operator()<T, 128>();
    else go.template operator()<T, 256>();
  };
  if (a.dtype == kDTypeBf16) by_dim.template operator()<__nv_bfloat16>();
  else by_dim.template operator()<__half>();
}

inline unsigned tiles(int rows, int tile) { return static_cast<unsigned>((rows + tile - 1) / tile); }

/// The det subject's second stream and its fork and join events, one set a
/// host thread (a stream's work is ordered by the thread that enqueues it),
/// created on first use on the current device.
struct SideStream {
  gpu::Stream stream{gpu::CallSite{"mma_bwd side stream"}};
  gpu::Event forked{gpu::CallSite{"mma_bwd side stream"}}, joined{gpu::CallSite{"mma_bwd side stream"}};
};
inline const SideStream& side_dq_stream() {
  thread_local const SideStream side;
  return side;
}

/// The flaw each kernel of a mutant takes: its own where the flaw lives in it,
/// else none, so that a mutant's TU compiles only the kernels its flaw changes
/// (the others are the real kernels' instantiations, shared by the mutants).
enum class Part { delta, dkdv, dq };
template <MmaBackwardFlaw kFlaw, Part kPart, int D>
inline constexpr MmaBackwardFlaw kFlawIn = [] {
  switch (kFlaw) {
    case MmaBackwardFlaw::scale_missing_in_ds: return kPart == Part::delta ? MmaBackwardFlaw::none : kFlaw;
    case MmaBackwardFlaw::gqa_not_reduced:
    case MmaBackwardFlaw::masked_keys_in_dk:
    case MmaBackwardFlaw::p_flushed: return kPart == Part::dkdv ? kFlaw : MmaBackwardFlaw::none;
    case MmaBackwardFlaw::delta_low_precision: return kPart == Part::delta ? kFlaw : MmaBackwardFlaw::none;
    case MmaBackwardFlaw::d256_only_wrong: return kPart == Part::dq && D == 256 ? kFlaw : MmaBackwardFlaw::none;
    default: return MmaBackwardFlaw::none;
  }
}();

}  // namespace mma_bwd

/// Enqueues the backward on the stream: D_i, then dK/dV (with dQ's atomic
/// share when kAtomicDq), then dQ (from the accumulator when kAtomicDq, else
/// the deterministic dQ kernel). Throws gpu::CudaError.
template <bool kAtomicDq, MmaBackwardFlaw kFlaw = MmaBackwardFlaw::none>
void launch_mma_backward(const BackwardArgs& args, const gpu::CallSite& site) {
  using namespace mma_bwd;
  const gpu::AttentionArgs& a = args.attention;
  mma_bwd::with_backward_instance(a, [&]<typename T, int D>() {
    static_assert(kMmaBackwardCapabilities.tile_kv == 16 * KvShape<64>::kKeyWarps &&
                      kMmaBackwardCapabilities.tile_q == 16 * QShape<64>::kWarps,
                  "the domain declares the kernels' tiles (the smallest head dim's)");
    const dim3 row_grid = pair_grid(tiles(a.seqlen_q, kChunkRows<D>), a.batch * a.heads_q);
    const unsigned key_blocks = tile_major_blocks(tiles(a.seqlen_kv, 16 * KvShape<D>::kKeyWarps),
                                                  a.batch * a.heads_kv, "the dK/dV kernel");
    const unsigned query_blocks =
        kAtomicDq ? 0
                  : tile_major_blocks(tiles(a.seqlen_q, 16 * QShape<D>::kWarps), a.batch * a.heads_q, "the dQ kernel");
    if (row_grid.x > 0 && row_grid.y > 0) {
      mma_bwd::delta_kernel<T, D, kFlawIn<kFlaw, Part::delta, D>><<<row_grid, 256, 0, a.stream>>>(args);
      gpu::check_launch("mma_bwd::delta_kernel", site);
    }
    // fa2-mma-bwd-det's dQ kernel needs D_i, not dK/dV: it runs on a second
    // stream beside the dK/dV kernel (forked after D_i, joined before
    // anything later on a.stream), its blocks filling the SMs the dK/dV
    // kernel's last wave leaves idle. Launched second, so dK/dV's blocks are
    // issued first. Each still writes its own outputs alone: as deterministic.
    const bool side_dq = !kAtomicDq && query_blocks > 0;
    if (side_dq) gpu::check(cudaEventRecord(side_dq_stream().forked.get(), a.stream), "cudaEventRecord", site);
    if (key_blocks > 0) {
      constexpr int kSmem = kDkdvSmemBytes<D, kAtomicDq>;
      constexpr int kThreads = 32 * KvShape<D>::kKeyWarps * KvShape<D>::kSplit;
      constexpr MmaBackwardFlaw kDkdvFlaw = kFlawIn<kFlaw, Part::dkdv, D>;
      gpu::check(cudaFuncSetAttribute(dkdv_kernel<T, D, kAtomicDq, kDkdvFlaw>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "cudaFuncSetAttribute", site);
      dkdv_kernel<T, D, kAtomicDq, kDkdvFlaw><<<key_blocks, kThreads, kSmem, a.stream>>>(args);
      gpu::check_launch("mma_bwd::dkdv_kernel", site);
    }
    if constexpr (kAtomicDq) {
      if (row_grid.x > 0 && row_grid.y > 0) {
        // Every row of the padded shape: scale x accumulator, 0 past the
        // sequence (rows that see no key were never added to: 0).
        mma_bwd::dq_from_accumulator_kernel<T, D><<<row_grid, 256, 0, a.stream>>>(args);
        gpu::check_launch("mma_bwd::dq_from_accumulator_kernel", site);
      }
    } else if (side_dq) {
      constexpr int kSmem = kDqSmemBytes<D>;
      constexpr MmaBackwardFlaw kDqFlaw = kFlawIn<kFlaw, Part::dq, D>;
      const SideStream& side = side_dq_stream();
      gpu::check(cudaFuncSetAttribute(dq_kernel<T, D, kDqFlaw>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "cudaFuncSetAttribute", site);
      gpu::check(cudaStreamWaitEvent(side.stream.get(), side.forked.get(), 0), "cudaStreamWaitEvent", site);
      dq_kernel<T, D, kDqFlaw><<<query_blocks, 32 * QShape<D>::kWarps, kSmem, side.stream.get()>>>(args);
      gpu::check_launch("mma_bwd::dq_kernel", site);
      gpu::check(cudaEventRecord(side.joined.get(), side.stream.get()), "cudaEventRecord", site);
      gpu::check(cudaStreamWaitEvent(a.stream, side.joined.get(), 0), "cudaStreamWaitEvent", site);
    }
  });
}

/// fa2-mma-bwd's launcher, launch_mma_backward</*kAtomicDq=*/true>, compiled
/// once in backward/mma.cu: the atomic-dQ mutant registers it too, without
/// compiling its kernels again.
void launch_mma_backward_atomic(const BackwardArgs& args, const gpu::CallSite& site);

}  // namespace flashcheck::kernels
