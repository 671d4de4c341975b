// fa2_rowthread's kernel body (included by fa2_rowthread.cu and the mutants).
#pragma once

#include <cuda_runtime.h>

#include "common/attention.cuh"
#include "fp32/fa2_rowthread.cuh"

namespace flashcheck::kernels {

template <Fa2Flaw kFlaw>
__global__ void __launch_bounds__(kFa2Rows) fa2_rowthread_kernel(const gpu::AttentionArgs a) {
  __shared__ float k_tile[kFa2Keys][kFa2MaxHeadDim];
  __shared__ float v_tile[kFa2Keys][kFa2MaxHeadDim];
  const int bh = blockIdx.y, b = bh / a.heads_q, h = bh % a.heads_q, hk = h / (a.heads_q / a.heads_kv);
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int row_begin = blockIdx.x * kFa2Rows;
  if (row_begin >= lq) return;  // the whole block is past this sequence (uniform: safe before barriers)
  const int i = row_begin + threadIdx.x;
  const bool active = i < lq;
  const float* q = static_cast<const float*>(a.q) + b * a.q_batch_stride + h * a.q_head_stride;
  const float* k = static_cast<const float*>(a.k) + b * a.k_batch_stride + hk * a.k_head_stride;
  const float* v = static_cast<const float*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;
  float* o = static_cast<float*>(a.o) + b * a.o_batch_stride + h * a.o_head_stride;
  const float scale = kFlaw == Fa2Flaw::wrong_scale ? 1.25f * a.scale : a.scale;

  KeyRange range = visible_keys(a, active ? i : row_begin, lq, lk);
  if (kFlaw == Fa2Flaw::causal_off_by_one && (a.mask == kMaskCausalTopLeft || a.mask == kMaskCausalBottomRight))
    range.last = min(range.last + 1, lk - 1);
  // Keys any row of the block sees: the masks' ranges grow with the row, so the
  // block's union runs from its first row's first key to its last row's last.
  const KeyRange first_row = visible_keys(a, row_begin, lq, lk);
  const KeyRange last_row = visible_keys(a, min(row_begin + kFa2Rows, lq) - 1, lq, lk);
  const int block_first = max(first_row.first, 0);
  const int block_last = min(kFlaw == Fa2Flaw::causal_off_by_one ? last_row.last + 1 : last_row.last, lk - 1);

  float q_row[kFa2MaxHeadDim], o_row[kFa2MaxHeadDim];
  for (int c = 0; c < a.head_dim; ++c) q_row[c] = active ? q[i * a.q_seq_stride + c] : 0.0f;
  for (int c = 0; c < a.head_dim_v; ++c) o_row[c] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;
  bool saw_key = false;

  // Tiles that no row of the block sees are skipped; only boundary tiles mask.
  for (int tile = block_first / kFa2Keys * kFa2Keys; tile <= block_last; tile += kFa2Keys) {
    for (int n = threadIdx.x; n < kFa2Keys * kFa2MaxHeadDim; n += kFa2Rows) {
      const int j = tile + n / kFa2MaxHeadDim, c = n % kFa2MaxHeadDim;
      k_tile[n / kFa2MaxHeadDim][c] = j < lk && c < a.head_dim ? k[j * a.k_seq_stride + c] : 0.0f;
      v_tile[n / kFa2MaxHeadDim][c] = j < lk && c < a.head_dim_v ? v[j * a.v_seq_stride + c] : 0.0f;
    }
    __syncthreads();
    if (active) {
      float logits[kFa2Keys];
      float tile_max = -INFINITY;
      bool tile_seen = false, tile_nan = false;
      for (int n = 0; n < kFa2Keys; ++n) {
        const int j = tile + n;
        if (!sees(range, j)) continue;
        float dot = 0.0f;
        for (int c = 0; c < a.head_dim; ++c) dot += q_row[c] * k_tile[n][c];
        logits[n] = dot * scale;
        tile_seen = true;
        if (isnan(logits[n])) tile_nan = true;
        else tile_max = fmaxf(tile_max, logits[n]);
      }
      if (tile_seen) {
        float grown = tile_nan || isnan(running_max) ? quiet_nan() : fmaxf(running_max, tile_max);
        // While every logit seen is -inf, subtract 0: such keys weigh 0, not NaN.
        float subtrahend = grown == -INFINITY ? 0.0f : grown;
        if (kFlaw == Fa2Flaw::no_max_subtraction) subtrahend = 0.0f;
        const float correction = saw_key ? __expf(running_max - subtrahend) : 0.0f;
        running_sum *= correction;
        for (int c = 0; c < a.head_dim_v; ++c) o_row[c] *= correction;
        for (int n = 0; n < kFa2Keys; ++n) {
          if (!sees(range, tile + n)) continue;  // masked keys are absent, never weighted by 0
          const float weight = __expf(logits[n] - subtrahend);
          running_sum += weight;
          for (int c = 0; c < a.head_dim_v; ++c) o_row[c] += weight * v_tile[n][c];
        }
        running_max = kFlaw == Fa2Flaw::no_max_subtraction ? 0.0f : grown;
        saw_key = true;
      }
    }
    if (kFlaw != Fa2Flaw::missing_syncthreads) __syncthreads();  // the next tile overwrites k_tile/v_tile
  }
  if (!active) return;
  if (kFlaw == Fa2Flaw::tail_rows_unwritten && lq % kFa2Rows != 0 && row_begin + kFa2Rows > lq) return;
  float* out = o + i * a.o_seq_stride;
  float lse;
  if (!saw_key) {  // fully masked: O = 0, LSE = -inf
    for (int c = 0; c < a.head_dim_v; ++c) out[c] = 0.0f;
    lse = -INFINITY;
  } else if (running_max == -INFINITY) {  // every visible logit -inf: the plain formula's 0/0
    for (int c = 0; c < a.head_dim_v; ++c) out[c] = quiet_nan();
    lse = quiet_nan();
  } else {
    const float inverse = 1.0f / running_sum;
    for (int c = 0; c < a.head_dim_v; ++c) out[c] = o_row[c] * inverse;
    lse = running_max + logf(running_sum);
  }
  if (kFlaw == Fa2Flaw::write_past_last_row && i == lq - 1) out[a.o_seq_stride] = 0.0f;
  if (kFlaw == Fa2Flaw::lse_in_log2) lse *= 1.4426950408889634f;
  if (kFlaw == Fa2Flaw::modifies_input && i == 0 && lk > 0) const_cast<float*>(k)[0] = -k[0] + 1.0f;
  if (a.lse) a.lse[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] = lse;
}

template <Fa2Flaw kFlaw>
void launch_fa2_rowthread(const gpu::AttentionArgs& args, const gpu::CallSite& site) {
  const dim3 grid((args.seqlen_q + kFa2Rows - 1) / kFa2Rows, args.batch * args.heads_q);
  if (grid.x == 0 || grid.y == 0) return;
  fa2_rowthread_kernel<kFlaw><<<grid, kFa2Rows, 0, args.stream>>>(args);
  gpu::check_launch("fa2_rowthread_kernel", site);
}

}  // namespace flashcheck::kernels
