// fa2-mma-bwd and fa2-mma-bwd-det's kernels (included by backward/mma.cu,
// whose file head says what they are). D_i and the atomic subject's last step
// (dQ from its f32 accumulator) are fa2-rowthread-bwd's kernels, reused.
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

#include <cstdint>

#include "backward/rowthread_kernel.cuh"
#include "common/attention.cuh"
#include "common/launch.cuh"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "flashcheck/kernels/backward/mma.hpp"
#include "mma/products.cuh"
#include "mma/ptx.cuh"
#include "mma/tiles.cuh"

namespace flashcheck::kernels::mma_bwd {

using mma::kThreads;
using mma::kWarps;

/// Keys a dK/dV block owns, and query rows a dQ block owns (16 a warp).
inline constexpr int kBlockKeys = kMmaBackwardBlockKeys;
inline constexpr int kBlockQueries = kMmaBackwardBlockQueries;
static_assert(kBlockKeys == 16 * kWarps && kBlockQueries == 16 * kWarps, "a warp owns one m16 tile of the block");

/// Query rows per step of the dK/dV kernel: its S^T, P^T, dP^T and dS^T are
/// 16 keys x kStepQueries a warp, in registers beside dK and dV (16 x D each,
/// f32). At d = 128, 64 rows sit at ptxas's limit (sm_90a, 13.0: 255
/// registers, 8 B spilled without the atomic dQ); 32 rows use 241-242 and
/// spill nothing.
template <int D>
inline constexpr int kStepQueries = D == 128 ? 32 : 64;

/// Byte offset of element (row, col) of a [rows][kCols] tile of 2-byte
/// elements, laid out in 16-byte chunks as mma::tile_offset lays them out.
template <int kCols, bool kSwizzle>
__device__ __forceinline__ std::uint32_t element_offset(int row, int col) {
  return mma::tile_offset<kCols, kSwizzle>(row, col / 8 * 8) + static_cast<std::uint32_t>(col % 8 * 2);
}

/// C += A B^T for one warp: A is rows [a_row0, a_row0 + 16) of a [*][D] tile,
/// B rows [0, 8 kTilesN) of a [*][D] tile (both row-major, swizzled; the
/// product runs over D). A comes in 16 rows x 32 columns (two k-steps) per two
/// ldmatrix.x4, B in 8 rows x 32 columns per ldmatrix.x4 (its 4 matrices are
/// b0, b1 of the first k-step and b0, b1 of the second: B stored [n][k] reads
/// as a B fragment without .trans). Used for S^T = K Q^T and dP^T = V dO^T
/// (dK/dV kernel), S = Q K^T and dP = dO V^T (dQ kernel).
template <typename T, int D, int kTilesN>
__device__ __forceinline__ void product_abt(float (&c)[kTilesN][4], std::uint32_t a_tile, int a_row0,
                                            std::uint32_t b_tile) {
  const int lane = threadIdx.x % 32;
  // Not unrolled: unrolled, ptxas hoists the later k-steps' ldmatrix into
  // registers, and beside dK and dV (128 registers at d = 128) that spilled.
#pragma unroll 1
  for (int kk = 0; kk < D / 32; ++kk) {
    std::uint32_t a[2][4];
#pragma unroll
    for (int half = 0; half < 2; ++half)
      mma::ldmatrix_x4(a[half],
                       a_tile + mma::tile_offset<D, true>(a_row0 + lane % 16, kk * 32 + half * 16 + lane / 16 * 8));
#pragma unroll
    for (int nt = 0; nt < kTilesN; ++nt) {
      std::uint32_t bf[4];
      mma::ldmatrix_x4(bf, b_tile + mma::tile_offset<D, true>(nt * 8 + lane % 8, kk * 32 + lane / 8 * 8));
      mma::mma_16816<T>(c[nt], a[0], bf[0], bf[1]);
      mma::mma_16816<T>(c[nt], a[1], bf[2], bf[3]);
    }
  }
}

// ---------------------------------------------------------------------------
// The atomic subject's dQ share of one step of the dK/dV kernel:
// dQ[step rows] += dS K over the block's 64 keys, added to the f32
// accumulator with atomicAdd (unscaled: dq_from_accumulator_kernel scales).
// dS^T [64 keys][kStepQueries] is in shared memory (every warp's rows), K
// [64 keys][D] too. The step's dQ tile (kStepQueries x D) is cut into items of
// 16 rows x 32 columns, dealt to the warps round-robin; each item sums the 64
// keys in 4 k-steps of 16:
//   A = dS (16 queries x 16 keys) read from dS^T with ldmatrix.x4.trans:
//       matrix m = lane / 8 is a_m; a0 and a1 are keys 0-7 (stored rows),
//       queries 0-7 and 8-15 (stored columns), a2 and a3 keys 8-15;
//   B = K (16 keys x 16 columns) with ldmatrix.x4.trans, as mma::pv_x4 reads V.
template <typename T, int D, bool kSwizzleDs>
__device__ __forceinline__ void add_dq_atomic(float* dq_rows, int valid_rows, std::uint32_t ds_tile,
                                              std::uint32_t k_tile) {
  constexpr int kChunks = D / 32, kItems = kStepQueries<D> / 16 * kChunks;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll 1  // one item's registers at a time, beside the caller's dK and dV
  for (int item = warp; item < kItems; item += kWarps) {
    const int mt = item / kChunks, chunk = item % kChunks;
    float acc[4][4] = {};
#pragma unroll
    for (int kk = 0; kk < kBlockKeys / 16; ++kk) {
      std::uint32_t a[4];
      const int ds_row = kk * 16 + lane / 16 * 8 + lane % 8, ds_column = mt * 16 + lane / 8 % 2 * 8;
      mma::ldmatrix_x4_trans(a, ds_tile + element_offset<kStepQueries<D>, kSwizzleDs>(ds_row, ds_column));
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
      for (int n = 0; n < 4; ++n) {
        atomicAdd(dst + n * 8, acc[n][2 * r]);
        atomicAdd(dst + n * 8 + 1, acc[n][2 * r + 1]);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// dK and dV (and, with kAtomicDq, dQ's share): a block of 4 warps per 64 keys
// of one (batch, K/V head); warp w owns keys 16w ... 16w + 15 of the block, as
// the rows (M) of its m16 tiles, and their dK and dV accumulators (16 x D
// each, f32, in registers). K and V of the block are loaded once. The block
// walks the query rows of every query head of the GQA group (the group's sum
// is this loop) in steps of kStepQueries, skipping the steps none of whose
// rows sees a key of the block; per step, with Q and dO in shared memory:
//   S^T  = K Q^T                       (mma, f32)
//   P^T  = exp(S^T scale - LSE_i)      where query i sees the key, else 0
//   dV  += P^T dO                      (P^T rounded to T: A operand)
//   dP^T = V dO^T                      (mma, f32)
//   dS^T = P^T o (dP^T - D_i)          (f32)
//   dK  += dS^T Q                      (dS^T rounded to T: A operand)
//   [kAtomicDq] dQ += dS K, atomically (add_dq_atomic)
// and at the end dK = scale dK. Keys past the sequence, and rows past it or
// that see no key (LSE = -inf), weigh exactly 0: P^T is set to 0 there, never
// computed (their zero-filled rows of K, V, Q and dO make the products 0 too).
template <typename T, int D, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const BackwardArgs args) {
  constexpr int kStep = kStepQueries<D>, kTilesQ = kStep / 8;
  constexpr std::uint32_t kKeyTileBytes = kBlockKeys * D * 2, kStepTileBytes = kStep * D * 2;
  constexpr std::uint32_t kDsOffset = 2 * kKeyTileBytes + 2 * kStepTileBytes;
  constexpr std::uint32_t kRowInfoOffset = kDsOffset + (kAtomicDq ? kBlockKeys * kStep * 2 : 0);
  constexpr bool kSwizzleDs = kStep >= 64;  // tile_offset's swizzle spans 8 chunks a row
  extern __shared__ __align__(128) unsigned char smem[];
  // K [64][D] | V [64][D] | Q [kStep][D] | dO [kStep][D] (swizzled)
  // | dS^T [64][kStep] (kAtomicDq only) | per query row of the step: LSE, D_i, its first and last key.
  const std::uint32_t k_tile = mma::shared_address(smem), v_tile = k_tile + kKeyTileBytes;
  const std::uint32_t q_tile = v_tile + kKeyTileBytes, do_tile = q_tile + kStepTileBytes, ds_tile = k_tile + kDsOffset;
  float* row_lse = reinterpret_cast<float*>(smem + kRowInfoOffset);
  float* row_delta = row_lse + kStep;
  int* row_first = reinterpret_cast<int*>(row_delta + kStep);
  int* row_last = row_first + kStep;

  const gpu::AttentionArgs& a = args.attention;
  const int b = blockIdx.y / a.heads_kv, hk = blockIdx.y % a.heads_kv, group = a.heads_q / a.heads_kv;
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int key0 = blockIdx.x * kBlockKeys;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_key0 = key0 + warp * 16;  // this thread's keys: warp_key0 + lane / 4 and + 8
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};

  if (key0 < lk) {  // else every key of the block is padding: dK = dV = 0 (block-uniform)
    const int key_last = min(key0 + kBlockKeys, lk) - 1;
    const T* k = static_cast<const T*>(a.k) + b * a.k_batch_stride + hk * a.k_head_stride;
    const T* v = static_cast<const T*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;
    // Rows past lk are zero-filled (cp.async's src-size 0; the source is then the tile's first row, inside the tensor).
    mma::copy_tile<kBlockKeys, D, true>(k_tile, k + key0 * a.k_seq_stride, a.k_seq_stride, lk - key0);
    mma::copy_tile<kBlockKeys, D, true>(v_tile, v + key0 * a.v_seq_stride, a.v_seq_stride, lk - key0);
    mma::cp_async_commit();

    for (int h = hk * group; h < (hk + 1) * group; ++h) {
      const T* q = static_cast<const T*>(a.q) + b * a.q_batch_stride + h * a.q_head_stride;
      const T* dout = static_cast<const T*>(args.dout) + b * a.o_batch_stride + h * a.o_head_stride;
      const std::int64_t row_base = (static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q;
      const float* lse = a.lse + row_base;
      const float* delta = args.delta + row_base;
      for (int i0 = 0; i0 < lq; i0 += kStep) {
        const KeyRange seen = rowthread_bwd::keys_of_rows(a, i0, min(i0 + kStep, lq) - 1, lq, lk);
        if (seen.first > key_last || seen.last < key0) continue;  // no row of the step sees the block (uniform)
        mma::copy_tile<kStep, D, true>(q_tile, q + i0 * a.q_seq_stride, a.q_seq_stride, lq - i0);
        mma::copy_tile<kStep, D, true>(do_tile, dout + i0 * a.o_seq_stride, a.o_seq_stride, lq - i0);
        mma::cp_async_commit();
        // Rows past the sequence, and rows that see no key (LSE = -inf: no
        // gradient), get an empty key range: every P^T of theirs is 0.
        for (int r = threadIdx.x; r < kStep; r += kThreads) {
          const int i = i0 + r;
          const float lse_i = i < lq ? lse[i] : -INFINITY;
          const KeyRange keys = i < lq && lse_i != -INFINITY ? visible_keys(a, i, lq, lk) : KeyRange{0, -1};
          row_lse[r] = lse_i;
          row_delta[r] = i < lq ? delta[i] : 0.0f;
          row_first[r] = keys.first;
          row_last[r] = keys.last;
        }
        mma::cp_async_wait<0>();  // K and V (first step), Q and dO have landed
        __syncthreads();

        // S^T = K Q^T, then P^T in place: element e of n-tile nt is key
        // warp_key0 + g + 8 (e / 2), query column nt * 8 + 2t + e % 2.
        float p[kTilesQ][4] = {};
        product_abt<T, D, kTilesQ>(p, k_tile, warp * 16, q_tile);
#pragma unroll
        for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int column = nt * 8 + lane % 4 * 2 + e % 2, key = warp_key0 + lane / 4 + e / 2 * 8;
            const bool live = key >= row_first[column] && key <= row_last[column];
            // The handed LSE is natural-log (LSE = m + log l), as rowthread's forward writes it.
            p[nt][e] = live ? expf(p[nt][e] * a.scale - row_lse[column]) : 0.0f;
          }
        std::uint32_t fragments[kTilesQ / 2][4];
        to_fragments<T>(p, fragments);
        mma::pv_x4<T, D, true, kTilesQ / 2>(dv_acc, fragments, do_tile);  // dV += P^T dO

        // dP^T = V dO^T, then dS^T = P^T o (dP^T - D_i) in place.
        float ds[kTilesQ][4] = {};
        product_abt<T, D, kTilesQ>(ds, v_tile, warp * 16, do_tile);
#pragma unroll
        for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - row_delta[nt * 8 + lane % 4 * 2 + e % 2]);
        to_fragments<T>(ds, fragments);
        if constexpr (kAtomicDq) {
          // dS^T to shared memory, for dQ's share below: the A fragments just
          // packed, so the same rounded values as dK's product. Fragment
          // kk = nt / 2, register (nt % 2) * 2 + r holds key g + 8r, queries
          // nt * 8 + 2t and + 1 (to_fragments' order).
#pragma unroll
          for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              *reinterpret_cast<std::uint32_t*>(
                  smem + kDsOffset +
                  element_offset<kStep, kSwizzleDs>(warp * 16 + lane / 4 + 8 * r, nt * 8 + lane % 4 * 2)) =
                  fragments[nt / 2][nt % 2 * 2 + r];
        }
        mma::pv_x4<T, D, true, kTilesQ / 2>(dk_acc, fragments, q_tile);  // dK += dS^T Q (scaled at the end)
        if constexpr (kAtomicDq) {
          __syncthreads();  // every warp's keys of dS^T are written
          add_dq_atomic<T, D, kSwizzleDs>(args.dq_accum + (row_base + i0) * a.head_dim, lq - i0, ds_tile, k_tile);
        }
        __syncthreads();  // the next step overwrites Q, dO, dS^T and the row info
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
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = warp_key0 + lane / 4 + 8 * r;
    if (j >= a.seqlen_kv) continue;
    const bool live = j < lk;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const int column = dt * 8 + lane % 4 * 2;
      *reinterpret_cast<std::uint32_t*>(dk + j * a.k_seq_stride + column) =
          pack<T>(live ? a.scale * dk_acc[dt][2 * r] : 0.0f, live ? a.scale * dk_acc[dt][2 * r + 1] : 0.0f);
      *reinterpret_cast<std::uint32_t*>(dv + j * a.v_seq_stride + column) =
          pack<T>(live ? dv_acc[dt][2 * r] : 0.0f, live ? dv_acc[dt][2 * r + 1] : 0.0f);
    }
  }
}

// ---------------------------------------------------------------------------
// The deterministic subject's dQ: a block of 4 warps per 64 query rows of one
// (batch, query head); warp w owns rows 16w ... 16w + 15 (its m16 tile) and
// their dQ accumulator (16 x D, f32, registers). Q and dO of the block are
// loaded once; the block walks the key tiles that any of its rows sees, in
// order, K and V of each in shared memory:
//   S  = Q K^T,  P = exp(S scale - LSE_i) where row i sees the key, else 0
//   dP = dO V^T, dS = P o (dP - D_i)
//   dQ += dS K  (dS rounded to T: A operand)
// and at the end dQ = scale dQ. One warp sums each element, in key order: no
// atomics, bitwise repeatable.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) dq_kernel(const BackwardArgs args) {
  constexpr int kTilesK = kBlockKeys / 8;
  constexpr std::uint32_t kRowTileBytes = kBlockQueries * D * 2, kKeyTileBytes = kBlockKeys * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  // Q [64][D] | dO [64][D] | K [64][D] | V [64][D], all swizzled.
  const std::uint32_t q_tile = mma::shared_address(smem), do_tile = q_tile + kRowTileBytes;
  const std::uint32_t k_tile = do_tile + kRowTileBytes, v_tile = k_tile + kKeyTileBytes;

  const gpu::AttentionArgs& a = args.attention;
  const int b = blockIdx.y / a.heads_q, h = blockIdx.y % a.heads_q, hk = h / (a.heads_q / a.heads_kv);
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int q0 = blockIdx.x * kBlockQueries;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row0 = q0 + warp * 16;  // this thread's rows: warp_row0 + lane / 4 and + 8
  float dq_acc[D / 8][4] = {};

  if (q0 < lq) {  // else every row of the block is padding: dQ = 0 (block-uniform)
    const T* q = static_cast<const T*>(a.q) + b * a.q_batch_stride + h * a.q_head_stride;
    const T* dout = static_cast<const T*>(args.dout) + b * a.o_batch_stride + h * a.o_head_stride;
    const T* k = static_cast<const T*>(a.k) + b * a.k_batch_stride + hk * a.k_head_stride;
    const T* v = static_cast<const T*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;
    mma::copy_tile<kBlockQueries, D, true>(q_tile, q + q0 * a.q_seq_stride, a.q_seq_stride, lq - q0);
    mma::copy_tile<kBlockQueries, D, true>(do_tile, dout + q0 * a.o_seq_stride, a.o_seq_stride, lq - q0);
    mma::cp_async_commit();

    // This thread's two rows: LSE, D_i and the keys they see (empty past the
    // sequence and for rows that see no key, LSE = -inf: no gradient).
    const std::int64_t row_base = (static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q;
    float row_lse[2], row_delta[2];
    KeyRange row_keys[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = warp_row0 + lane / 4 + 8 * r;
      row_lse[r] = i < lq ? a.lse[row_base + i] : -INFINITY;
      row_delta[r] = i < lq ? args.delta[row_base + i] : 0.0f;
      row_keys[r] = i < lq && row_lse[r] != -INFINITY ? visible_keys(a, i, lq, lk) : KeyRange{0, -1};
    }

    const KeyRange block = rowthread_bwd::keys_of_rows(a, q0, min(q0 + kBlockQueries, lq) - 1, lq, lk);
    for (int j0 = block.first / kBlockKeys * kBlockKeys; j0 <= block.last; j0 += kBlockKeys) {
      // Rows past lk are zero-filled; j0 <= block.last < lk, so the source's first row is inside the tensor.
      mma::copy_tile<kBlockKeys, D, true>(k_tile, k + j0 * a.k_seq_stride, a.k_seq_stride, lk - j0);
      mma::copy_tile<kBlockKeys, D, true>(v_tile, v + j0 * a.v_seq_stride, a.v_seq_stride, lk - j0);
      mma::cp_async_commit();
      mma::cp_async_wait<0>();  // Q and dO (first tile), K and V have landed
      __syncthreads();

      // S = Q K^T, then P in place: element e of n-tile nt is row
      // warp_row0 + g + 8 (e / 2), key j0 + nt * 8 + 2t + e % 2.
      float p[kTilesK][4] = {};
      product_abt<T, D, kTilesK>(p, q_tile, warp * 16, k_tile);
#pragma unroll
      for (int nt = 0; nt < kTilesK; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j0 + nt * 8 + lane % 4 * 2 + e % 2;
          p[nt][e] = sees(row_keys[e / 2], key) ? expf(p[nt][e] * a.scale - row_lse[e / 2]) : 0.0f;
        }

      // dP = dO V^T, then dS = P o (dP - D_i) in place, and dQ += dS K.
      float ds[kTilesK][4] = {};
      product_abt<T, D, kTilesK>(ds, do_tile, warp * 16, v_tile);
#pragma unroll
      for (int nt = 0; nt < kTilesK; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) ds[nt][e] = p[nt][e] * (ds[nt][e] - row_delta[e / 2]);
      std::uint32_t fragments[kTilesK / 2][4];
      to_fragments<T>(ds, fragments);
      mma::pv_x4<T, D, true, kTilesK / 2>(dq_acc, fragments, k_tile);
      __syncthreads();  // the next tile overwrites K and V
    }
    // Where the rows see no key, Q and dO's copies were never waited for:
    // none may still be writing shared memory when the block ends.
    mma::cp_async_wait<0>();
  }

  // Every row of the padded shape is written: past the sequence 0 (and rows
  // that see no key have 0 accumulators).
  T* dq = static_cast<T*>(args.dq) + b * a.q_batch_stride + h * a.q_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = warp_row0 + lane / 4 + 8 * r;
    if (i >= a.seqlen_q) continue;
    const bool live = i < lq;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<std::uint32_t*>(dq + i * a.q_seq_stride + dt * 8 + lane % 4 * 2) =
          pack<T>(live ? a.scale * dq_acc[dt][2 * r] : 0.0f, live ? a.scale * dq_acc[dt][2 * r + 1] : 0.0f);
  }
}

// ---------------------------------------------------------------------------
// Host side.

/// Dynamic shared memory of each kernel (bytes).
template <int D, bool kAtomicDq>
inline constexpr int kDkdvSmemBytes = 2 * kBlockKeys * D * 2 + 2 * kStepQueries<D> * D * 2 +
                                      (kAtomicDq ? kBlockKeys * kStepQueries<D> * 2 : 0) + 4 * kStepQueries<D> * 4;
template <int D>
inline constexpr int kDqSmemBytes = 2 * kBlockQueries * D * 2 + 2 * kBlockKeys * D * 2;

/// Calls `go.template operator()<T, D>()` for the args' dtype (__half or
/// __nv_bfloat16) and head dim (64 or 128; inside the declared domain).
template <typename Go>
void with_backward_instance(const gpu::AttentionArgs& a, Go&& go) {
  if (a.dtype == kDTypeBf16) {
    if (a.head_dim == 64) go.template operator()<__nv_bfloat16, 64>();
    else go.template operator()<__nv_bfloat16, 128>();
  } else {
    if (a.head_dim == 64) go.template operator()<__half, 64>();
    else go.template operator()<__half, 128>();
  }
}

inline unsigned tiles(int rows, int tile) { return static_cast<unsigned>((rows + tile - 1) / tile); }

}  // namespace flashcheck::kernels::mma_bwd

namespace flashcheck::kernels {

/// Enqueues the backward on the stream: D_i (rowthread's kernel), then dK/dV
/// (with dQ's atomic share when kAtomicDq), then dQ (from the accumulator by
/// rowthread's kernel when kAtomicDq, else the deterministic dQ kernel).
/// Throws gpu::CudaError.
template <bool kAtomicDq>
void launch_mma_backward(const BackwardArgs& args, const gpu::CallSite& site) {
  using namespace mma_bwd;
  const gpu::AttentionArgs& a = args.attention;
  static_assert(kMmaBackwardCapabilities.tile_kv == kBlockKeys && kMmaBackwardCapabilities.tile_q == kBlockQueries,
                "the domain declares the kernels' tiles");
  const dim3 row_grid(rowthread_bwd::blocks(a.seqlen_q), a.batch * a.heads_q);  // a thread per row
  const dim3 key_grid(tiles(a.seqlen_kv, kBlockKeys), a.batch * a.heads_kv);
  const dim3 query_grid(tiles(a.seqlen_q, kBlockQueries), a.batch * a.heads_q);
  with_backward_instance(a, [&]<typename T, int D>() {
    static_assert(D == 64 || D == 128, "dK and dV of 16 keys x D in registers: D <= 128");
    if (row_grid.x > 0 && row_grid.y > 0) {
      rowthread_bwd::delta_kernel<T><<<row_grid, rowthread_bwd::kThreads, 0, a.stream>>>(args);
      gpu::check_launch("rowthread_bwd::delta_kernel", site);
    }
    if (key_grid.x > 0 && key_grid.y > 0) {
      constexpr int kSmem = kDkdvSmemBytes<D, kAtomicDq>;
      gpu::check(cudaFuncSetAttribute(dkdv_kernel<T, D, kAtomicDq>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "cudaFuncSetAttribute", site);
      dkdv_kernel<T, D, kAtomicDq><<<key_grid, kThreads, kSmem, a.stream>>>(args);
      gpu::check_launch("mma_bwd::dkdv_kernel", site);
    }
    if constexpr (kAtomicDq) {
      if (row_grid.x > 0 && row_grid.y > 0) {
        // Every row of the padded shape: scale x accumulator, 0 past the
        // sequence (rows that see no key were never added to: 0).
        rowthread_bwd::dq_from_accumulator_kernel<T><<<row_grid, rowthread_bwd::kThreads, 0, a.stream>>>(args);
        gpu::check_launch("rowthread_bwd::dq_from_accumulator_kernel", site);
      }
    } else if (query_grid.x > 0 && query_grid.y > 0) {
      constexpr int kSmem = kDqSmemBytes<D>;
      gpu::check(cudaFuncSetAttribute(dq_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                 "cudaFuncSetAttribute", site);
      dq_kernel<T, D><<<query_grid, kThreads, kSmem, a.stream>>>(args);
      gpu::check_launch("mma_bwd::dq_kernel", site);
    }
  });
}

}  // namespace flashcheck::kernels
