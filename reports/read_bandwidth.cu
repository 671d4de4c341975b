// The read-only bandwidth ceiling (issue 24): a kernel that reads a buffer
// once and writes one word a block, so that a decode, which reads K and V
// and writes almost nothing, is measured against what this GPU reads, not
// against a copy that also writes (cuDNN's decode reached 108% of the copy
// ceiling on an H200).
//
// Each thread streams 16-byte loads (ld.global.cs: evict-first, nothing is
// reused), four in flight per step, and folds them into a register by XOR;
// the XOR of a warp goes to one word a block, so no load can be removed.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "read_bandwidth.hpp"

namespace flashcheck::reports::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kLoadsInFlight = 4;

__global__ void __launch_bounds__(kThreads) read_all(const uint4* __restrict__ data, std::size_t count,
                                                    unsigned* __restrict__ sink) {
  unsigned folded = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * kThreads;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kLoadsInFlight - 1) * stride < count; i += kLoadsInFlight * stride) {
    uint4 x[kLoadsInFlight];
#pragma unroll
    for (int n = 0; n < kLoadsInFlight; ++n) x[n] = __ldcs(data + i + n * stride);
#pragma unroll
    for (int n = 0; n < kLoadsInFlight; ++n) folded ^= x[n].x ^ x[n].y ^ x[n].z ^ x[n].w;
  }
  for (; i < count; i += stride) {
    const uint4 x = __ldcs(data + i);
    folded ^= x.x ^ x.y ^ x.z ^ x.w;
  }
  for (int offset = 16; offset > 0; offset /= 2) folded ^= __shfl_xor_sync(0xffffffffu, folded, offset);
  if (threadIdx.x % 32 == 0) atomicXor(sink + blockIdx.x, folded);
}

}  // namespace

int read_all_blocks(int sm_count) { return sm_count * (2048 / kThreads); }

cudaError_t launch_read_all(const void* data, std::size_t bytes, unsigned* sink, int blocks, cudaStream_t stream) {
  read_all<<<blocks, kThreads, 0, stream>>>(static_cast<const uint4*>(data), bytes / sizeof(uint4), sink);
  return cudaGetLastError();
}

}  // namespace flashcheck::reports::detail
