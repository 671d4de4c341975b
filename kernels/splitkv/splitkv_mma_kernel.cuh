// splitkv's tensor-core split block (v4): a block per (batch, K/V head, chunk
// of 16 rows, split), the rows being the GQA group's heads at every query
// position (decode's order), one m16 tile of mma.sync.m16n8k16, so that a
// group of up to 16 rows reads its slice of K and V once. Included by
// splitkv_kernel.cuh, whose launcher picks it where it fits (splitkv_mma_fits:
// d <= 128) and whose combine merges its slots.
//
// Rows: row rho = 16 c + r of chunk c is query position rho / group of head
// hk * group + rho % group; rows past group * seqlen_q, and padding
// positions, compute on zero queries and are never written.
// Keys: the block loads the union of its rows' visible keys within the split
// (others are absent: never loaded, K and V zero, logit -inf). A warp step
// inside every active row's range (their intersection) runs on the tensor
// cores alone; a ragged step (at a causal diagonal or a window's edge, where
// rows see different keys) masks each (row, key) pair and adds P V on the
// CUDA cores, only where the row sees the key: a masked key's Inf or NaN in V
// must not meet a zero weight, as it would inside the mma.
// Loads: straight from global memory into registers, 16 bytes a lane, no
// shared memory. Lane (g, t) of a warp (g = lane / 4, t = lane % 4) loads
// keys g and 8 + g of the warp's 16-key step, columns [32 s + 8 t, +8) for
// each s < d / 32, the same columns of Q for rows g and g + 8. A dot product
// does not care in which order its columns are summed, so each 16-byte load
// is read as the two k16 steps' fragments: Q's words as the A operand's
// columns (2t, 2t+1, 2t+8, 2t+9) and K's as B's rows, in the same order.
// P V: S's accumulator is P's A fragment (FlashAttention-2's register reuse);
// V's B fragment needs two keys of one column in a register, so each 8 x 8
// block of V (8 keys, a lane's word of 2 columns) is transposed in registers
// by movmatrix. O's fragment then holds, for lane (g, t), rows g and g + 8 at
// columns [32 s + 8 t, +8): contiguous, as the loads were.
// Softmax: online per warp in f32 (exponentials on __expf of the scaled
// logit, as decode's); P rounded to the element type for the tensor cores.
// Merge: the four warps' (max, sum, O) meet in shared memory and are combined
// in warp order (deterministic); the block writes its rows' slots as
// splitkv_kernel does (O_s = o / l in f32, L_s = m + log l).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention.cuh"
#include "common/ptx.cuh"
#include "decode/decode_block.cuh"
#include "mma/ptx.cuh"
#include "splitkv/splitkv.cuh"

