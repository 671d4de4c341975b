// pipelined: a two-stage cp.async pipeline (article 002's v3).
//
// What changed from swizzled: K and V each get two shared buffers, and the
// copies of tile n + 1 are issued before tile n is computed, as two commit
// groups (K, then V). The first product waits only for its K group, the
// second only for its V group. Why: in swizzled every tile began with the
// whole block stalled on global memory (the profile's long-scoreboard
// stalls); now the loads of the next tile overlap this tile's products and
// softmax.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10 after 3
// warm-ups, 3 input sets; bf16 B=4 H=16 N=M=4096 unless said; TFLOP/s):
//   d=128 291.8, d=128 causal_br 271.9, d=64 243.3, d=256 201.2, f16 d=128 291.8.
//   Registers (ptxas, sm_90a, bf16): 255 (d=128) / 255, 152 B spilled (d=256).
//   +7% on d=128; slower than swizzled on d=64 and d=256, where the second
// K/V stage (twice the shared memory) and the registers cost a block per SM.
#include "mma/two_stage_kernel.cuh"

namespace flashcheck::kernels::mma {
namespace {

void launch_pipelined(const gpu::AttentionArgs& a, const gpu::CallSite& site) { dispatch<TwoStage<false>::Kernel>(a, site); }

gpu::KernelRegistration registration("mma-pipelined", "mma.sync: two-stage cp.async pipeline, K and V groups (f16/bf16)",
                                     kMmaCapabilities, launch_pipelined);

}  // namespace
}  // namespace flashcheck::kernels::mma
