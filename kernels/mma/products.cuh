// The mma family's two products per warp, S += Q K^T and O += P V, from
// shared-memory tiles (mma/tiles.cuh) into m16n8 C fragments, with one
// ldmatrix.x2 per mma or one ldmatrix.x4 per two. Used by basic and swizzled
// (qk_x2, pv_x2), pipelined (x2) and ldmatrix_x4 (qk_x4, pv_x4);
// kv_pipelined has its own, for two m16 tiles a warp
// (kernels/mma/kv_pipelined_kernel.cuh: qk_shared, pv_shared).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mma/ptx.cuh"
#include "mma/tiles.cuh"

namespace flashcheck::kernels::mma {

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

}  // namespace flashcheck::kernels::mma
