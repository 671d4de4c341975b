// hopper-bwd: the backward on Hopper (sm_90a), FlashAttention-2's Algorithm 2
// rebuilt on the Hopper kernel's pieces: TMA loads on mbarriers, wgmma for the
// five products, a producer warpgroup and two consumer warpgroups
// (backward/hopper_kernel.cuh says how a block runs).
//
// Lineage: fa2-mma-bwd (backward/mma.cu) for the algorithm, the D_i and dQ
// row kernels (reused, backward/mma_kernel.cuh), the row information and the
// red.global.add.v2.f32 dQ share; the forward hopper kernel (kernels/hopper/)
// for the PTX wrappers (hopper_ptx.cuh), the wgmma wrappers (wgmma_ops.cuh,
// which gained the m64n32 shape and ss_tb, B MN-major, for dQ = dS K) and the
// tensor maps (launch.cuh). FlashAttention-3's backward (Shah et al., 2024)
// for the shape: keys outer in the block, dS through shared memory for dQ.
// Version 1 (this one), what changed from fa2-mma-bwd:
//   - Q and dO arrive by TMA into a two-stage ring (a producer warp), the
//     step's row information beside them, instead of every thread's cp.async;
//   - the products are wgmma (m64, a warpgroup's 64 keys) from shared memory,
//     P^T and dS^T as register A operands (rs), dQ = dS K from a dS tile
//     written with stmatrix.trans;
//   - the warpgroup index goes through a shuffle (warp-uniform for the
//     compiler), a flaw issue 24 found in the forward kernel, avoided here.
//     (Its other, 256 arrivals on an empty barrier where FlashAttention-3 has
//     one a warp, stays: one a warp after a __syncwarp made racecheck report
//     the other lanes' reads racing the producer's next writes.)
// What it does, on one stream: D_i (mma_bwd::delta_kernel), the dK/dV pass
// with dQ's share added atomically to an f32 accumulator, then dQ = scale x
// the accumulator in the dtype (mma_bwd::dq_from_accumulator_kernel).
// Domain (flashcheck/kernels/backward/hopper.hpp): f16/bf16; d = dv in
// {64, 128}; every mask; GQA/MQA; padded batches; BHSD and BSHD; finite
// inputs; sm_90a. Not deterministic (dQ's atomics).
#include <cudaTypedefs.h>

#include <climits>

#include "backward/backward_subject.hpp"
#include "backward/hopper_kernel.cuh"
#include "flashcheck/kernels/backward/hopper.hpp"
#include "hopper/launch.cuh"

namespace flashcheck::kernels {
namespace {

using namespace hopper_bwd;

/// The f32 dQ accumulator [batch, heads_q, seqlen_q, d] as a 4-D map {d,
/// seq, head, batch}, reduced into in boxes of {32, kStep, 1, 1} (128 bytes a
/// row, the 128-byte swizzle the kernel writes its dQ share in).
CUtensorMap dq_accumulator_map(const BackwardArgs& args, int d, const gpu::CallSite& site) {
  const gpu::AttentionArgs& a = args.attention;
  CUtensorMap map{};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(a.seqlen_q),
                              static_cast<cuuint64_t>(a.heads_q), static_cast<cuuint64_t>(a.batch)};
  const cuuint64_t row = static_cast<cuuint64_t>(d) * 4;
  const cuuint64_t strides[3] = {row, row * a.seqlen_q, row * a.seqlen_q * a.heads_q};
  const cuuint32_t box[4] = {32, static_cast<cuuint32_t>(kStep), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result = hopper::encode_function(site)(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, args.dq_accum, dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    throw gpu::CudaError(cudaErrorInvalidValue,
                         "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(static_cast<int>(result)) +
                             ") for the dQ accumulator in " + site.kernel + " on " + site.problem,
                         false);
  return map;
}

template <typename T, int D>
void launch_instance(const BackwardArgs& args, const gpu::CallSite& site) {
  const gpu::AttentionArgs& a = args.attention;
  const dim3 row_grid = pair_grid(mma_bwd::tiles(a.seqlen_q, mma_bwd::kChunkRows<D>), a.batch * a.heads_q);
  // One block per key block and (batch, K/V head) pair, in a 1-D grid (the kernel's order).
  const long long key_blocks = static_cast<long long>(mma_bwd::tiles(a.seqlen_kv, kKeys)) * a.batch * a.heads_kv;
  if (key_blocks > INT_MAX) throw gpu::Unsupported("hopper-bwd: more than 2^31 - 1 key blocks");
  const bool rows = row_grid.x > 0 && row_grid.y > 0;
  if (rows) {
    mma_bwd::delta_kernel<T, D, MmaBackwardFlaw::none><<<row_grid, 256, 0, a.stream>>>(args);
    gpu::check_launch("mma_bwd::delta_kernel", site);
  }
  if (key_blocks > 0) {
    auto* kernel = hopper_backward<T, D>;
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
    kernel<<<static_cast<unsigned>(key_blocks), kThreads, Layout<D>::kSmemBytes, a.stream>>>(q, k, v, dout, dq, args);
    gpu::check_launch("hopper_bwd::hopper_backward", site);
  }
  if (rows) {  // every row of the padded shape: scale x accumulator, 0 past the sequence
    mma_bwd::dq_from_accumulator_kernel<T, D><<<row_grid, 256, 0, a.stream>>>(args);
    gpu::check_launch("mma_bwd::dq_from_accumulator_kernel", site);
  }
}

void launch_hopper_backward(const BackwardArgs& args, const gpu::CallSite& site) {
  static_assert(kHopperBackwardCapabilities.tile_kv == kKeys && kHopperBackwardCapabilities.tile_q == kStep,
                "the domain declares the kernel's tiles");
  const gpu::AttentionArgs& a = args.attention;
  const bool bf16 = a.dtype == kDTypeBf16;
  if (a.head_dim == 64) bf16 ? launch_instance<__nv_bfloat16, 64>(args, site) : launch_instance<__half, 64>(args, site);
  else bf16 ? launch_instance<__nv_bfloat16, 128>(args, site) : launch_instance<__half, 128>(args, site);
}

struct Registration {
  Registration() {
    Registry::instance().add([] {
      return std::make_unique<BackwardKernelSubject>(
          kHopperBackwardName,
          "Hopper backward: TMA loads of Q and dO into a 2-stage ring, wgmma for the five products, producer + 2 "
          "consumer warpgroups, dQ added with atomics (f16/bf16, sm_90a)",
          kHopperBackwardCapabilities, launch_rowthread_forward, launch_hopper_backward, /*dq_accumulator=*/true);
    });
  }
} registration;

}  // namespace
}  // namespace flashcheck::kernels
