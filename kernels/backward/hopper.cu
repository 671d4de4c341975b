// hopper-bwd: the backward on Hopper (sm_90a), FlashAttention-2's Algorithm 2
// rebuilt on the Hopper kernel's pieces: TMA loads on mbarriers, wgmma for the
// five products, a producer warpgroup and two consumer warpgroups
// (backward/hopper_kernel.cuh says how a block runs).
//
// Lineage: fa2-mma-bwd (backward/mma.cu) for the algorithm, the D_i and dQ
// row kernels (reused, backward/mma_kernel.cuh) and the row information; the
// forward hopper kernel (kernels/hopper/) for the PTX wrappers
// (hopper_ptx.cuh, which gained the TMA reduction), the wgmma wrappers
// (wgmma_ops.cuh, which gained the m64n32 shape and ss_tb, B MN-major, for
// dQ = dS K) and the tensor maps (launch.cuh). FlashAttention-3's backward
// (Shah et al., 2024) for the shape: keys outer in the block, dS through
// shared memory for dQ, dQ's share added from shared memory by TMA.
// Version 1 (commit 9531db9), what changed from fa2-mma-bwd:
//   - Q and dO arrive by TMA into a two-stage ring (a producer warp), the
//     step's row information beside them, instead of every thread's cp.async;
//   - the products are wgmma (m64, a warpgroup's 64 keys) from shared memory,
//     P^T and dS^T as register A operands (rs), dQ = dS K from a dS tile
//     written with stmatrix.trans; dQ's share added with red.global.add.v2.f32;
//   - the warpgroup index goes through a shuffle (warp-uniform for the
//     compiler), a flaw issue 24 found in the forward kernel, avoided here.
//     (Its other, 256 arrivals on an empty barrier where FlashAttention-3 has
//     one a warp, stays: one a warp after a __syncwarp made racecheck report
//     the other lanes' reads racing the producer's next writes, 24 hazards.)
//   H100: 3.50 ms at d = 128 (the problems below), 2.11 ms at d = 64.
// Version 2 (not kept): dQ's share leaves the consumers through shared
//   memory, added by a writer warp with one 1-D bulk reduction a row: d = 128
//   2.85 ms, but d = 64 2.74 ms (64 reductions of 256 bytes a step).
// Version 3 (commit 79c26b1): one writer thread adds the share with TMA tensor
//   reductions (boxes of 32 f32 columns x 64 rows, 128-byte swizzled, which
//   the consumers' stores meet at 2 wavefronts): d = 128 2.79 ms, d = 64
//   1.99 ms; causal 2.42 and 1.57 ms.
// Version 4 (commit 356b8bd): a 1-D grid in key-block-major order, so the key
//   blocks with the most rows under a causal mask start first (the short ones
//   fill the last wave): causal d = 128 1.81 ms, d = 64 1.12 ms; non-causal
//   the same.
// Version 5 (commit f71dce0): P keeps its subnormals (ex2.approx without
//   .ftz): a 10-minute GPU sweep found dK of keys whose
//   every P lies below 2^-126 flushed to 0 (2.2 times the floor; docs/perf.md,
//   2026-11-28). H100, 2026-11-28: d = 128 2.78 ms, causal 1.80; d = 64 1.96,
//   causal 1.12 (version 4's figures below, from another day, within 3%).
// Version 6 (this one): the same subnormals at one FMUL more than the flushing
//   exp2 (exp2_shifted_keeping_subnormals, fa2-mma-bwd's version 6). H200,
//   2026-11-28, two runs each beside version 5: d = 128 2.78 -> 2.76 ms,
//   causal 1.64 -> 1.66; d = 64 1.99 -> 1.99, causal 1.09 -> 1.10 (no change).
// Speed (H100 80GB HBM3, 2026-11-26, `flashcheck bench`, median of 10 (5 at
// 16384); cuDNN 9.14 is flashcheck's peer graph in the same call, torch's
// FlashAttention-2 and cuDNN 9.19 backward in the same call; docs/perf.md,
// "The Hopper backward"), bf16 b=1 hq=64 hkv=8, ms:
//   N=4096  d=128 2.875 (cuDNN 9.14 3.076, torch cuDNN 9.19 2.638, FA2 4.957)
//           causal 1.814 (3.075, 1.593, 2.976)
//           d=64 1.953 (2.715, 1.683, 2.672); causal 1.119 (2.769, 1.168, 1.688)
//   N=16384 d=128 47.93 (46.93, 39.82, 70.53); causal 25.36 (48.65, 21.97, 35.62)
//           d=64 30.51 (42.25, 24.59, 37.93); causal 15.46 (43.19, 13.10, 20.44)
// Registers (ptxas, sm_90a, CUDA 13.0): 168 at the 384-thread launch bound;
// the consumers take 232 (setmaxnreg), the producer warpgroup 40. Spills:
// 12 bytes in the producer's loop (d = 64 and 128), 4 more at d = 128.
// Shared memory a block: 115 KiB (d = 64), 195 KiB (d = 128).
// What it does, on one stream: D_i (mma_bwd::delta_kernel), the dK/dV pass
// with dQ's share added to an f32 accumulator by TMA reductions, then dQ =
// scale x the accumulator in the dtype (mma_bwd::dq_from_accumulator_kernel).
// Domain (flashcheck/kernels/backward/hopper.hpp): f16/bf16; d = dv in
// {64, 128}; every mask; GQA/MQA; padded batches; BHSD and BSHD; finite
// inputs; sm_90a. Not deterministic (dQ's reductions).
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
