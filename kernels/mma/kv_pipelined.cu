// kv_pipelined: the flagship of the mma.sync family.
//
// What changed from ldmatrix_x4: only K is double-buffered. V gets one buffer,
// and its copy for a tile is issued at the top of that tile, so it streams in
// while S = Q K^T runs; the next K tile is issued right after S, so it streams
// in during softmax and P V. Why: pipelined keeps two K and two V tiles, and
// waits for both halves of a tile's K/V at once; splitting the groups lets each
// product wait only for its own operand, and the freed shared memory (one V
// tile) buys a block of occupancy.
// Speed (H200): see docs/perf.md (filled in from scripts/gpu-check).
#include "kernels/mma/kv_pipelined_kernel.cuh"

namespace flashcheck::kernels::mma {
namespace {

gpu::KernelRegistration registration("mma-kv-pipelined",
                                     "mma.sync flagship: double-buffered K, V prefetched during Q K^T (f16/bf16)",
                                     kMmaCapabilities, launch_kv_pipelined<MmaFlaw::none>);

}  // namespace
}  // namespace flashcheck::kernels::mma
