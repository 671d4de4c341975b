// fa2_rowthread: FlashAttention-2's loop order, a thread per query row.
//
// Lineage: article 001 (a minimal FlashAttention-2 forward). What changes from
// minimal_rowthread (the FlashAttention-1 order): the Q tile is the outer loop
// and each thread keeps its row's output unnormalised in registers across all
// K/V tiles, dividing by the running sum once at the end, instead of reading,
// rescaling and writing O in global memory after every tile. It writes
// L = m + log(l), the log-sum-exp. Tiles entirely outside a row block's masked
// range are skipped; only boundary tiles test the mask.
// Domain: f32 storage and arithmetic; d, dv <= 128; any seqlen_q/seqlen_kv
// (tails predicated); none/causal_tl/causal_br/window masks; GQA/MQA; padded
// batches; LSE; BHSD and BSHD.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10):
//   f32 B=4 H=16 N=M=1024 d=64: 9.894 ms, 1.74 TFLOP/s; causal_br 5.652 ms, 1.52 TFLOP/s
//   f32 B=2 H=16 N=M=2048 d=128: 38.903 ms, 1.77 TFLOP/s
//   decode f32 B=16 Hq=32 Hkv=8 Sq=1 Skv=8192 d=128: 65.835 ms
#include "fp32/fa2_rowthread_kernel.cuh"

namespace flashcheck::kernels {
namespace {

gpu::KernelRegistration registration("fa2-rowthread", "FlashAttention-2 loop order, a thread per query row (f32)",
                                      kFa2Capabilities, launch_fa2_rowthread<Fa2Flaw::none>);

}  // namespace

template void launch_fa2_rowthread<Fa2Flaw::none>(const gpu::AttentionArgs&, const gpu::CallSite&);

}  // namespace flashcheck::kernels
