// basic: the first tensor-core version (article 002's v1).
//
// What it brings over the fp32 family: tiles move global -> shared with
// cp.async, shared -> registers with ldmatrix, and both products run on the
// tensor cores as mma.m16n8k16 (f16/bf16 in, f32 accumulate). Each warp owns
// 16 query rows, keeps its Q fragments in registers for the whole key loop,
// and keeps the online softmax state (row max, partial sums) and O in
// registers; P goes from the S accumulators straight into A fragments, never
// through shared memory. One K and one V tile at a time: the block waits for
// both, computes, and only then loads the next pair. Shared memory is
// row-major and unswizzled, so every ldmatrix phase hits one bank group.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10 after 3
// warm-ups, 3 input sets; bf16 B=4 H=16 N=M=4096 unless said; TFLOP/s):
//   d=128 56.3, d=128 causal_br 54.0, d=64 55.5, d=256 55.2, f16 d=128 56.4.
//   Registers (ptxas, sm_90a, bf16): 202 (d=128) / 255, 52 B spilled (d=256).
//   The unswizzled ldmatrix phases serialise 8 ways: a fifth of swizzled's speed.
#include "mma/single_stage_kernel.cuh"

namespace flashcheck::kernels::mma {
namespace {

void launch_basic(const gpu::AttentionArgs& a, const gpu::CallSite& site) { dispatch<SingleStage<false>::Kernel>(a, site); }

gpu::KernelRegistration registration("mma-basic", "mma.sync: cp.async, ldmatrix, m16n8k16, unswizzled (f16/bf16)",
                                     kMmaCapabilities, launch_basic);

}  // namespace
}  // namespace flashcheck::kernels::mma
