// splitkv's split count (kernels/splitkv/splitkv.cu), host code on its own so
// that a unit test checks the rule without a GPU.
//
// FlashAttention-2's wave rule (num_splits_heuristic): where the grid of one
// split already fills most of the resident block slots, one split; otherwise
// the fewest splits whose last wave is at least 85% as full as the best
// choice's, among 1 to min(128, keys / kSplitKvMinKeys). Until 2026-11-27 the
// cap was 64: one sequence of 131072 keys with one K/V head (2 blocks a split
// on 396 slots) got 55 splits, 110 blocks, where the rule's 128 gives 109.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace flashcheck::kernels {

/// The rule gives a split at least this many keys (a few steps per warp).
inline constexpr int kSplitKvMinKeys = 256;
/// The most splits the rule picks (FlashAttention's max_splits; a caller may ask
/// for up to kSplitKvMaxSplits, splitkv.cuh).
inline constexpr int kSplitKvRuleMostSplits = 128;

/// Splits for a grid of `blocks_per_split` blocks per split, `seqlen_kv` keys
/// and `slots` resident blocks on the device, at most `most_splits`
/// (splitkv's tensor-core path, whose combine reads the splits in parallel,
/// allows one wave of the slots).
inline int splitkv_split_count(std::int64_t blocks_per_split, int seqlen_kv, int slots,
                               int most_splits = kSplitKvRuleMostSplits) {
  if (blocks_per_split >= 0.8 * slots) return 1;
  const int most = std::clamp(seqlen_kv / kSplitKvMinKeys, 1, std::max(1, most_splits));
  const auto efficiency = [&](int splits) {
    const double waves = static_cast<double>(blocks_per_split) * splits / slots;
    return waves / std::ceil(waves);
  };
  double best = 0.0;
  for (int splits = 1; splits <= most; ++splits) best = std::max(best, efficiency(splits));
  for (int splits = 1; splits <= most; ++splits)
    if (efficiency(splits) >= 0.85 * best) return splits;
  return 1;
}

}  // namespace flashcheck::kernels