namespace flashcheck::kernels {

inline constexpr int kSplitKvMmaWarps = 4;
inline constexpr int kSplitKvMmaRows = 16;      // one m16 tile
inline constexpr int kSplitKvMmaStepKeys = 16;  // keys per warp step (one k16 of P V)

/// Whether the tensor-core block takes these args: d <= 128 (O, Q and a
/// step's K and V in registers; d = 256 stays on decode's CUDA-core block).
inline bool splitkv_mma_fits(const gpu::AttentionArgs& a) { return a.head_dim <= 128; }

/// 8 x 8 b16 transpose across the warp: lane (g, t) gives row g's columns
/// (2t, 2t+1) and gets row 2t's and row 2t+1's column g.
__device__ __forceinline__ std::uint32_t transpose_8x8(std::uint32_t x) {
  std::uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

template <int kHeadDim>
struct SplitKvMmaShared {
  uint4 q[kSplitKvMmaRows][kHeadDim / 8 + 1];  // 16-byte columns, one of padding a row
  float o[kSplitKvMmaWarps][kSplitKvMmaRows][kHeadDim];
  float max[kSplitKvMmaWarps][kSplitKvMmaRows];
  float sum[kSplitKvMmaWarps][kSplitKvMmaRows];
};

__device__ __forceinline__ std::uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Blocks: x = (batch x K/V head) x chunk of 16 rows, chunks fastest; y = the split.
template <typename Element, int kHeadDim, SplitKvFlaw kFlaw, KeyReading kReading>
__global__ void __launch_bounds__(kSplitKvMmaWarps * 32, 2)
    splitkv_mma_kernel(const gpu::AttentionArgs a, const SplitKvPartials partials, int chunks) {
  constexpr int kSpans = kHeadDim / 32;  // 16-byte loads a lane per key row
  __shared__ SplitKvMmaShared<kHeadDim> shared;
  let_combine_launch();
  const int chunk = blockIdx.x % chunks, pair = blockIdx.x / chunks;
  const int b = pair / a.heads_kv, hk = pair % a.heads_kv, split = blockIdx.y, splits = gridDim.y;
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int group = a.heads_q / a.heads_kv, rho0 = chunk * kSplitKvMmaRows;
  const int rows_active = group * lq;  // rows [0, rows_active) are queries of this sequence
  if (rho0 >= rows_active) return;     // only padding rows: no slot is read
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  const auto row_head = [&](int rho) { return hk * group + rho % group; };
  const auto row_active = [&](int rho) { return rho < rows_active; };
  // Writes columns [column, column + 4) of row rho's slot, and its LSE from the column-0 thread.
  const auto store_slot = [&](int rho, int column, float4 o, float lse) {
    const std::int64_t slot = split * partials.rows +
                              (static_cast<std::int64_t>(b) * a.heads_q + row_head(rho)) * a.seqlen_q + rho / group;
    *reinterpret_cast<float4*>(partials.o + slot * kHeadDim + column) = o;
    if (column == 0) partials.lse[slot] = lse;
  };
  // Position i's keys within this split (empty when first > last).
  const int per_split = (lk + splits - 1) / splits;
  const int slice_first = split * per_split, slice_last = min(lk, slice_first + per_split) - 1;
  const auto position_keys = [&](int i) {
    KeyRange keys = visible_keys(a, i, lq, lk);
    keys.first = max(keys.first, slice_first);
    keys.last = min(keys.last, slice_last);
    return keys;
  };
  // A row's first and last visible key never decrease with its position
  // (visible_keys), so the block's rows span [first of the lowest position,
  // last of the highest] (loaded: a superset of their union where a middle
  // row sees nothing, which only masks more) and all see [first of the
  // highest, last of the lowest] (no mask). Two ranges, not sixteen.
  const KeyRange lowest = position_keys(rho0 / group),
                 highest = position_keys((min(rho0 + kSplitKvMmaRows, rows_active) - 1) / group);
  const int first = lowest.first, last = highest.last, inner_first = highest.first, inner_last = lowest.last;
  const auto row_keys = [&](int rho) { return row_active(rho) ? position_keys(rho / group) : KeyRange{0, -1}; };
  const KeyRange lane_keys[2] = {row_keys(rho0 + g), row_keys(rho0 + g + 8)};

  if (first > last) {  // no key of this split (block-uniform): the slots must say so (the mutant's do not)
    if constexpr (kFlaw != SplitKvFlaw::empty_split_unwritten) {
      for (int item = threadIdx.x; item < kSplitKvMmaRows * (kHeadDim / 4); item += blockDim.x) {
        const int rho = rho0 + item / (kHeadDim / 4), column = item % (kHeadDim / 4) * 4;
        if (!row_active(rho)) continue;
        store_slot(rho, column, make_float4(0, 0, 0, 0), -INFINITY);
      }
    }
    return;
  }

  // Q in shared memory (its registers hold the next step's K and V instead):
  // the tile's 16 rows, zero for inactive ones, rows padded by 16 bytes so that
  // a warp's fragment reads (rows g, 16-byte columns 4 s + t) hit distinct banks.
  for (int item = threadIdx.x; item < kSplitKvMmaRows * kSpans * 4; item += blockDim.x) {
    const int r = item / (kSpans * 4), column = item % (kSpans * 4), rho = rho0 + r;
    uint4 value{0, 0, 0, 0};
    if (row_active(rho))
      value = __ldg(reinterpret_cast<const uint4*>(static_cast<const Element*>(a.q) + b * a.q_batch_stride +
                                                   row_head(rho) * a.q_head_stride +
                                                   static_cast<std::int64_t>(rho / group) * a.q_seq_stride) +
                    column);
    shared.q[r][column] = value;
  }
  __syncthreads();

  float o[kSpans][4][4];  // [s][j]: columns 32 s + 8 t + 2 j + (0, 1) of rows g (0, 1) and g + 8 (2, 3)
#pragma unroll
  for (int s = 0; s < kSpans; ++s)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[s][j][e] = 0.0f;
  float running_max[2] = {-INFINITY, -INFINITY}, running_sum[2] = {0.0f, 0.0f};

  const Element* k_base = static_cast<const Element*>(a.k) + hk * a.k_head_stride + 8 * t;
  const Element* v_base = static_cast<const Element*>(a.v) + hk * a.v_head_stride + 8 * t;
  constexpr int kStride = kSplitKvMmaWarps * kSplitKvMmaStepKeys;
  const int first_step = first + warp * kSplitKvMmaStepKeys;
  PageWalk<kReading> walk(a, first_step, kStride);  // paged: a step's 16 keys within two pages
  // Issues the loads of step `step` (keys step + g and step + 8 + g, zero past
  // the range); called once a step, in order (the paged state moves on).
  const auto load_step = [&](int step, uint4 (&k_raw)[2][kSpans], uint4 (&v_raw)[2][kSpans]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int offset = g + 8 * half, j = step + offset;
      KeyPlace place{b, j};
      if constexpr (kReading != KeyReading::contiguous) place = j <= last ? walk.place(a, b, offset) : KeyPlace{0, 0};
      const Element* k_row =
          k_base + place.page * a.k_batch_stride + static_cast<std::int64_t>(place.slot) * a.k_seq_stride;
      const Element* v_row =
          v_base + place.page * a.v_batch_stride + static_cast<std::int64_t>(place.slot) * a.v_seq_stride;
#pragma unroll
      for (int s = 0; s < kSpans; ++s) {
        k_raw[half][s] = v_raw[half][s] = uint4{0, 0, 0, 0};
        if (j <= last) {
          k_raw[half][s] = __ldg(reinterpret_cast<const uint4*>(k_row + 32 * s));
          v_raw[half][s] = __ldg(reinterpret_cast<const uint4*>(v_row + 32 * s));
        }
      }
    }
    if constexpr (kReading != KeyReading::contiguous) walk.advance(a);
  };

  // Each step's loads are issued a step ahead, so that they fly while the
  // step before computes.
  uint4 k_raw[2][kSpans], v_raw[2][kSpans];
  load_step(first_step, k_raw, v_raw);
  for (int step = first_step; step <= last; step += kStride) {
    uint4 k_next[2][kSpans], v_next[2][kSpans];
    load_step(step + kStride, k_next, v_next);

    // S = Q K^T for keys step + [0, 8) and step + [8, 16).
    float logit[2][4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int e = 0; e < 4; ++e) logit[half][e] = 0.0f;
#pragma unroll
      for (int s = 0; s < kSpans; ++s) {
        const uint4 q_low = shared.q[g][4 * s + t], q_high = shared.q[g + 8][4 * s + t];
        const std::uint32_t a_low[4] = {q_low.x, q_high.x, q_low.y, q_high.y};
        const std::uint32_t a_high[4] = {q_low.z, q_high.z, q_low.w, q_high.w};
        mma::mma_16816<Element>(logit[half], a_low, k_raw[half][s].x, k_raw[half][s].y);
        mma::mma_16816<Element>(logit[half], a_high, k_raw[half][s].z, k_raw[half][s].w);
      }
    }
    // Scale and mask: a key outside the loaded range is absent (its logit
    // -inf), and in a ragged step each row's own range decides.
    const bool ragged = step < inner_first || min(step + kSplitKvMmaStepKeys - 1, last) > inner_last;
    // Each of this lane's two rows sees keys [low, high] of the step (selects, not branches).
    const int low[2] = {ragged ? lane_keys[0].first : step, ragged ? lane_keys[1].first : step};
    const int high[2] = {ragged ? lane_keys[0].last : last, ragged ? lane_keys[1].last : last};
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = step + 8 * half + 2 * t + (e & 1);
        const float scaled = logit[half][e] * a.scale;
        logit[half][e] = j >= low[e / 2] && j <= high[e / 2] ? scaled : -INFINITY;
      }

