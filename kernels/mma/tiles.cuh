// The mma family's block geometry and shared-memory tiles: the swizzled (or
// row-major) layout of a [rows][D] tile, its cp.async copy from global memory,
// and the Q fragments of a warp. Used by every kernel of kernels/mma/ (basic,
// swizzled, pipelined, ldmatrix_x4, kv_pipelined and its mutants); the Hopper
// kernel's tiles are TMA boxes (kernels/hopper/mainloop.cuh).
//
// Geometry shared by every version: a block of 4 warps owns 64 query rows, a
// warp owns 16 of them (one m16 tile), so the S and O accumulators of a warp
// are 16 x kBlockKv and 16 x D. Lane l of a warp holds, in every m16n8 C
// fragment, rows l/4 and l/4 + 8 at columns 2(l%4) and 2(l%4) + 1.
// (kv_pipelined gives a warp two m16 tiles, and a block 8 warps at d = 256:
// kernels/mma/kv_pipelined_kernel.cuh.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mma/ptx.cuh"

namespace flashcheck::kernels::mma {

inline constexpr int kWarps = 4, kThreads = 32 * kWarps, kBlockQ = 16 * kWarps;

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
/// zero-filled. Every one of the block's kBlockThreads threads takes part (the
/// family's 128 unless a kernel says otherwise: the backward's blocks are
/// larger); the caller commits.
template <int kRows, int D, bool kSwizzle, typename T, int kBlockThreads = kThreads>
__device__ __forceinline__ void copy_tile(std::uint32_t dst, const T* src, std::int64_t stride, int valid_rows) {
  constexpr int kChunks = D / 8, kRowStep = kBlockThreads / kChunks;
  static_assert(kBlockThreads % kChunks == 0 && kRows % kRowStep == 0, "each thread copies the same chunks of its rows");
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

}  // namespace flashcheck::kernels::mma
