// The Hopper kernel's tile scheduler: a persistent grid (one block per SM)
// takes the (query block, batch x head) tiles dynamically: block i starts
// with tile i, and each block's producer takes its next tile from a global
// counter when it starts loading the current one (so a block that drew short
// tiles draws more). The producer hands each tile id to the consumers
// through shared memory (mainloop.cuh: Smem's tile slots).
//
// Order: heads are taken in groups whose K and V fit in a share of the L2
// (the blocks running at once then mostly read the same few heads' keys),
// and inside a group the last query blocks come first: under a causal mask
// they see the most keys, so the short ones fill the tail (longest first).
#pragma once

#include <algorithm>

#include "common/attention.cuh"

namespace flashcheck::kernels::hopper {

/// One tile: query rows [q0, q0 + kBlockM) of head h of sequence b.
struct Tile {
  int b, h, q0;
};

struct TileScheduler {
  int query_blocks;  // per (batch, head)
  int heads;         // batch * heads_q
  int group;         // heads per group
  int* counters;     // [0]: tiles taken after the first gridDim.x, [1]: blocks done; both 0 at launch

  __host__ __device__ int tiles() const { return query_blocks * heads; }
  /// The id of the tile after the ones every block started with (>= tiles(): none left).
  __device__ int next() const { return static_cast<int>(gridDim.x) + atomicAdd(&counters[0], 1); }
  /// Called once per block after its last next(): the last block to finish
  /// zeroes the counters for the next launch on the stream (every block has
  /// drawn its last tile by then).
  __device__ void finish() const {
    __threadfence();
    if (atomicAdd(&counters[1], 1) == static_cast<int>(gridDim.x) - 1) {
      atomicExch(&counters[0], 0);
      atomicExch(&counters[1], 0);
    }
  }

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
