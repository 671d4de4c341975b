// The mma family's epilogue: O = acc / sum and LSE for a thread's two rows of
// an m16 tile, stored from registers. Used by every kernel of kernels/mma/
// (basic, swizzled, pipelined, ldmatrix_x4, kv_pipelined and its mutants; the
// bf16 truncating mutant through kTowardZero). The Hopper kernel stores
// through TMA (kernels/hopper/epilogue.cuh); both read common/softmax.cuh's
// RowState and round with common/ptx.cuh's pack().
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention.cuh"
#include "common/ptx.cuh"
#include "common/softmax.cuh"

namespace flashcheck::kernels::mma {

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

}  // namespace flashcheck::kernels::mma
