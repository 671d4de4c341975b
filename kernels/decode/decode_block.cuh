// A block's pass over one (batch, K/V head)'s keys for up to kDecodeRows query
// rows: the body of the decode kernel (kernels/decode/decode.cu), shared with
// splitkv (kernels/splitkv/), which runs it on a slice of the keys.
//
// Rows: a block serves kDecodeRows (query head, query position) pairs of one
// GQA group, row r of chunk c being rho = 4c + r with position rho / group and
// head hk * group + rho % group, so the whole group (and every query position)
// shares each K/V load.
// Keys: a warp owns kTileKeys consecutive keys per step, the warps of the block
// taking the steps round robin. A key row is kHeadDim / 8 lanes wide (16 bytes,
// 8 elements each), so a 16-byte load covers 32 / (kHeadDim / 8) keys and a
// lane issues kDecodeLoads loads of K and as many of V before it uses any.
// Logits: each lane dots its 8 columns with the row's query (f32), and a
// butterfly over the key's lanes sums them. Softmax is online per warp (one
// rescale per step, skipped while the maximum holds), in f32.
// Merge: the warps' (max, sum, unnormalised O) meet in shared memory and are
// combined per (row, 8 columns) in a fixed order: deterministic.
// Masked keys are absent (never weighted by 0): Inf/NaN inputs behave as in
// the plain formula.
// Paged K/V (AttentionArgs::page_table): each load finds its key's pool page
// in the table (one 4-byte read, cached: a warp's step spans at most two
// pages when pages hold 16 keys or more) and its slot within the page. The
// table is read a step ahead, while the step before computes, so that no K/V
// load waits for its table entry; the page and slot of a step's first key are
// carried from step to step (no division); the rest of the pass is the
// contiguous one's.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/attention.cuh"

namespace flashcheck::kernels {

/// Query rows per block, and 16-byte loads of K (and of V) per lane per step.
inline constexpr int kDecodeRows = 4;
inline constexpr int kDecodeLoads = 4;

template <int kHeadDim>
struct DecodeLanes {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "a key row spans 8, 16 or 32 lanes");
  static constexpr int kPerKey = kHeadDim / 8;  // lanes holding one key row, 8 elements each
  static constexpr int kKeysPerLoad = 32 / kPerKey;
  static constexpr int kTileKeys = kKeysPerLoad * kDecodeLoads;  // keys per warp per step
};

/// 8 f16/bf16 elements (16 bytes) <-> 8 floats.
template <typename Element>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&x)[8]) {
  using Pair = std::conditional_t<std::is_same_v<Element, __half>, __half2, __nv_bfloat162>;
  const Pair* pairs = reinterpret_cast<const Pair*>(&raw);
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    float2 f;
    if constexpr (std::is_same_v<Element, __half>) f = __half22float2(pairs[n]);
    else f = __bfloat1622float2(pairs[n]);
    x[2 * n] = f.x;
    x[2 * n + 1] = f.y;
  }
}

template <typename Element>
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  uint4 raw;
  auto* pairs = reinterpret_cast<std::conditional_t<std::is_same_v<Element, __half>, __half2, __nv_bfloat162>*>(&raw);
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    if constexpr (std::is_same_v<Element, __half>) pairs[n] = __floats2half2_rn(x[2 * n], x[2 * n + 1]);
    else pairs[n] = __floats2bfloat162_rn(x[2 * n], x[2 * n + 1]);
  }
  return raw;
}

/// How a pass finds key j of sequence b: contiguous K/V, or a paged pool read
/// through the table. The last two are deliberate flaws, for mutants
/// (kernels/mutants/decode_mutants.cu).
enum class KeyReading {
  contiguous,
  paged,
  paged_table_ignored,  // the pool read as if its pages were in sequence order
  paged_off_by_one,     // the first key of each page after the first read from the previous page's entry
};

/// Where key j of sequence b lives: the batch (or pool page) and the key's row within it.
struct KeyPlace {
  int page;
  int slot;
};

/// Key `slot` of sequence b's page n (its n-th table entry).
template <KeyReading kReading>
__device__ __forceinline__ KeyPlace paged_place(const gpu::AttentionArgs& a, int b, int n, int slot) {
  const int entry = b * a.pages_per_sequence + n;
  if constexpr (kReading == KeyReading::paged_table_ignored) return {entry % a.pages, slot};
  if constexpr (kReading == KeyReading::paged_off_by_one)
    if (slot == 0 && n > 0) return {__ldg(a.page_table + entry - 1), 0};
  return {__ldg(a.page_table + entry), slot};
}

