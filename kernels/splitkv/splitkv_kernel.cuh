// splitkv's kernels and launcher (included by splitkv.cu and the mutants).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>

#include "decode/decode_block.cuh"
#include "flashcheck/kernels/splitkv/split_rule.hpp"
#include "splitkv/splitkv.cuh"
#include "splitkv/splitkv_mma_kernel.cuh"

namespace flashcheck::kernels {

/// Warps of a split block: several blocks share an SM (each up to 168 registers).
inline constexpr int kSplitKvWarps = 4;
inline constexpr int kSplitKvBlocksPerSm = 3;
/// The most warps of a combine block (one row a block).
inline constexpr int kCombineWarps = 16;


// Blocks: x = (batch x K/V head) x chunk of 4 rows, chunks fastest so that the
// blocks reading one group's K/V run together; y = the split.
template <typename Element, int kHeadDim, SplitKvFlaw kFlaw, KeyReading kReading>
__global__ void __launch_bounds__(kSplitKvWarps * 32, kSplitKvBlocksPerSm)
    splitkv_kernel(const gpu::AttentionArgs a, const SplitKvPartials partials, int chunks) {
  __shared__ DecodeShared<kHeadDim, kSplitKvWarps> shared;
  let_combine_launch();
  const int chunk = blockIdx.x % chunks, pair = blockIdx.x / chunks;
  const int b = pair / a.heads_kv, hk = pair % a.heads_kv, split = blockIdx.y, splits = gridDim.y;
  const int lq = query_length(a, b), lk = key_length(a, b);
  if (chunk * kDecodeRows >= lq * (a.heads_q / a.heads_kv)) return;  // only padding rows: no slot is read
  // This split's keys of this sequence: [first, last], empty past the end.
  const int per_split = (lk + splits - 1) / splits;
  const int first = split * per_split, last = min(lk, first + per_split) - 1;
  const DecodeRows rows = decode_rows(a, hk, chunk, lq, lk, first, last);

  constexpr int kChunks = kHeadDim / 8;
  static_assert(kDecodeRows * kChunks <= kSplitKvWarps * 32, "one pass of the block covers the slots");
  const int r = threadIdx.x / kChunks, column = threadIdx.x % kChunks * 8;
  auto write_slot = [&](const float (&out)[8], float lse) {
    const DecodeRow row = decode_row(a, hk, chunk, r, lq, lk, first, last);
    if (!row.active) return;
    const std::int64_t slot =
        split * partials.rows + (static_cast<std::int64_t>(b) * a.heads_q + row.head) * a.seqlen_q + row.position;
    float4* to = reinterpret_cast<float4*>(partials.o + slot * kHeadDim + column);
    to[0] = make_float4(out[0], out[1], out[2], out[3]);
    to[1] = make_float4(out[4], out[5], out[6], out[7]);
    if (column == 0) partials.lse[slot] = lse;
  };

  if (rows.first_key > rows.last_key) {  // no row sees a key of this split (block-uniform)
    if (kFlaw == SplitKvFlaw::empty_split_unwritten) return;
    // The slot must still say so, or the combine would merge what it held.
    const float zeros[8] = {};
    if (r < kDecodeRows) write_slot(zeros, -INFINITY);
    return;
  }
  decode_pass<Element, kHeadDim, kSplitKvWarps, kReading>(a, b, hk, rows, shared);
  if (r >= kDecodeRows) return;
  const DecodeMerged merged = decode_merge<kHeadDim, kSplitKvWarps>(shared, r, column);
  if (merged.max == -INFINITY) {
    // No key of this split, or only -inf logits: weight 0 in the combine. O
    // keeps the 0 * Inf NaNs of the latter; the combine decides 0/0 for rows
    // that see keys but no finite logit in any split. Only NaN logits (which
    // the max skips) leave a NaN sum: the slot says NaN, so the row is NaN.
    write_slot(merged.o, isnan(merged.sum) ? quiet_nan() : -INFINITY);
  } else {
    const float inverse = 1.0f / merged.sum;
    float out[8];
    for (int c = 0; c < 8; ++c) out[c] = merged.o[c] * inverse;
    write_slot(out, merged.max + logf(merged.sum));
  }
}

// A block per (b, h, i) merges the splits: L = m + log sum_s exp(L_s - m) with
// m = max_s L_s, O = sum_s exp(L_s - L) O_s. Warp w takes splits w, w + W, ...
// (W warps, up to kCombineWarps), each lane d / 32 columns; the warps' sums
// meet in shared memory in warp order, so the result does not depend on
// timing (deterministic, no atomics). Until v4 a warp walked every split of
// its row in turn: one L2 round trip a split, 109 of them at 131072 keys.
template <typename Element, int kHeadDim, SplitKvFlaw kFlaw>
__global__ void __launch_bounds__(kCombineWarps * 32)
    splitkv_combine_kernel(const gpu::AttentionArgs a, const SplitKvPartials partials, int splits) {
  constexpr int kColumns = kHeadDim / 32;  // per lane
  __shared__ float shared_o[kCombineWarps][kHeadDim];
  __shared__ float shared_value[kCombineWarps];
  wait_for_splits();
  const std::int64_t n = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int i = n % a.seqlen_q, h = n / a.seqlen_q % a.heads_q;
  const int b = n / (static_cast<std::int64_t>(a.seqlen_q) * a.heads_q);
  const int lq = query_length(a, b), lk = key_length(a, b);
  if (i >= lq) return;  // padding: no split wrote this row (block-uniform)
  float* lse = partials.lse + n;
  const float* o = partials.o + n * kHeadDim + lane * kColumns;
  const std::int64_t o_split_stride = partials.rows * kHeadDim;

  // The block's maximum of the L_s, and whether any is NaN.
  float top = -INFINITY;
  bool nan_slot = false;
  for (int s = threadIdx.x; s < splits; s += blockDim.x) {
    const float split_lse = lse[s * partials.rows];
    top = fmaxf(top, split_lse);
    nan_slot = nan_slot || isnan(split_lse);
  }
  nan_slot = __syncthreads_or(nan_slot);
  top = warp_max(top);
  if (lane == 0) shared_value[warp] = top;
  __syncthreads();
  top = -INFINITY;
  for (int w = 0; w < warps; ++w) top = fmaxf(top, shared_value[w]);
  __syncthreads();

  float out[kColumns];
  float total_lse;
  if (nan_slot) {
    // A split saw a NaN (or +inf) logit, or a slot was never written.
    for (float& x : out) x = quiet_nan();
    total_lse = quiet_nan();
  } else if (top == -INFINITY) {
    // No split saw a finite logit: no visible key (O = 0, LSE = -inf), or
    // every visible logit -inf (the plain formula's 0/0).
    const KeyRange keys = visible_keys(a, i, lq, lk);
    const bool saw_keys = keys.first <= keys.last;
    for (float& x : out) x = saw_keys ? quiet_nan() : 0.0f;
    total_lse = saw_keys ? quiet_nan() : -INFINITY;
  } else {
    const float shift = kFlaw == SplitKvFlaw::unshifted_combine ? 0.0f : top;
    float sum = 0.0f;
    for (int s = threadIdx.x; s < splits; s += blockDim.x) sum += __expf(lse[s * partials.rows] - shift);
    sum = warp_sum(sum);
    if (lane == 0) shared_value[warp] = sum;
    __syncthreads();
    sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += shared_value[w];
    total_lse = shift + logf(sum);
    float part[kColumns];
    for (float& x : part) x = 0.0f;
#pragma unroll 4
    for (int s = warp; s < splits; s += warps) {  // unrolled: four splits' loads in flight
      // An empty split weighs exp(-inf) = 0 (its O_s is 0, or NaN where a V Inf met a 0 weight).
      const float weight = __expf(lse[s * partials.rows] - total_lse);
#pragma unroll
      for (int c = 0; c < kColumns; ++c) part[c] = fmaf(weight, o[s * o_split_stride + c], part[c]);
    }
#pragma unroll
    for (int c = 0; c < kColumns; ++c) shared_o[warp][lane * kColumns + c] = part[c];
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      out[c] = 0.0f;
      for (int w = 0; w < warps; ++w) out[c] += shared_o[w][lane * kColumns + c];
    }
  }
  // Each slot is read once per call: poisoning its LSE (NaN) after the last
  // read makes a split that fails to write its slot next time give NaN rows
  // instead of silently merging this call's value.
  __syncthreads();
  for (int s = threadIdx.x; s < splits; s += blockDim.x) lse[s * partials.rows] = quiet_nan();
  if (warp != 0) return;
  Element* to = static_cast<Element*>(a.o) + b * a.o_batch_stride + h * a.o_head_stride + i * a.o_seq_stride +
                lane * kColumns;
#pragma unroll
  for (int c = 0; c < kColumns; ++c) {
    if constexpr (std::is_same_v<Element, __half>) to[c] = __float2half_rn(out[c]);
    else to[c] = __float2bfloat16_rn(out[c]);
  }
  if (a.lse && lane == 0) a.lse[n] = total_lse;
}

