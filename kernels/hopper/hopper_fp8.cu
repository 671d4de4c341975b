// hopper-fp8: the Hopper kernel (hopper.cu) on fp8 inputs, sm_90a. This
// file's kernel is version 4 (issue 25; docs/perf.md, "fp8 on Hopper" and
// "hopper-fp8 v4").
//
// v4 changed from v3: the consumers take no pingpong turns (mainloop.cuh:
// Consumer::kTurns); each issues its products as soon as its operands are
// ready. A warp-stall profile (ncu source counters) put 20% of the samples on
// MUFU.EX2 (the exponentials, issued at the unit's rate), 12% on the row
// maximum and 16% on wgmma waits; the turns made each consumer wait for the
// other's softmax, which is longer than its own products.
//  Speed (v4): H100, 2026-11-27, `flashcheck bench -s hopper-fp8,cudnn-fp8
//  --problems .devrun/bench-fp8only.problems` (cuDNN 9.14's fp8 SDPA in the
//  same run), e4m3 d=128: B=4 H=16 N=4096 0.680 ms, 808 TFLOP/s (0.82x
//  cuDNN's 982); B=1 H=16 N=16384 864 (0.87x); B=2 Hq=32 Hkv=8 N=8192 868
//  (0.84x); causal_tl N=4096 621 (0.76x), N=16384 792 (0.83x). v3 and v4 in
//  one run of another H100: 0.85x and 0.84x at N=4096, 0.89x both at 16384,
//  0.90x and 0.91x GQA, causal 0.72x -> 0.76x at 4096 and 0.78x -> 0.81x at
//  16384 (cuDNN's own time moved by 7% between the two machines).
//
// v3 changed from v2:
//  - 256-key tiles, as cuDNN's fp8 kernel (64 x 256) and FlashAttention-3's
//    (128 x 224) take. Each consumer turn issues the previous tile's P V,
//    waits for it and adds it to O, then issues S = Q K^T (mainloop.cuh:
//    Consumer::run_fp8): S (128 registers) and the product (64) are never
//    live together, and the _first wgmma forms (wgmma_ops.cuh) tell ptxas so.
//    v2 overlapped S with P V inside the warpgroup on 128-key tiles.
//  - Shared with hopper (v7): the wgmma descriptors are one per operand plus
//    constant offsets; the row maximum is a tree. hopper's conditional
//    rescaling (a kept softmax reference) is not used for fp8: P's rounding
//    to 2 or 3 fraction bits must happen against the running maximum
//    (softmax.cuh says what failed without it), so O is rescaled whenever a
//    row of the warp has a new maximum.
//  - The V^T pre-pass transposes 4 x 4 blocks of bytes in registers (v2:
//    single bytes through shared memory, 8-way bank conflicts, 51 us).
//  ptxas: 168 registers, no spill in the mainloop (96 bytes around it).
//  Speed (v3): H100, 2026-11-27, `flashcheck bench -s hopper-fp8,cudnn-fp8
//  --problems .devrun/bench-fp8only.problems` (cuDNN 9.14's fp8 SDPA in the
//  same run), e4m3 d=128: B=4 H=16 N=4096 0.685 ms, 803 TFLOP/s (0.84x
//  cuDNN's 961); B=1 H=16 N=16384 881 (0.90x); B=2 Hq=32 Hkv=8 N=8192 875
//  (0.91x); causal_tl N=4096 601 (0.72x), N=16384 747 (0.79x).
//  v2: 676 (0.70x), 740 (0.73x), 742 (0.75x), causal 543 (0.64x), 674 (0.73x).
//
// v2 changed from v1: each key tile's P V goes to a fresh wgmma accumulator
// and is added to O in f32. v1 carried O in the fp8 tensor cores'
// accumulator, which keeps about 13 fraction bits: O stalled on long rows
// (1.3 off at 32768 near-uniform keys) and leaned toward zero (bias t = -4431
// at 4096). v1: 716 TFLOP/s (0.75x), causal 581 (0.70x), 16384 776 (0.75x).
//
// Version 1, what changed from hopper: the element type. Q, K and V are e4m3 (or e5m2)
// with per-tensor descales (AttentionArgs::q/k/v_descale), O is bf16.
//  - S = Q K^T on wgmma m64n128k32 (fp8 operands, both K-major): the same
//    128-byte swizzled panels, 128 fp8 columns each, so d = 128 is one panel
//    and each k32 step is 32 bytes along it, as each k16 step is in bf16.
//  - O += P V: fp8 wgmma takes B K-major only, and the product's k is the
//    keys, so a pre-pass (launch.cuh: transpose_v_fp8) writes V^T, its keys
//    padded to the tile and each 16 stored in the order in which the S
//    accumulator's columns fall into P's k32 A fragment (softmax.cuh): P is
//    converted in place (cvt.rn.satfinite, unnormalized, in [0, 1]) and no
//    value moves between threads. FlashAttention-3 transposes V in shared
//    memory inside the kernel instead; the pre-pass costs one read and one
//    write of V.
//  - The descales of Q and K fold into the logit scale (and so into the
//    softcap and LSE); V's multiplies O with the row sum's reciprocal.
// Domain: kHopperFp8Capabilities (launch.cuh): d = 128, every mask, GQA,
// varlen, softcap, LSE; e4m3 and e5m2 (P in the inputs' format: e5m2's P
// keeps 2 fraction bits, as the baseline rounds it).
#include "hopper/launch.cuh"

namespace flashcheck::kernels::hopper {
namespace {

gpu::KernelRegistration registration("hopper-fp8",
                                     "Hopper on fp8 (e4m3/e5m2, d=128, O in bf16): 256-key tiles of k32 fp8 wgmma, each "
                                     "tile's P V added to O in f32, V transposed by a pre-pass, the descales folded "
                                     "into the scale (sm_90a)",
                                     kHopperFp8Capabilities, launch_hopper_fp8<HopperFlaw::none>);

}  // namespace
}  // namespace flashcheck::kernels::hopper
