// The mma family's launch: the (batch, head, query block) of a block and its
// tensors' starting points, and the launcher over the grid (query blocks,
// heads), in chunks of the grid's y limit. Used by every kernel of
// kernels/mma/ (basic, swizzled, pipelined, ldmatrix_x4, kv_pipelined and its
// mutants). The dispatch on dtype and head dim and the domain, which the
// Hopper kernel shares, are in common/launch.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/attention.cuh"
#include "common/launch.cuh"
#include "mma/tiles.cuh"

namespace flashcheck::kernels::mma {

static_assert(kMmaCapabilities.tile_q == kBlockQ, "the domain declares the family's query block");

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

/// A kernel of the family: kernel(args, bh_base), grid (query blocks, heads).
using MmaKernel = void (*)(gpu::AttentionArgs, int);

/// Launches `kernel` over every (batch, head) in chunks of 65535 (the grid's
/// y limit) and every block of `block_rows` queries, with `threads` a block
/// and `smem_bytes` of dynamic shared memory.
inline void launch_mma(MmaKernel kernel, int smem_bytes, const gpu::AttentionArgs& a, const gpu::CallSite& site,
                       const char* name, int block_rows = kBlockQ, int threads = kThreads) {
  const int query_blocks = (a.seqlen_q + block_rows - 1) / block_rows;
  const int heads = a.batch * a.heads_q;
  if (query_blocks == 0 || heads == 0) return;
  gpu::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
             "cudaFuncSetAttribute", site);
  for (int base = 0; base < heads; base += 65535) {
    const dim3 grid(query_blocks, min(65535, heads - base));
    kernel<<<grid, threads, smem_bytes, a.stream>>>(a, base);
    gpu::check_launch(name, site);
  }
}

/// Picks the instantiation for the args' dtype and head dim (inside the domain).
template <template <typename, int> class Kernel>
void dispatch(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  with_instance(a, [&]<typename T, int D>() { Kernel<T, D>::launch(a, site); });
}

}  // namespace flashcheck::kernels::mma