/// Reserves the workspace for `splits` and lays the slots out in it (the combine is launch_splitkv_combine).
template <int kHeadDim>
SplitKvPartials splitkv_partials(const gpu::AttentionArgs& a, int splits, SplitKvWorkspace& workspace,
                                 const gpu::CallSite& site) {
  const std::int64_t rows = static_cast<std::int64_t>(a.batch) * a.heads_q * a.seqlen_q;
  const std::int64_t slots_total = rows * splits;
  float* base = static_cast<float*>(workspace.reserve(
      static_cast<std::size_t>(slots_total * (kHeadDim + 1)) * sizeof(float), a.stream, site));
  return SplitKvPartials{base, base + slots_total * kHeadDim, rows};
}

template <typename Element, int kHeadDim, SplitKvFlaw kFlaw>
void launch_splitkv_combine(const gpu::AttentionArgs& a, const SplitKvPartials& partials, int splits,
                            const gpu::CallSite& site) {
  const auto kernel = splitkv_combine_kernel<Element, kHeadDim, kFlaw>;
  // Launched as the split kernel's programmatic dependent where the code that
  // runs has the wait (built for sm_90 or newer): the version of the binary
  // this device loads, not the device's, decides. Asked once per device (a
  // process may drive an sm_90 and an sm_80 card, which load different code).
  static std::mutex mutex;
  static std::map<int, bool> programmatic_on;  // device -> the wait is in its code
  int device = 0;
  gpu::check(cudaGetDevice(&device), "cudaGetDevice", site);
  bool programmatic = false;
  {
    const std::lock_guard lock(mutex);
    auto found = programmatic_on.find(device);
    if (found == programmatic_on.end()) {
      cudaFuncAttributes attributes{};
      gpu::check(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes (splitkv combine)", site);
      found = programmatic_on.emplace(device, attributes.binaryVersion >= 90).first;
    }
    programmatic = found->second;
  }
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(partials.rows));
  config.blockDim = dim3(std::clamp(splits, 1, kCombineWarps) * 32);
  config.stream = a.stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  gpu::check(cudaLaunchKernelEx(&config, kernel, a, partials, splits), "cudaLaunchKernelEx (splitkv combine)", site);
  gpu::check_launch("splitkv_combine_kernel", site);
}

