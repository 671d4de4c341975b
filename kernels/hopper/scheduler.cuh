// The Hopper kernel's tile scheduler: a persistent grid (one block per SM)
// walks the (query block, batch x head) tiles with a static stride, so both
// of a block's roles see the same tiles in the same order without talking.
//
// Order: heads are taken in groups whose K and V fit in a share of the L2
// (the blocks running at once then mostly read the same few heads' keys),
// and inside a group the last query blocks come first: under a causal mask
// they see the most keys, so the short ones fill the tail (longest first).
#pragma once

#include <algorithm>

#include "kernels/common/attention.cuh"

namespace flashcheck::kernels::hopper {

/// One tile: query rows [q0, q0 + kBlockM) of head h of sequence b.
struct Tile {
  int b, h, q0;
};

struct TileScheduler {
  int query_blocks;  // per (batch, head)
  int heads;         // batch * heads_q
  int group;         // heads per group

  __host__ __device__ int tiles() const { return query_blocks * heads; }

  /// The id-th tile in the longest-first, head-grouped order.
  template <int kBlockM>
  __device__ Tile at(int id, int heads_q) const {
    const int per_group = group * query_blocks;
    const int g = id / per_group, in_group = id % per_group;
    const int width = min(group, heads - g * group);  // the last group may be narrower
    const int bh = g * group + in_group % width;
    const int block = query_blocks - 1 - in_group / width;
    return {bh / heads_q, bh % heads_q, block * kBlockM};
  }
};

/// Heads per group: as many query heads as keep their K and V within
/// `l2_share` bytes (query heads of one GQA group share theirs), at least one.
inline int head_group(const gpu::AttentionArgs& a, long long l2_share) {
  const long long heads = static_cast<long long>(a.batch) * a.heads_q;
  const long long kv_head = 2LL * a.seqlen_kv * (a.head_dim + a.head_dim_v);
  const long long per_query_head = std::max(1LL, kv_head / std::max(1, a.heads_q / std::max(1, a.heads_kv)));
  return static_cast<int>(std::clamp(l2_share / per_query_head, 1LL, std::max(1LL, heads)));
}

}  // namespace flashcheck::kernels::hopper
