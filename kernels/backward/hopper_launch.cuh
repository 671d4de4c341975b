// hopper-bwd's launcher (included by backward/hopper.cu, which registers the
// kernel, and by its mutants, kernels/mutants/hopper_backward_mutants.cu): the
// tensor maps, the sm_90a check, the grid, the dispatch on dtype and head dim,
// and the row kernels around the pass.
#pragma once

#include <cudaTypedefs.h>

#include "backward/backward_subject.hpp"
#include "backward/hopper_kernel.cuh"
#include "flashcheck/kernels/backward/hopper.hpp"
#include "hopper/launch.cuh"

namespace flashcheck::kernels::hopper_bwd {

/// The f32 dQ accumulator [batch, heads_q, seqlen_q, d] as a 4-D map {d,
/// seq, head, batch}, reduced into in boxes of {32, kStep, 1, 1} (128 bytes a
/// row, the 128-byte swizzle the kernel writes its dQ share in).
inline CUtensorMap dq_accumulator_map(const BackwardArgs& args, int d, const gpu::CallSite& site) {
  const gpu::AttentionArgs& a = args.attention;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(a.seqlen_q),
                              static_cast<cuuint64_t>(a.heads_q), static_cast<cuuint64_t>(a.batch)};
  const cuuint64_t row = static_cast<cuuint64_t>(d) * 4;
  const cuuint64_t strides[3] = {row, row * a.seqlen_q, row * a.seqlen_q * a.heads_q};
  return hopper::encode_4d(args.dq_accum, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, dims, strides, 32, kStep, site,
                           "the dQ accumulator");
}

template <typename T, int D, HopperBackwardFlaw kFlaw>
void launch_instance(const BackwardArgs& args, const gpu::CallSite& site) {
  const gpu::AttentionArgs& a = args.attention;
  const dim3 row_grid = pair_grid(mma_bwd::tiles(a.seqlen_q, mma_bwd::kChunkRows<D>), a.batch * a.heads_q);
  // One block per key block and (batch, K/V head) pair, tile-major (the kernel's order).
  const unsigned key_blocks =
      mma_bwd::tile_major_blocks(mma_bwd::tiles(a.seqlen_kv, kKeys), a.batch * a.heads_kv, "hopper-bwd's key blocks");
  const bool rows = row_grid.x > 0 && row_grid.y > 0;
  if (rows) {
    mma_bwd::delta_kernel<T, D, MmaBackwardFlaw::none><<<row_grid, 256, 0, a.stream>>>(args);
    gpu::check_launch("mma_bwd::delta_kernel", site);
  }
  if (key_blocks > 0) {
    auto* kernel = hopper_backward<T, D, kFlaw>;
    hopper::prepare(kernel, Layout<D>::kSmemBytes, site);
    constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
    const CUtensorMap k = hopper::tensor_map(a.k, kBf16, D, a.seqlen_kv, a.heads_kv, a.batch, a.k_seq_stride,
                                             a.k_head_stride, a.k_batch_stride, kKeys, site);
    const CUtensorMap v = hopper::tensor_map(a.v, kBf16, D, a.seqlen_kv, a.heads_kv, a.batch, a.v_seq_stride,
                                             a.v_head_stride, a.v_batch_stride, kKeys, site);
    // No query row: Q and dO are never loaded (no step); K's map stands in for theirs.
    const CUtensorMap q = rows ? hopper::tensor_map(a.q, kBf16, D, a.seqlen_q, a.heads_q, a.batch, a.q_seq_stride,
                                                    a.q_head_stride, a.q_batch_stride, kStep, site)
                               : k;
    const CUtensorMap dout = rows ? hopper::tensor_map(args.dout, kBf16, D, a.seqlen_q, a.heads_q, a.batch,
                                                       a.o_seq_stride, a.o_head_stride, a.o_batch_stride, kStep, site)
                                  : k;
    const CUtensorMap dq = rows ? dq_accumulator_map(args, D, site) : k;
    kernel<<<key_blocks, kThreads, Layout<D>::kSmemBytes, a.stream>>>(q, k, v, dout, dq, args);
    gpu::check_launch("hopper_bwd::hopper_backward", site);
  }
  if (rows) {  // every row of the padded shape: scale x accumulator, 0 past the sequence
    mma_bwd::dq_from_accumulator_kernel<T, D><<<row_grid, 256, 0, a.stream>>>(args);
    gpu::check_launch("mma_bwd::dq_from_accumulator_kernel", site);
  }
}

template <HopperBackwardFlaw kFlaw>
void launch(const BackwardArgs& args, const gpu::CallSite& site) {
  static_assert(kHopperBackwardCapabilities.tile_kv == kKeys && kHopperBackwardCapabilities.tile_q == kStep,
                "the domain declares the kernel's tiles");
  const gpu::AttentionArgs& a = args.attention;
  const bool bf16 = a.dtype == kDTypeBf16;
  if (a.head_dim == 64) bf16 ? launch_instance<__nv_bfloat16, 64, kFlaw>(args, site) : launch_instance<__half, 64, kFlaw>(args, site);
  else bf16 ? launch_instance<__nv_bfloat16, 128, kFlaw>(args, site) : launch_instance<__half, 128, kFlaw>(args, site);
}

}  // namespace flashcheck::kernels::hopper_bwd

namespace flashcheck::kernels {
/// hopper-bwd's launcher, hopper_bwd::launch<HopperBackwardFlaw::none>,
/// compiled once in backward/hopper.cu (the mutant that declares it
/// deterministic registers it without compiling its kernels again).
void launch_hopper_backward(const BackwardArgs& args, const gpu::CallSite& site);
}  // namespace flashcheck::kernels