/// Resident blocks of `kernel` (threads a block) on the device.
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads, const gpu::CallSite& site) {
  int device = 0, sms = 0, per_sm = 0;
  gpu::check(cudaGetDevice(&device), "cudaGetDevice", site);
  gpu::check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute", site);
  gpu::check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor", site);
  return std::max(1, sms * per_sm);
}

// Enqueues a split kernel, kKernel(args, partials, chunks), over (batch x
// K/V head x chunk of kRows rows) x split, kWarps warps a block, then the
// combine. The split count is the wave rule over kKernel's resident blocks,
// up to FlashAttention's 128 splits or (kOneWave) one wave of the slots.
template <typename Element, int kHeadDim, SplitKvFlaw kFlaw, auto kKernel, int kRows, int kWarps, bool kOneWave>
void launch_splits(const gpu::AttentionArgs& a, int requested_splits, SplitKvWorkspace& workspace,
                   const gpu::CallSite& site) {
  const int chunks = (a.heads_q / a.heads_kv * a.seqlen_q + kRows - 1) / kRows;
  const std::int64_t blocks_per_split = static_cast<std::int64_t>(chunks) * a.batch * a.heads_kv;
  if (blocks_per_split == 0) return;  // no query rows
  static const int slots = resident_blocks(kKernel, kWarps * 32, site);  // once per kernel
  const int most = kOneWave ? std::min(slots, kSplitKvMaxSplits) : kSplitKvRuleMostSplits;
  const int splits =
      requested_splits > 0 ? requested_splits : splitkv_split_count(blocks_per_split, a.seqlen_kv, slots, most);
  const SplitKvPartials partials = splitkv_partials<kHeadDim>(a, splits, workspace, site);
  kKernel<<<dim3(static_cast<unsigned>(blocks_per_split), splits), kWarps * 32, 0, a.stream>>>(a, partials, chunks);
  gpu::check_launch("splitkv's split kernel", site);
  launch_splitkv_combine<Element, kHeadDim, kFlaw>(a, partials, splits, site);
}

// The tensor-core block (splitkv_mma_kernel.cuh: 16 rows a block, its combine
// taking the splits in parallel, so up to one wave of splits) where it fits,
// decode's CUDA-core block (4 rows) at d = 256.
template <typename Element, int kHeadDim, SplitKvFlaw kFlaw, KeyReading kReading>
void launch_splitkv_for(const gpu::AttentionArgs& a, int splits, SplitKvWorkspace& workspace,
                        const gpu::CallSite& site) {
  if constexpr (kHeadDim <= 128) {
    if (splitkv_mma_fits(a)) {
      launch_splits<Element, kHeadDim, kFlaw, splitkv_mma_kernel<Element, kHeadDim, kFlaw, kReading>, kSplitKvMmaRows,
                    kSplitKvMmaWarps, true>(a, splits, workspace, site);
      return;
    }
  }
  launch_splits<Element, kHeadDim, kFlaw, splitkv_kernel<Element, kHeadDim, kFlaw, kReading>, kDecodeRows,
                kSplitKvWarps, false>(a, splits, workspace, site);
}

template <SplitKvFlaw kFlaw>
void launch_splitkv(const gpu::AttentionArgs& a, int splits, SplitKvWorkspace& workspace, const gpu::CallSite& site) {
  dispatch_decode(a, [&]<typename Element, int kHeadDim>() {
    if (a.page_table) launch_splitkv_for<Element, kHeadDim, kFlaw, KeyReading::paged>(a, splits, workspace, site);
    else launch_splitkv_for<Element, kHeadDim, kFlaw, KeyReading::contiguous>(a, splits, workspace, site);
  });
}

}  // namespace flashcheck::kernels
