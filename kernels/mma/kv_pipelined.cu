// kv_pipelined: the flagship of the mma.sync family (article 002's v5, and a
// larger warp tile).
//
// What changed from ldmatrix_x4:
// - Only K is double-buffered. V gets one buffer, and its copy for a tile is
//   issued at the top of that tile, so it streams in while S = Q K^T runs; the
//   next K tile is issued right after S, so it streams in during softmax and
//   P V. pipelined waited for a tile's K and V pair as one stage; now each
//   product waits only for its own operand, with one V tile less in shared
//   memory.
// - Each warp owns 32 query rows (two m16 tiles; 16 at d = 256, where two
//   tiles' O would not fit in registers), so every K and V fragment read from
//   shared memory feeds two mma instead of one, and a block of 128 rows
//   shares each K/V tile copy. Why, by count: at 16 rows a warp, ldmatrix
//   reads 0.125 bytes of shared memory per multiply-add, plus the cp.async
//   writes, about 80% of the 128 B/clock of an SM at 300 TFLOP/s. Two tiles
//   halve it. Q is read from shared memory per k-step (its registers now hold
//   the second tile's O). Measured against the 16-row version of this file
//   (same day, same bench): d=128 300 -> 310, d=64 207 -> 282, d=256 194 ->
//   251, causal 279 -> 268 (fewer, longer blocks). At d=128 the gain was
//   small: shared memory was not the binding limit there (docs/perf.md).
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10 after 3
// warm-ups, 3 input sets; bf16 B=4 H=16 N=M=4096 unless said; TFLOP/s):
//   d=128 309.7, d=128 causal_br 267.7, d=64 282.3, d=256 251.5, f16 d=128 310.0.
//   Registers (ptxas, sm_90a, bf16): 255, 124 B spilled (d=128) / 254, 40 B spilled (d=256).
//   cuDNN in the same run: 669.5 / 569.9 / 510.5 / 729.6 / 651.8, so 46% / 47% /
// 55% / 34% / 48% of cuDNN. The issue's targets (350 / 300 / 290 / 300) are
// not met; docs/perf.md has the measured gap and the reasons (ncu: 255
// registers, 2 blocks = 8 warps per SM, 37% of issue slots busy).
#include "mma/kv_pipelined_kernel.cuh"

namespace flashcheck::kernels::mma {
namespace {

gpu::KernelRegistration registration("mma-kv-pipelined",
                                     "mma.sync flagship: 32 query rows a warp, double-buffered K, V prefetched during Q K^T (f16/bf16)",
                                     kMmaCapabilities, launch_kv_pipelined<MmaFlaw::none>);

}  // namespace
}  // namespace flashcheck::kernels::mma
