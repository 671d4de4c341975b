// Device helpers shared by the kernel family (never by the oracles): sequence
// lengths, the mask spec, and the visible key range of a query row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashcheck/core/gpu/gpu_subject.hpp"

namespace flashcheck::kernels {

// MaskKind values, as kernels see them (core/problem.hpp defines the spec).
inline constexpr int kMaskNone = 0, kMaskCausalTopLeft = 1, kMaskCausalBottomRight = 2, kMaskWindow = 3;

__device__ __forceinline__ int query_length(const gpu::AttentionArgs& a, int b) {
  return a.lens_q ? a.lens_q[b] : a.seqlen_q;
}
__device__ __forceinline__ int key_length(const gpu::AttentionArgs& a, int b) {
  return a.lens_kv ? a.lens_kv[b] : a.seqlen_kv;
}

/// The keys [first, last] query i sees (empty when first > last); with lq
/// queries and lk keys, the diagonal is bottom-right aligned at i + lk - lq.
struct KeyRange {
  int first, last;
};

__device__ __forceinline__ KeyRange visible_keys(const gpu::AttentionArgs& a, int i, int lq, int lk) {
  const int diagonal = i + lk - lq;
  KeyRange range{0, lk - 1};
  if (a.mask == kMaskCausalTopLeft) range.last = min(range.last, i);
  if (a.mask == kMaskCausalBottomRight) range.last = min(range.last, diagonal);
  if (a.mask == kMaskWindow) {
    if (a.window_left >= 0) range.first = max(range.first, diagonal - a.window_left);
    if (a.window_right >= 0) range.last = min(range.last, diagonal + a.window_right);
  }
  return range;
}

__device__ __forceinline__ bool sees(const KeyRange& range, int j) { return j >= range.first && j <= range.last; }

/// Grids over (batch, head) pairs: a grid's y holds at most 65535, so
/// `pairs` run as y x z, the z-th slice taking pairs [65535 z, 65535 (z + 1)).
/// A block's pair is head_pair(); blocks past the last pair (the last slice's
/// tail) leave at once: head_pair() >= pairs.
inline constexpr int kMaxGridY = 65535;
inline dim3 pair_grid(unsigned x, int pairs) {
  return dim3(x, static_cast<unsigned>(pairs < kMaxGridY ? pairs : kMaxGridY),
              static_cast<unsigned>((pairs + kMaxGridY - 1) / kMaxGridY));
}
__device__ __forceinline__ int head_pair() { return static_cast<int>(blockIdx.z) * kMaxGridY + static_cast<int>(blockIdx.y); }

inline constexpr unsigned kFullWarp = 0xffffffffu;

/// Butterfly reductions over a warp: every lane ends with the same bits (each
/// step adds a pair in both orders, and + and max commute exactly), so the
/// result does not depend on which lane reads it.
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(kFullWarp, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullWarp, x, offset);
  return x;
}

/// A quiet NaN, for the plain formula's NaN results.
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

}  // namespace flashcheck::kernels