    // Online softmax, rows g (e = 0, 1) and g + 8 (e = 2, 3); a row's four lanes agree.
    float correction[2];
    bool grew = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // fmaxf skips NaN logits; their weights below are NaN and poison the row.
      float step_max = fmaxf(fmaxf(logit[0][2 * r], logit[0][2 * r + 1]), fmaxf(logit[1][2 * r], logit[1][2 * r + 1]));
      step_max = fmaxf(step_max, __shfl_xor_sync(kFullWarp, step_max, 1));
      step_max = fmaxf(step_max, __shfl_xor_sync(kFullWarp, step_max, 2));
      const float grown = fmaxf(running_max[r], step_max);
      // While every logit seen is -inf, subtract 0: such keys weigh 0, not NaN.
      const float subtrahend = grown == -INFINITY ? 0.0f : grown;
      correction[r] = __expf(running_max[r] - subtrahend);
      grew = grew || grown != running_max[r];
      running_max[r] = grown;
      running_sum[r] *= correction[r];
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          logit[half][e] = __expf(logit[half][e] - subtrahend);  // now the weight
          running_sum[r] += logit[half][e];
        }
    }
    if (__any_sync(kFullWarp, grew)) {  // an unchanged maximum rescales by exactly 1
#pragma unroll
      for (int s = 0; s < kSpans; ++s)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          o[s][j][0] *= correction[0];
          o[s][j][1] *= correction[0];
          o[s][j][2] *= correction[1];
          o[s][j][3] *= correction[1];
        }
    }

    if (!ragged) {
      // O += P V: P's A fragment from the weights, V's B fragments transposed in registers.
      const std::uint32_t p[4] = {pack<Element>(logit[0][0], logit[0][1]), pack<Element>(logit[0][2], logit[0][3]),
                                  pack<Element>(logit[1][0], logit[1][1]), pack<Element>(logit[1][2], logit[1][3])};
#pragma unroll
      for (int s = 0; s < kSpans; ++s)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          mma::mma_16816<Element>(o[s][j], p, transpose_8x8(word(v_raw[0][s], j)), transpose_8x8(word(v_raw[1][s], j)));
    } else {
      // A ragged step: key by key on the CUDA cores, each row only where it
      // sees the key. Key n of half h is S column n of the quad's lane n / 2
      // and V row of lane 4 n + t (this lane's columns).
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll 1
        for (int n = 0; n < 8; ++n) {  // rolled: a rare path, kept out of the fast path's registers
          const int j = step + 8 * half + n, from_s = (lane & ~3) | (n >> 1), from_v = 4 * n + t;
          const float weight[2] = {__shfl_sync(kFullWarp, (n & 1) ? logit[half][1] : logit[half][0], from_s),
                                   __shfl_sync(kFullWarp, (n & 1) ? logit[half][3] : logit[half][2], from_s)};
          const bool seen[2] = {sees(lane_keys[0], j), sees(lane_keys[1], j)};
#pragma unroll
          for (int s = 0; s < kSpans; ++s) {
            uint4 raw;
            raw.x = __shfl_sync(kFullWarp, v_raw[half][s].x, from_v);
            raw.y = __shfl_sync(kFullWarp, v_raw[half][s].y, from_v);
            raw.z = __shfl_sync(kFullWarp, v_raw[half][s].z, from_v);
            raw.w = __shfl_sync(kFullWarp, v_raw[half][s].w, from_v);
            float value[8];
            unpack8<Element>(raw, value);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              if (!seen[r]) continue;  // absent: a masked key's Inf must not meet a 0 weight
#pragma unroll
              for (int c = 0; c < 8; ++c)
                o[s][c / 2][2 * r + c % 2] = fmaf(weight[r], value[c], o[s][c / 2][2 * r + c % 2]);
            }
          }
        }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int s = 0; s < kSpans; ++s) {
        k_raw[half][s] = k_next[half][s];
        v_raw[half][s] = v_next[half][s];
      }
  }

  // The row sums over the quad, then the warps' states to shared memory.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    running_sum[r] += __shfl_xor_sync(kFullWarp, running_sum[r], 1);
    running_sum[r] += __shfl_xor_sync(kFullWarp, running_sum[r], 2);
  }
