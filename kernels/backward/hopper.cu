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
#include "backward/hopper_launch.cuh"

namespace flashcheck::kernels {

void launch_hopper_backward(const BackwardArgs& args, const gpu::CallSite& site) {
  hopper_bwd::launch<HopperBackwardFlaw::none>(args, site);
}

namespace {

struct Registration {
  Registration() {
    Registry::instance().add([] {
      return std::make_unique<BackwardKernelSubject>(
          kHopperBackwardName,
          "Hopper backward: TMA loads of Q and dO into a 2-stage ring, wgmma for the five products, producer + 2 "
          "consumer warpgroups, dQ added by TMA reductions (f16/bf16, sm_90a)",
          kHopperBackwardCapabilities, launch_rowthread_forward, launch_hopper_backward, /*dq_accumulator=*/true);
    });
  }
} registration;

}  // namespace
}  // namespace flashcheck::kernels
