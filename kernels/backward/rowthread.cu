// fa2-rowthread-bwd: FlashAttention-2's backward (Algorithm 2) in its simplest
// deterministic shape, a thread per row, in f32 arithmetic.
//
// Lineage: the FA2 paper's Algorithm 2 (Dao 2023) and cpu-fa2-tiles
// (kernels/cpu/fa2_tiles.cpp), its CPU emulation; the forward is
// fp32/fa2_rowthread's loop order on every dtype. It is the first GPU
// backward subject, the host of the atomic-dQ mutant (issue 22 item 7), and
// the slow, obviously-ordered member of the backward family that issue 23's
// mma.sync and Hopper kernels grow from.
// What it does: three kernels on one stream.
//   1. D_i = rowsum(dO_i o O_i) in f32, a thread per query row.
//   2. dK, dV: a block per 64 keys of one (batch, K/V head), a thread per key
//      row, which owns its dK and dV rows: it walks the query rows of every
//      query head of the GQA group in shared-memory tiles, recomputes
//      P = exp(S scale - LSE) from the handed LSE (masked keys absent), and
//      sums dV += P dO and dK += dS Q with dS = P (dO V^T - D) (the GQA
//      reduction is this loop over the group's heads).
//   3. dQ: a block per 64 query rows, a thread per row, walking the keys in
//      shared-memory tiles: dQ += dS K.
// Deterministic by construction: each output element is summed by one thread
// in a fixed order, nothing is written by two blocks, no atomics
// (Capabilities::backward_deterministic). FlashAttention-2's own backward adds
// dQ with atomics from step 2 instead; that is the mutant
// mutant-gpu-bwd-atomic-dq (kernels/mutants/backward_mutants.cu).
// Domain (flashcheck/kernels/backward/rowthread.hpp): f32/f16/bf16 storage,
// f32 arithmetic; d, dv <= 256; any lengths; none/causal_tl/causal_br/window;
// GQA/MQA; padded batches; LSE; BHSD and BSHD; both passes.
// Speed (H200, 2026-11-26, flashcheck bench, median of 10): 1764 ms on
// b=4 hq=16 sq=skv=4096 d=128 bf16, 0.8 TFLOP/s counting 2.5 forwards (cuDNN's
// sdpa_backward: 2.71 ms, 508 TFLOP/s); 484 ms at d=64; 247 ms on b=2 hq=16
// sq=skv=2048 d=128 f32. A reference kernel for correctness, not for speed
// (issue 23's kernels are the fast ones).
#include "backward/rowthread_kernel.cuh"

namespace flashcheck::kernels {
namespace {

struct Registration {
  Registration() {
    Registry::instance().add([] {
      return std::make_unique<BackwardKernelSubject>(
          kRowthreadBackwardName, "FlashAttention-2's backward, a thread per row, dQ in its own pass (f32 arithmetic)",
          kRowthreadBackwardCapabilities, launch_rowthread_forward, launch_rowthread_backward<BackwardFlaw::none>,
          /*dq_accumulator=*/false);
    });
  }
} registration;

}  // namespace
}  // namespace flashcheck::kernels
