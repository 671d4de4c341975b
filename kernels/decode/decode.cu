// decode: attention for a few queries (seqlen_q <= 16) against a long key
// sequence, where the cost is reading K and V once.
//
// Lineage: article 004 (a decode kernel with GQA: a block per (batch, head,
// query position), Q in shared memory, 64-key score tiles, shared-memory
// reductions). What changes from the article: a block per (batch, K/V head,
// 4 query rows) instead of per query head, so every query head of a GQA group
// and every query position shares each K/V load (the article reads K/V once
// per query head: 4x the bytes at GQA 4); keys are read with 16-byte loads,
// 8 loads in flight per lane before any is used, by 12 warps that take 8-key
// steps round robin (kernels/decode/decode_block.cuh); logits are warp-level
// dot products (a butterfly over the lanes of one key row); each warp keeps an
// online softmax in registers and the warps merge once, in shared memory, in a
// fixed order (deterministic, no atomics). No tensor cores: at seqlen_q = 1 a
// K/V byte feeds 4 multiply-adds per query row, far below what memory delivers.
// Why 12 warps, one block per SM: at the target (B=16, Hkv=8) there are 128
// blocks for 132 SMs, and each SM needs about 4.3 TB/s / 132 x ~700 ns = 23 KB
// of loads in flight. The 4 rows' queries and outputs (64 f32 registers) and
// 8 loads (32 registers) need ~160 registers a thread; 12 warps of 168 fill
// the register file, and 12 x 32 lanes x 8 x 16 bytes = 48 KB is issued per
// step, so the SM stays covered while a third of its warps compute. (16 warps
// at 128 registers spill.) With few (batch, K/V head) pairs the grid is
// small: that is what splitkv is for.
// Domain: f16 and bf16 storage, f32 logits, softmax and accumulation; d = dv in
// {64, 128, 256}; seqlen_q <= 16, any seqlen_kv (tails predicated; 0 gives
// O = 0 and LSE = -inf); none/causal_tl/causal_br/window masks; GQA/MQA (any
// group size: groups of more than 4 rows take several blocks); padded batches;
// LSE; BHSD and BSHD; Inf/NaN inputs (masked keys are absent, never 0-weighted);
// a paged K/V cache (pages of 16 keys or more, any table): each 16-byte load
// reads its key's pool page from the table, a step ahead; the page and slot of
// a step's first key are carried from step to step, without a division
// (kernels/decode/decode_block.cuh).
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10, 3
// input sets): bf16 B=16 Hq=32 Hkv=8 Sq=1 Skv=32768 d=128: 0.714 ms, 3009 GB/s,
// 71.5% of the 4211 GB/s device-to-device copy measured in the same run (the
// target was 70%); cuDNN 0.486 ms, 4416 GB/s. An earlier run that day (same
// bench, sm_90a build): B=4 Hq=32 Hkv=8 Sq=4 Skv=8192 causal_br 0.181 ms,
// cuDNN 0.114 ms.
// Paged K/V (issue 25; H100, 2026-11-26, `flashcheck bench`, the contiguous
// decode in the same call): B=16 Sq=1 Skv=32768 page=16/64/256 0.780-0.781 ms
// against 0.760 contiguous (2.6-2.8% slower; 2825 GB/s contiguous, 93% of the
// read ceiling); B=4 Sq=4 causal_br page=16 0.195 against 0.181 ms (7.7%).
// Paged v3 (2026-11-27, H100, the same bench: no division per load or step):
// B=16 page=16 0.787 against 0.764 ms (3.0%); B=4 Sq=4 causal_br page=16 0.190,
// page=64 0.189 against 0.184 (2.7-3.3%); B=1 Hq=32 Hkv=8 Skv=32768 page=16
// 0.726 against 0.699 (3.9%). splitkv in the same call: 2.5-3.9% (was up to 13%).
// The table is read a step ahead (docs/perf.md: reading it before each load
// was 13% slower).
#include "decode/decode_kernel.cuh"

namespace flashcheck::kernels {
namespace {

gpu::KernelRegistration registration("decode",
                                     "decode: a block per (batch, K/V head, 4 query rows), 12 warps streaming K/V "
                                     "with 16-byte loads (f16/bf16; contiguous or paged K/V)",
                                     kDecodeCapabilities, launch_decode<KeyReading::paged>);

}  // namespace
}  // namespace flashcheck::kernels
