// ldmatrix_x4: four 8x8 matrices per ldmatrix for K and V (article 002's v4).
//
// What changed from pipelined: the fragments of K come in as 8 keys x 32 dims
// (two k-steps) per ldmatrix.x4, and those of V as 16 keys x 16 dims (two
// n-tiles) per ldmatrix.x4.trans, instead of one x2 per mma. Why: Q already
// sits in registers, so the products are bound by issuing B-fragment loads;
// x4 halves the ldmatrix instructions (and their address arithmetic) for the
// same bytes.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10 after 3
// warm-ups, 3 input sets; bf16 B=4 H=16 N=M=4096 unless said; TFLOP/s):
//   d=128 288.6, d=128 causal_br 266.9, d=64 234.8, d=256 214.9, f16 d=128 288.1.
//   Registers (ptxas, sm_90a, bf16): 255, 8 B spilled (d=128) / 255, 120 B spilled (d=256).
//   Within noise of pipelined: halving the ldmatrix count did not move it,
// the loop is not bound by issuing them.
#include "mma/two_stage_kernel.cuh"

namespace flashcheck::kernels::mma {
namespace {

void launch_ldmatrix_x4(const gpu::AttentionArgs& a, const gpu::CallSite& site) { dispatch<TwoStage<true>::Kernel>(a, site); }

gpu::KernelRegistration registration("mma-ldmatrix-x4", "mma.sync: pipelined with ldmatrix.x4 for K and V (f16/bf16)",
                                     kMmaCapabilities, launch_ldmatrix_x4);

}  // namespace
}  // namespace flashcheck::kernels::mma
