// swizzled: XOR-swizzled shared memory (article 002's v2).
//
// What changed from basic: every tile is stored with its 16-byte chunks
// permuted, chunk c of row r at c ^ (r % 8), and ldmatrix reads through the
// same map. Why: a row of K or V is 128, 256 or 512 bytes, a multiple of the
// 128 bytes the 32 banks span, so the 8 row addresses of one ldmatrix phase
// (8 rows, one column chunk) all fell in the same 4 banks: an 8-way conflict
// on every fragment load. Swizzled, the 8 rows land on 8 different chunks.
// cp.async writes are unaffected (each thread writes whole 16-byte chunks).
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10 after 3
// warm-ups, 3 input sets; bf16 B=4 H=16 N=M=4096 unless said; TFLOP/s):
//   d=128 272.0, d=128 causal_br 251.0, d=64 262.1, d=256 219.6, f16 d=128 272.9.
//   Registers (ptxas, sm_90a, bf16): 223 (d=128) / 255, 28 B spilled (d=256).
//   4.8x basic: the bank conflicts were the whole difference.
#include "mma/single_stage_kernel.cuh"

namespace flashcheck::kernels::mma {
namespace {

void launch_swizzled(const gpu::AttentionArgs& a, const gpu::CallSite& site) { dispatch<SingleStage<true>::Kernel>(a, site); }

gpu::KernelRegistration registration("mma-swizzled", "mma.sync: basic with XOR-swizzled shared memory (f16/bf16)",
                                     kMmaCapabilities, launch_swizzled);

}  // namespace
}  // namespace flashcheck::kernels::mma