/// A warp's walk over paged K/V in steps of `stride` keys: the page n of a
/// step's first key and that key's place in it, carried from step to step so
/// that no load divides by the page size (v2 of the paged decode divided each
/// load's key index: ncu put the paged splitkv on the short causal shape 18%
/// over the contiguous one). A step's keys (at most 16) span at most two pages
/// of 16 keys or more (kDecodeCapabilities' min_page_size): page n and the next.
template <KeyReading kReading>
struct PageWalk {
  int page_n = 0, page_first = 0, stride_pages = 0, stride_rest = 0;

  __device__ __forceinline__ PageWalk(const gpu::AttentionArgs& a, int first_key, int stride) {
    if constexpr (kReading != KeyReading::contiguous) {
      page_n = first_key / a.page_size;
      page_first = first_key - page_n * a.page_size;
      stride_pages = stride / a.page_size;
      stride_rest = stride - stride_pages * a.page_size;
    }
  }
  /// Key `offset` (below 16) of the current step of sequence b.
  __device__ __forceinline__ KeyPlace place(const gpu::AttentionArgs& a, int b, int offset) const {
    const int at = page_first + offset;
    const bool next = at >= a.page_size;
    return paged_place<kReading>(a, b, page_n + next, next ? at - a.page_size : at);
  }
  /// On to the next step.
  __device__ __forceinline__ void advance(const gpu::AttentionArgs& a) {
    page_n += stride_pages;
    page_first += stride_rest;
    if (page_first >= a.page_size) {
      page_first -= a.page_size;
      ++page_n;
    }
  }
};

/// One query row of a block: its head, position and the keys it sees.
struct DecodeRow {
  int head, position;
  bool active;    // a query of this sequence (not padding)
  KeyRange keys;  // visible keys within the slice; empty for inactive rows
};

/// Row r of chunk `chunk` of (b, hk), seeing keys among [slice_first, slice_last].
__device__ __forceinline__ DecodeRow decode_row(const gpu::AttentionArgs& a, int hk, int chunk, int r, int lq, int lk,
                                                int slice_first, int slice_last) {
  const int group = a.heads_q / a.heads_kv, rho = chunk * kDecodeRows + r;
  DecodeRow row;
  row.position = rho / group;
  row.head = hk * group + rho % group;
  row.active = row.position < lq;
  row.keys = visible_keys(a, row.position, lq, lk);
  row.keys.first = max(row.keys.first, slice_first);
  row.keys.last = row.active ? min(row.keys.last, slice_last) : -1;
  return row;
}

/// The rows of a block and the keys they see.
struct DecodeRows {
  DecodeRow row[kDecodeRows];
  int first_key, last_key;      // their union (empty when first_key > last_key)
  int inner_first, inner_last;  // their intersection over the active rows: keys no row masks
};

__device__ __forceinline__ DecodeRows decode_rows(const gpu::AttentionArgs& a, int hk, int chunk, int lq, int lk,
                                                  int slice_first, int slice_last) {
  DecodeRows rows;
  rows.first_key = rows.inner_first = lk;
  rows.last_key = rows.inner_last = -1;
  bool first_active = true;
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r) {
    const DecodeRow row = rows.row[r] = decode_row(a, hk, chunk, r, lq, lk, slice_first, slice_last);
    // Each row's range is an interval and they grow with the position, so
    // their union is the interval from the least first to the greatest last.
    if (row.keys.first <= row.keys.last) {
      rows.first_key = min(rows.first_key, row.keys.first);
      rows.last_key = max(rows.last_key, row.keys.last);
    }
    if (row.active) {
      rows.inner_first = first_active ? row.keys.first : max(rows.inner_first, row.keys.first);
      rows.inner_last = first_active ? row.keys.last : min(rows.inner_last, row.keys.last);
      first_active = false;
    }
  }
  return rows;
}

/// Per warp and row: the running maximum, the sum of weights, and O unnormalised.
template <int kHeadDim, int kWarps>
struct DecodeShared {
  float o[kWarps][kDecodeRows][kHeadDim];
  float max[kWarps][kDecodeRows];
  float sum[kWarps][kDecodeRows];
};

/// One row's merged state for 8 columns: O = o / sum and LSE = max + log(sum),
/// except when max is -inf (no key, or every visible logit -inf).
struct DecodeMerged {
  float max, sum;
  float o[8];
};

