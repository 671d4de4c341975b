// hopper: the Hopper flagship (TMA + wgmma + warp specialization), sm_90a.
// The roles live in their own files (kernel.cuh composes them): mainloop.cuh,
// softmax.cuh, mask.cuh, epilogue.cuh, scheduler.cuh; the instructions are in
// hopper_ptx.cuh and wgmma_ops.cuh (generated), their layouts in NOTES.md.
//
// This file's kernel (v7; the versions' log with predictions: docs/perf.md).
// v7 changed from v6 (with hopper-fp8's v3, issue 25): a row's softmax
// reference (its maximum) moves only when the new weights would pass 2^8
// (FlashAttention-4's conditional rescaling), so O's 64 multiplies a tile
// are skipped unless a row of the warp moved; each wgmma descriptor is one
// per operand plus constant offsets (v6 built each from its address: ~40
// integer instructions a tile); the row maximum is a tree and the row sum
// four partial sums. Speed (v7): H100, 2026-11-27, `flashcheck bench -s
// hopper-fp8,cudnn-fp8,hopper --problems .devrun/bench-fp8.problems`, bf16
// d=128: B=4 H=16 N=4096 647 TFLOP/s (0.97x cuDNN's 670 in the same run),
// causal 547 (0.94x); B=1 H=16 N=16384 605 (0.99x); d=64 and d=256 were not
// measured for v7. v6 on an H100 (2026-11-27, the same bench): 0.903 ms
// against cuDNN's 0.849 (0.94x), 16384: 3.78 ms against 3.62.
// v6 changed from v5: head groups sized to an eighth of the L2 (was half),
// which cut the DRAM traffic 2.6x (ncu: 584 -> 225 GB/s at d=128, L2 hit
// 76% -> 87%) at the same speed; the launcher's once-per-device work moved
// out of the launch. The version as a whole:
//  - Intra-warpgroup overlap: tile j's S = Q K^T and tile j-1's O += P V are
//    issued together, and the softmax of S_j runs while the PV product does.
//  - Pingpong: the two consumers take turns to issue their products (named
//    barriers), so one's softmax runs under the other's products.
//  - A persistent grid (one block per SM) with a dynamic tile scheduler: a
//    global counter, zeroed by each launch's last block; the producer hands
//    tile ids to the consumers through shared memory. Head groups sized to
//    an eighth of the L2, the last query blocks first.
//  - O staged in shared memory and stored by TMA (rows past a sequence's end
//    stored from registers); Q released after the last S product, so the
//    next tile's Q loads under the last PV and the epilogue.
//  - setmaxnreg 24/240; the mbarrier waits before the wgmma fence (ptxas
//    serialized every wgmma otherwise: C7520).
//  Speed (v6): H200, 2026-11-23, `flashcheck bench -s hopper --warmup 3
//  --repeats 10 --input-sets 3` (cuDNN 9.14 in the same run), bf16: B=4 H=16
//  N=4096: d=128 611 TFLOP/s (0.91x cuDNN), causal 531 (0.92x), d=64 394
//  (0.74x), d=256 653 (0.89x); B=1 H=16 N=16384: d=128 601 (0.98x), causal
//  579 (0.89x). v5 (2026-11-22, scripts/gpu-check): 606 (0.91x), 540 (0.93x),
//  394 (0.75x), 667 (0.91x), 584 (0.93x), 588 (0.91x). Why it stops short of
//  cuDNN (ncu): docs/perf.md, "The diagnosis of the remaining gap".
//
// Softcap (issue 25, v6 otherwise unchanged): C tanh(scale s / C) on each S
// tile before its mask, an accurate tanh (softmax.cuh). H100, 2026-11-26,
// `flashcheck bench -s hopper`: B=4 H=16 N=4096 d=128 bf16 softcap=30 1.571 ms
// (350 TFLOP/s) against 0.899 ms uncapped (612 TFLOP/s, 0.93x cuDNN) in the
// same run: the tanh's two MUFU operations a logit cost 44% (docs/perf.md).
//
// Version 1: TMA into a 2-stage ring on mbarriers, SS wgmma for S, RS wgmma
// for O, producer + 2 consumers; no overlap, one block per tile.
//  H200, 2026-11-21, `flashcheck bench` (cuDNN 9.14 in the same run), bf16
//  B=4 H=16 N=4096: d=128 591 TFLOP/s (0.87x cuDNN), causal 499 (0.87x),
//  d=64 402 (0.76x), d=256 647 (0.92x).
// ptxas (sm_90a, -O3): 168 registers at the 384-thread launch bound before
// setmaxnreg; no spills for d = 64 and 128; d = 256 spills 16 bytes.
#include "hopper/launch.cuh"

namespace flashcheck::kernels::hopper {
namespace {

gpu::KernelRegistration registration("hopper",
                                     "Hopper: TMA loads into a 2-stage ring, wgmma for both products with the softmax "
                                     "overlapped, producer + 2 pingpong consumer warpgroups, persistent with a dynamic "
                                     "scheduler (f16/bf16, sm_90a)",
                                     kHopperCapabilities, launch_hopper<HopperFlaw::none>);

}  // namespace
}  // namespace flashcheck::kernels::hopper
