// The decode kernel and its launcher (kernels/decode/decode.cu says what it
// does), shared with decode's mutants (kernels/mutants/decode_mutants.cu),
// which read a paged pool with a deliberate flaw.
#pragma once

#include "decode/decode.cuh"
#include "decode/decode_block.cuh"

namespace flashcheck::kernels {

// One block per (chunk of 4 query rows, batch x K/V head).
template <typename Element, int kHeadDim, KeyReading kReading>
__global__ void __launch_bounds__(kDecodeWarps * 32, 1) decode_kernel(const gpu::AttentionArgs a) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto& shared = *reinterpret_cast<DecodeShared<kHeadDim, kDecodeWarps>*>(shared_bytes);
  const int b = blockIdx.y / a.heads_kv, hk = blockIdx.y % a.heads_kv;
  const int lq = query_length(a, b), lk = key_length(a, b);
  if (blockIdx.x * kDecodeRows >= lq * (a.heads_q / a.heads_kv)) return;  // only padding rows (block-uniform)
  const DecodeRows rows = decode_rows(a, hk, blockIdx.x, lq, lk, 0, lk - 1);
  decode_pass<Element, kHeadDim, kDecodeWarps, kReading>(a, b, hk, rows, shared);

  // A thread per (row, 8 columns) writes O; the first of each row writes LSE.
  constexpr int kChunks = kHeadDim / 8;
  static_assert(kDecodeRows * kChunks <= kDecodeWarps * 32, "one pass of the block covers the output");
  const int r = threadIdx.x / kChunks, column = threadIdx.x % kChunks * 8;
  if (r >= kDecodeRows) return;
  const DecodeRow row = decode_row(a, hk, blockIdx.x, r, lq, lk, 0, lk - 1);
  if (!row.active) return;
  const DecodeMerged merged = decode_merge<kHeadDim, kDecodeWarps>(shared, r, column);
  float out[8];
  float lse;
  if (merged.max == -INFINITY) {
    // No visible key: O = 0, LSE = -inf. Every visible logit -inf: the plain formula's 0/0.
    const bool saw_keys = row.keys.first <= row.keys.last;
    for (float& x : out) x = saw_keys ? quiet_nan() : 0.0f;
    lse = saw_keys ? quiet_nan() : -INFINITY;
  } else {
    const float inverse = 1.0f / merged.sum;
    for (int c = 0; c < 8; ++c) out[c] = merged.o[c] * inverse;
    lse = merged.max + logf(merged.sum);
  }
  const int h = row.head, i = row.position;
  *reinterpret_cast<uint4*>(static_cast<Element*>(a.o) + b * a.o_batch_stride + h * a.o_head_stride +
                            i * a.o_seq_stride + column) = pack8<Element>(out);
  if (a.lse && column == 0) a.lse[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] = lse;
}

template <typename Element, int kHeadDim, KeyReading kReading>
void launch_decode_for(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  const int group_rows = a.heads_q / a.heads_kv * a.seqlen_q;
  const dim3 grid((group_rows + kDecodeRows - 1) / kDecodeRows, a.batch * a.heads_kv);
  if (grid.x == 0 || grid.y == 0) return;
  constexpr int kSharedBytes = sizeof(DecodeShared<kHeadDim, kDecodeWarps>);
  // Above 48 KB, dynamic shared memory needs an opt-in (once per instantiation).
  static const cudaError_t opted_in = cudaFuncSetAttribute(
      decode_kernel<Element, kHeadDim, kReading>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  gpu::check(opted_in, "cudaFuncSetAttribute (decode_kernel)", site);
  decode_kernel<Element, kHeadDim, kReading><<<grid, kDecodeWarps * 32, kSharedBytes, a.stream>>>(a);
  gpu::check_launch("decode_kernel", site);
}

/// decode's launcher: contiguous K/V as they are, paged K/V read as kPaged says.
template <KeyReading kPaged>
void launch_decode(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  dispatch_decode(a, [&]<typename Element, int kHeadDim>() {
    if (a.page_table) launch_decode_for<Element, kHeadDim, kPaged>(a, site);
    else launch_decode_for<Element, kHeadDim, KeyReading::contiguous>(a, site);
  });
}

}  // namespace flashcheck::kernels