/// Runs the block's warps over keys [rows.first_key, rows.last_key] of (b, hk)
/// and leaves each warp's state in `shared` (followed by a barrier).
template <typename Element, int kHeadDim, int kWarps, KeyReading kReading>
__device__ __forceinline__ void decode_pass(const gpu::AttentionArgs& a, int b, int hk, const DecodeRows& rows,
                                            DecodeShared<kHeadDim, kWarps>& shared) {
  using Lanes = DecodeLanes<kHeadDim>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = lane / Lanes::kPerKey;             // which key of a load this lane holds
  const int column = lane % Lanes::kPerKey * 8;       // its 8 columns of K, V, Q and O

  float q[kDecodeRows][8];
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r) {
    uint4 raw = {0, 0, 0, 0};
    if (rows.row[r].active)
      raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const Element*>(a.q) + b * a.q_batch_stride +
                                                 rows.row[r].head * a.q_head_stride +
                                                 rows.row[r].position * a.q_seq_stride + column));
    unpack8<Element>(raw, q[r]);
  }

  float running_max[kDecodeRows], running_sum[kDecodeRows], o[kDecodeRows][8];
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r) {
    running_max[r] = -INFINITY;
    running_sum[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < 8; ++c) o[r][c] = 0.0f;
  }

  const Element* k = static_cast<const Element*>(a.k) + hk * a.k_head_stride + column;
  const Element* v = static_cast<const Element*>(a.v) + hk * a.v_head_stride + column;
  // Where this lane's loads of a step live, found a step ahead (the file's header).
  constexpr int kStride = kWarps * Lanes::kTileKeys;
  static_assert(Lanes::kTileKeys <= 16, "a step within two pages");
  const int first_tile = rows.first_key + warp * Lanes::kTileKeys;
  PageWalk<kReading> walk(a, first_tile, kStride);
  KeyPlace place[kDecodeLoads];
  // The places of step `tile`'s loads: called once a step, in order (the
  // paged walk then moves on to the next step's).
  const auto find_places = [&](int tile) {
    if constexpr (kReading == KeyReading::contiguous) {
#pragma unroll
      for (int u = 0; u < kDecodeLoads; ++u) place[u] = {b, tile + u * Lanes::kKeysPerLoad + slot};
    } else {
#pragma unroll
      for (int u = 0; u < kDecodeLoads; ++u)
        place[u] = tile + u * Lanes::kKeysPerLoad + slot <= rows.last_key
                       ? walk.place(a, b, u * Lanes::kKeysPerLoad + slot)
                       : KeyPlace{0, 0};
      walk.advance(a);
    }
  };
  find_places(first_tile);
  for (int tile = first_tile; tile <= rows.last_key; tile += kStride) {
    // Every load of the step is in flight before any is used.
    uint4 k_raw[kDecodeLoads], v_raw[kDecodeLoads];
#pragma unroll
    for (int u = 0; u < kDecodeLoads; ++u) {
      const int j = tile + u * Lanes::kKeysPerLoad + slot;
      k_raw[u] = v_raw[u] = uint4{0, 0, 0, 0};
      if (j <= rows.last_key) {
        k_raw[u] = __ldg(reinterpret_cast<const uint4*>(k + place[u].page * a.k_batch_stride +
                                                        static_cast<std::int64_t>(place[u].slot) * a.k_seq_stride));
        v_raw[u] = __ldg(reinterpret_cast<const uint4*>(v + place[u].page * a.v_batch_stride +
                                                        static_cast<std::int64_t>(place[u].slot) * a.v_seq_stride));
      }
    }
    find_places(tile + kStride);  // the next step's (its table reads in flight while this step computes)

    float logit[kDecodeRows][kDecodeLoads];
#pragma unroll
    for (int u = 0; u < kDecodeLoads; ++u) {
      float key[8];
      unpack8<Element>(k_raw[u], key);
#pragma unroll
      for (int r = 0; r < kDecodeRows; ++r) {
        float dot = 0.0f;
#pragma unroll
        for (int c = 0; c < 8; ++c) dot = fmaf(q[r][c], key[c], dot);
        // Sum over the key's lanes: every one of them ends with the same bits.
#pragma unroll
        for (int offset = Lanes::kPerKey / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(kFullWarp, dot, offset);
        logit[r][u] = dot * a.scale;
      }
    }

    // Inside every active row's range no key needs a mask test (inactive rows
    // compute on zero queries and are never written).
    const bool whole = tile >= rows.inner_first && tile + Lanes::kTileKeys - 1 <= rows.inner_last;
    auto softmax_and_accumulate = [&](auto masked) {
      auto visible = [&](int r, int u) {
        return !decltype(masked)::value || sees(rows.row[r].keys, tile + u * Lanes::kKeysPerLoad + slot);
      };
#pragma unroll
      for (int r = 0; r < kDecodeRows; ++r) {
        // The step's maximum over visible keys, then over the warp's key slots.
        // fmaxf skips NaN logits; their weights below are NaN and poison the row.
        float step_max = -INFINITY;
#pragma unroll
        for (int u = 0; u < kDecodeLoads; ++u)
          if (visible(r, u)) step_max = fmaxf(step_max, logit[r][u]);
#pragma unroll
        for (int offset = Lanes::kPerKey; offset < 32; offset *= 2)
          step_max = fmaxf(step_max, __shfl_xor_sync(kFullWarp, step_max, offset));
        const float grown = fmaxf(running_max[r], step_max);
        // While every logit seen is -inf, subtract 0: such keys weigh 0, not NaN.
        const float subtrahend = grown == -INFINITY ? 0.0f : grown;
        if (grown != running_max[r]) {  // warp-uniform; an unchanged maximum would rescale by exactly 1
          const float correction = __expf(running_max[r] - subtrahend);
          running_sum[r] *= correction;
#pragma unroll
          for (int c = 0; c < 8; ++c) o[r][c] *= correction;
          running_max[r] = grown;
        }
#pragma unroll
        for (int u = 0; u < kDecodeLoads; ++u) {
          logit[r][u] = visible(r, u) ? __expf(logit[r][u] - subtrahend) : 0.0f;  // now the weight
          running_sum[r] += logit[r][u];
        }
      }
#pragma unroll
      for (int u = 0; u < kDecodeLoads; ++u) {
        float value[8];
        unpack8<Element>(v_raw[u], value);
#pragma unroll
        for (int r = 0; r < kDecodeRows; ++r) {
          if (!visible(r, u)) continue;  // absent: a masked key's Inf must not meet a 0 weight
#pragma unroll
          for (int c = 0; c < 8; ++c) o[r][c] = fmaf(logit[r][u], value[c], o[r][c]);
        }
      }
    };
    if (whole) softmax_and_accumulate(std::false_type{});
    else softmax_and_accumulate(std::true_type{});
  }

  // The warp's key slots share the maximum: add their sums and outputs.
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r) {
#pragma unroll
    for (int offset = Lanes::kPerKey; offset < 32; offset *= 2) {
      running_sum[r] += __shfl_xor_sync(kFullWarp, running_sum[r], offset);
#pragma unroll
      for (int c = 0; c < 8; ++c) o[r][c] += __shfl_xor_sync(kFullWarp, o[r][c], offset);
    }
    if (slot == 0) {
      float4* to = reinterpret_cast<float4*>(&shared.o[warp][r][column]);
      to[0] = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
      to[1] = make_float4(o[r][4], o[r][5], o[r][6], o[r][7]);
    }
    if (lane == 0) {
      shared.max[warp][r] = running_max[r];
      shared.sum[warp][r] = running_sum[r];
    }
  }
  __syncthreads();
}

/// Row r's merged state over the warps for columns [column, column + 8), after decode_pass.
template <int kHeadDim, int kWarps>
__device__ __forceinline__ DecodeMerged decode_merge(const DecodeShared<kHeadDim, kWarps>& shared, int r, int column) {
  DecodeMerged merged;
  merged.max = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) merged.max = fmaxf(merged.max, shared.max[w][r]);
  const float subtrahend = merged.max == -INFINITY ? 0.0f : merged.max;
  merged.sum = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; ++c) merged.o[c] = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    // A warp that saw no key has max -inf and weighs 0 (its sum and O are 0).
    const float factor = __expf(shared.max[w][r] - subtrahend);
    merged.sum = fmaf(shared.sum[w][r], factor, merged.sum);
    const float4* from = reinterpret_cast<const float4*>(&shared.o[w][r][column]);
    const float4 low = from[0], high = from[1];
    const float part[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
#pragma unroll
    for (int c = 0; c < 8; ++c) merged.o[c] = fmaf(part[c], factor, merged.o[c]);
  }
  return merged;
}

}  // namespace flashcheck::kernels