#pragma unroll
  for (int s = 0; s < kSpans; ++s)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* to = &shared.o[warp][g + 8 * r][32 * s + 8 * t];
      *reinterpret_cast<float4*>(to) =
          make_float4(o[s][0][2 * r], o[s][0][2 * r + 1], o[s][1][2 * r], o[s][1][2 * r + 1]);
      *reinterpret_cast<float4*>(to + 4) =
          make_float4(o[s][2][2 * r], o[s][2][2 * r + 1], o[s][3][2 * r], o[s][3][2 * r + 1]);
    }
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      shared.max[warp][g + 8 * r] = running_max[r];
      shared.sum[warp][g + 8 * r] = running_sum[r];
    }
  }
  __syncthreads();

  // Each thread merges (row, 4 columns) items over the warps, in warp order.
  for (int item = threadIdx.x; item < kSplitKvMmaRows * (kHeadDim / 4); item += blockDim.x) {
    const int r = item / (kHeadDim / 4), rho = rho0 + r, column = item % (kHeadDim / 4) * 4;
    if (!row_active(rho)) continue;
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kSplitKvMmaWarps; ++w) top = fmaxf(top, shared.max[w][r]);
    const float subtrahend = top == -INFINITY ? 0.0f : top;
    float sum = 0.0f, out[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int w = 0; w < kSplitKvMmaWarps; ++w) {
      // A warp that saw no key has max -inf and weighs 0 (its sum and O are 0).
      const float factor = __expf(shared.max[w][r] - subtrahend);
      sum = fmaf(shared.sum[w][r], factor, sum);
      const float4 part = *reinterpret_cast<const float4*>(&shared.o[w][r][column]);
      out[0] = fmaf(part.x, factor, out[0]);
      out[1] = fmaf(part.y, factor, out[1]);
      out[2] = fmaf(part.z, factor, out[2]);
      out[3] = fmaf(part.w, factor, out[3]);
    }
    float lse;
    if (top == -INFINITY) {
      // No key, or only -inf logits: weight 0 in the combine (splitkv_kernel says why).
      lse = isnan(sum) ? quiet_nan() : -INFINITY;
    } else {
      const float inverse = 1.0f / sum;
      for (float& x : out) x *= inverse;
      lse = top + logf(sum);
    }
    store_slot(rho, column, make_float4(out[0], out[1], out[2], out[3]), lse);
  }
}

}  // namespace flashcheck::kernels
