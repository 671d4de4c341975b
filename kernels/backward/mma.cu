// fa2-mma-bwd and fa2-mma-bwd-det: FlashAttention-2's backward (Algorithm 2)
// on tensor cores, mma.sync m16n8k16 with f32 accumulation, in two shapes that
// share their kernels (backward/mma_kernel.cuh).
//
// Lineage: fa2-rowthread-bwd (backward/rowthread.cu), the same three steps a
// thread per row in f32; the forward mma family (kernels/mma/) for the PTX
// (mma/ptx.cuh), the swizzled shared tiles and their cp.async copies
// (mma/tiles.cuh), and the P V product read from C fragments (mma/products.cuh,
// common/softmax.cuh).
// Version 1 (commit dfa4f1c, 2026-11-26): what changed from
// fa2-rowthread-bwd: the products run on tensor cores. A warp owns 16 keys
// (dK/dV) or 16 query rows (dQ) as the M rows of m16 tiles; the operands come
// from swizzled shared tiles through ldmatrix, and P^T and dS^T, computed in
// f32 in the C fragments, are rounded to the dtype once, as the A operands of
// dV += P^T dO and dK += dS^T Q (and dS of dQ += dS K), as FlashAttention-2
// does. Single-buffered, blocks of 4 warps, d = 64 and 128.
// Version 2 (commit 6e5a623), what changed from version 1 and why
// (docs/perf.md, "The mma.sync backward, versions 2 to 4"):
//   - the loads are pipelined: the next step's Q, dO and row information (or
//     the next key tile's K and V) load into a second buffer while this one
//     computes (version 1 waited for every step's copies);
//   - the dK/dV block is 8 warps, 128 keys (was 4 warps, 64 keys): each Q and
//     dO tile read from L2 serves twice the keys;
//   - d = 256: two warps share 16 keys, each owning 128 columns of their dK
//     and dV (256 registers a thread otherwise), and add their halves of S^T
//     and dP^T (products over D) through shared memory;
//   - D_i and the atomic subject's dQ conversion are kernels of their own, 16
//     bytes a thread (version 1 borrowed rowthread's, a thread per row);
//   - P from exp2 with log2(e) folded into the scale and the LSE (ex2.approx).
// Version 3 (commit 224ac10), what changed from version 2 and why (ncu: the
// barrier and fixed-latency stalls led, and the atomic subject's dQ share
// cost as much as the det subject's whole dQ kernel):
//   - one barrier a step: the next step's copies are issued past it, into the
//     buffer every warp has finished with (version 2: two barriers a step);
//   - the atomic dQ share of a step runs one step late, from a second dS^T
//     buffer, so no barrier waits between dS^T's writes and its reads; dS^T
//     is swizzled at 32-query rows too (4-way bank conflicts before);
//   - S^T and dP^T's mma run over every n-tile before the second k-step, so
//     no mma waits on the one just issued to the same accumulator.
// Version 4 (commit 99311a0), what changed from version 3 and why:
//   - the atomic dQ share adds each pair of adjacent columns with one
//     red.global.add.v2.f32 (sm_90 and newer; two scalar atomics before):
//     half the reductions (fa2-mma-bwd 17% faster at d = 128);
//   - a step's row information (log2(e) LSE, D_i, first and last key) is one
//     float4 a row, one 16-byte shared load a column (no measured change).
// Version 5 (commit f71dce0), what changed from version 4 and why: fa2-mma-bwd-det's
// dQ block at d = 256 is 8 warps, 128 query rows (was 4 warps, 64 rows): a
// 4-warp block's tiles took 128 KiB, one block and so 4 warps an SM; 8 warps
// take 192 KiB, one block of 8 warps. H100, same call: d=256 det 10.23 ->
// 8.95 ms (1.24x -> 1.08x the atomic), causal_br 5.93 -> 5.34 ms (1.15x ->
// 1.03x). At d = 64 and 128, 8 warps changed nothing (7.83 -> 7.90 ms at
// d = 128): the registers already held two 4-warp blocks an SM; kept at 4.
// At d = 64 the dQ block asks for three blocks an SM (168 registers, 4 bytes
// spilled): 4.17 -> 3.91 ms in a build beside version 4's, but 4.14 ms in the
// tree below (one call each, not explained yet). P keeps its subnormals
// (ex2.approx without .ftz; version 6 keeps them cheaper): a 10-minute GPU
// sweep found dK and dV of keys whose every P lies below 2^-126 flushed to 0
// (one dominant key, logit gaps near 87; dK 34 times the floor); 0-3% slower.
// Final tree (H100, 2026-11-28, one call, det / atomic ms): d=128 7.98 /
// 6.67, causal 5.49 / 5.47; d=64 4.14 / 3.51, causal 2.86 / 2.76; d=256
// 9.06 / 8.49, causal 5.34 / 5.26.
// Version 6 (commit f4d74e0), what changed from version 5 and why: P keeps its
// subnormals at one FMUL more than the flushing exp2, not about six
// (exp2_shifted_keeping_subnormals: 24 folded into the row's log2(e) LSE, the
// exact 2^-24 multiply after ex2.approx.ftz). Predicted det d = 64 3.9-4.0 ms
// on H100 and atomic 0-3% faster; measured on an H200 (2026-11-28, two runs
// of each tree in one call, det / atomic ms): d=128 8.13 -> 7.89 / 6.67 ->
// 6.62, d=64 4.22 -> 4.03 / 3.54 -> 3.52 (det 1.145x the atomic), d=256
// 9.25 -> 9.03 / 8.52 -> 8.33; causal 0-3% faster (docs/perf.md).
// Version 7 (commit 9479c58), what changed from version 6 and why: the dK/dV
// kernel's S^T and dP^T products unroll their 2 to 4 k-steps of 32 columns
// (product_abt's kUnroll), so ptxas issues the next step's ldmatrix under
// this step's mma; versions 1-5 spilled unrolled, version 6's registers fit
// (244-252, no spill). Predicted 0-5% on the dK/dV kernel; measured on an
// H200 (2026-11-28, one call, v6 -> v7, atomic / det ms): d=128 6.65 -> 6.30
// / 7.85 -> 7.39, d=64 3.52 -> 3.41 / 4.04 -> 3.94, d=256 8.39 -> 8.26 /
// 9.01 -> 9.03; causal d <= 128 3-5% faster, d = 256 unchanged. The dQ
// kernel's loop unrolled twice measured no change (docs/perf.md).
// Version 8 (commit 6bbe50d), what changed from version 7 and why: the blocks run
// longest first over every (batch, head) pair, not within one. Both kernels'
// grids were (tiles, pairs): the hardware issues x first, so it issued pair
// 0's 32 key blocks, then pair 1's, and under a causal mask the heavy first
// key blocks of the last pairs started late. A list-scheduling count over 132
// SMs, one dK/dV block an SM: 1.66 times the causal work's even share at 32
// key blocks and 8 pairs, 1.00 tile-major (tile_major_blocks: block i owns
// tile i / pairs of pair i % pairs; the dQ kernel's tiles from the last).
// Predicted causal d = 128 5.18 -> 3.2-3.5 ms, d = 64 2.69 -> 1.7-1.9,
// unmasked unchanged; measured on an H200 (2026-11-28, one call, two runs
// of each tree, atomic / det ms): causal_br d=128 5.10 -> 3.41 / 5.12 ->
// 3.87, d=64 2.67 -> 1.78 / 2.67 -> 1.99, d=256 5.16 -> 4.34 / 5.45 -> 4.66;
// unmasked within 1% (d=128 6.35 / 7.47, d=64 3.40 / 3.88, d=256 8.37 /
// 9.07). hopper-bwd was tile-major already.
// Version 9 (this one), what changed from version 8 and why: fa2-mma-bwd-det's
// dQ kernel runs on a second stream beside the dK/dV kernel (it needs D_i,
// not dK or dV), launched second: its blocks take the SMs that the dK/dV
// kernel's last wave leaves idle (256 blocks, one an SM, on 132 SMs at
// d = 128), and the two no longer wait for each other's tails. ncu (v8,
// d = 128 unmasked, clocks locked): dK/dV 5.91 ms, dQ 3.77 ms, each at 12.5%
// occupancy, 4.9 cycles a warp between issues. Predicted det d = 128
// 7.47 -> ~7.30 ms; measured on an H200 (2026-11-28, one call, two runs of
// each tree, det ms): d=128 7.506, 7.470 -> 7.338, 7.352 (1.155x the
// atomic's 6.361), d=64 3.875, 3.890 -> 3.773, 3.813, d=256 9.114, 9.114 ->
// 9.076, 9.099; causal_br d=128 3.897 -> 3.810, d=64 2.00 -> 1.96, d=256
// 4.65 -> 4.59. The atomic subject is unchanged (one stream).
// What it does, on the caller's stream (fa2-mma-bwd-det's dQ kernel on a
// second one, forked after step 1 and joined after step 3):
//   1. D_i = rowsum(dO_i o O_i) in f32, D / 8 threads a row.
//   2. dK, dV: a block per 128 keys (64 at d = 256) of one (batch, K/V head),
//      K and V in shared memory once; it walks the query rows 64 at a time
//      (32 at d >= 128, where 64 put the accumulators past 255 registers)
//      over every query head of the GQA group (the group's sum), recomputing
//      S^T, P^T, dP^T, dS^T per step from the handed LSE. fa2-mma-bwd also
//      adds dQ's share dS K of each step to an f32 accumulator with atomicAdd
//      (dS^T through shared memory), FlashAttention-2's classic shape.
//   3. dQ: fa2-mma-bwd converts the accumulator (scale x, in the dtype).
//      fa2-mma-bwd-det computes it in a kernel of its own: a block of 4 warps
//      per 64 query rows (8 warps, 128 rows at d = 256), walking the keys its
//      rows see in order, 64 at a time (32 at d = 256; S, P, dP, dS
//      recomputed; dQ += dS K), beside step 2.
// Determinism: fa2-mma-bwd's dQ sums arrive in whatever order the blocks'
// atomics do (backward_deterministic = false); everything in fa2-mma-bwd-det
// is summed by one warp in a fixed order and written by one block
// (backward_deterministic = true); the halves of S^T and dP^T at d = 256 are
// added in one order (x + y == y + x).
// Domain (flashcheck/kernels/backward/mma.hpp): f16/bf16; d = dv in
// {64, 128, 256}; any lengths; none/causal_tl/causal_br/window; GQA/MQA;
// padded batches; LSE; BHSD and BSHD; finite inputs only; both passes (the
// forward is fa2-rowthread-bwd's).
// Registers (ptxas, sm_90a, CUDA 13.0, version 8; f16 and bf16 alike):
//   dK/dV 248 (d=64) / 244 (d=128) / 251 (d=256); with the atomic dQ
//   250 / 245 / 253; dQ (deterministic) 168 / 224 / 253; no spill. Dynamic
//   shared memory a block: dK/dV 66 / 97 / 161 KiB, with the atomic dQ (two
//   dS^T buffers) 98 / 113 / 169 KiB; dQ 48 / 96 / 192 KiB.
// Speed (version 8's call: H200, 2026-11-28, flashcheck bench --warmup 2
// --repeats 7, median ms, torch 2.11's FlashAttention-2 backward in the same
// call, external/torch_backward_bench.py; docs/perf.md, "Longest first";
// fa2-mma-bwd-det 1-3% faster since, the Version 9 entry above):
//   b=1 hq=64 hkv=8 sq=skv=4096 bf16, fa2-mma-bwd / fa2-mma-bwd-det / FA2:
//   d=128 6.36 / 7.47 / 5.08, causal_br 3.41 / 3.87 / 3.05; d=64 3.40 /
//   3.88 / 2.73, causal_br 1.78 / 1.99 / 1.68; d=256 (hq=32) 8.37 / 9.07 /
//   5.91, causal_br 4.34 / 4.65 / 3.46. At 16384 (--warmup 1 --repeats 5,
//   FA2 the median of 5): d=128 100.3 / 117.1 / 71.4, causal_br 51.3 /
//   58.6 / 36.0; d=64 53.7 / 60.9 / 38.4.
#include "backward/mma_kernel.cuh"

namespace flashcheck::kernels {

void launch_mma_backward_atomic(const BackwardArgs& args, const gpu::CallSite& site) {
  launch_mma_backward</*kAtomicDq=*/true>(args, site);
}

namespace {

struct Registrations {
  Registrations() {
    Registry::instance().add([] {
      return std::make_unique<BackwardKernelSubject>(
          kMmaBackwardName,
          "FlashAttention-2's backward on mma.sync, dQ added with atomics from the key blocks (f16/bf16)",
          kMmaBackwardCapabilities, launch_rowthread_forward, launch_mma_backward_atomic,
          /*dq_accumulator=*/true);
    });
    Registry::instance().add([] {
      return std::make_unique<BackwardKernelSubject>(
          kMmaBackwardDeterministicName,
          "FlashAttention-2's backward on mma.sync, dQ in its own pass, deterministic (f16/bf16)",
          kMmaBackwardDeterministicCapabilities, launch_rowthread_forward, launch_mma_backward</*kAtomicDq=*/false>,
          /*dq_accumulator=*/false);
    });
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels
