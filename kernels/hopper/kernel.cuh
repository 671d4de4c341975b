// The Hopper forward kernel: the roles composed.
//  - Warpgroup 0, the producer, gives its registers away (setmaxnreg) and
//    one of its threads issues every TMA load (mainloop.cuh: produce_tile).
//  - Warpgroups 1 and 2, the consumers, take the registers and run 64 query
//    rows each: the mainloop (mainloop.cuh: Consumer, with softmax.cuh and
//    mask.cuh) and the epilogue (epilogue.cuh).
//  - The grid is persistent: each block's producer takes tiles from the
//    scheduler (scheduler.cuh) until none is left and hands each to the
//    consumers; the K/V ring and the barriers' phases carry over from tile to tile.
// What each version changed and its measured speed: hopper.cu.
#pragma once

#include "hopper/epilogue.cuh"
#include "hopper/mainloop.cuh"
#include "hopper/scheduler.cuh"

namespace flashcheck::kernels::hopper {

inline constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;  // (168-24)*128 == (240-168)*256

template <typename T, int D, HopperFlaw kFlaw>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_forward(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                   const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_o,
                   const gpu::AttentionArgs a, const TileScheduler scheduler) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Shape<T, D>;
  constexpr int kBlockN = S::kBlockN;
  extern __shared__ unsigned char smem_raw[];
  const Smem<T, D> smem(smem_raw);
  if (threadIdx.x == 0) smem.init_barriers();
  __syncthreads();

  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  const int group_size = a.heads_q / a.heads_kv;
  Ring ring;
  int q_uses = 0;

  if (warpgroup == 0) {
    registers_down<kProducerRegisters>();
    if (threadIdx.x != 0) return;
    int id = static_cast<int>(blockIdx.x);
    for (int n = 0;; ++n) {  // hand the tile to the consumers (id >= tiles: none left)
      const int slot = n % kTileSlots;
      mbarrier_wait(smem.tile_empty(slot), ((n / kTileSlots) & 1) ^ 1);
      store_shared(smem.tile_id(slot), static_cast<std::uint32_t>(id));
      mbarrier_arrive(smem.tile_full(slot));
      if (id >= scheduler.tiles()) break;
      const int next = scheduler.next();  // its latency hides behind this tile's loads
      const Tile tile = scheduler.at<kBlockM>(id, a.heads_q);
      const int lq = query_length(a, tile.b), lk = key_length(a, tile.b);
      if (tile.q0 < lq) {
        const KeyPlan<kBlockN> plan =
            plan_keys<kBlockN, TileMask<kBlockN, kFlaw>::kMaskFlaw>(a, tile.q0, kBlockM, lq, lk);
        produce_tile<T, D>(smem, map_q, map_k, map_v, tile, tile.h / group_size, plan.begin, plan.end, ring, q_uses++);
      }
      id = next;
    }
    scheduler.finish();
    return;
  }

  // Pingpong (mainloop.cuh): both consumers take the same number of turns
  // (they share every tile's key tiles); consumer 1's opening arrival lets
  // consumer 0 go first, and consumer 0's closing wait takes consumer 1's last one.
  if (warpgroup == 2 && Consumer<T, D, kFlaw>::kTurns) named_barrier_arrive(kTurn, kConsumerThreads);
  registers_up<kConsumerRegisters>();
  const int c = warpgroup - 1;
  const int warp_row = 64 * c + 16 * (static_cast<int>(threadIdx.x) / 32 % 4);  // this warp's first row in a tile
  const Consumer<T, D, kFlaw> consumer{smem, c};
  for (int n = 0;; ++n) {
    const int slot = n % kTileSlots;
    mbarrier_wait(smem.tile_full(slot), (n / kTileSlots) & 1);
    const int id = static_cast<int>(load_shared(smem.tile_id(slot)));
    mbarrier_arrive(smem.tile_empty(slot));
    if (id >= scheduler.tiles()) break;
    const Tile tile = scheduler.at<kBlockM>(id, a.heads_q);
    const int lq = query_length(a, tile.b), lk = key_length(a, tile.b);
    if (tile.q0 >= lq) continue;
    const TileMask<kBlockN, kFlaw> mask(a, tile.q0, kBlockM, tile.q0 + warp_row, lq, lk);
    float o[D / 8][4];  // defined by the first product; never read when the tile has no key
    OnlineSoftmax softmax = OnlineSoftmax::make<kFlaw>(a);
    if constexpr (kFlaw != HopperFlaw::early_read) mbarrier_wait(smem.q_full(), q_uses & 1);
    consumer.run(mask, ring, o, softmax);
    // The mutant waits only after its products have read Q (which keeps the
    // barriers' phases in step: a consumer never laps the producer).
    if constexpr (kFlaw == HopperFlaw::early_read) mbarrier_wait(smem.q_full(), q_uses & 1);
    if constexpr (!S::kOInQ && !Consumer<T, D, kFlaw>::kEarlyQRelease) mbarrier_arrive(smem.q_empty());
    store_tile<T, D, kFlaw>(a, map_o, smem, tile, lq, c, o, softmax.state);
    if constexpr (S::kOInQ) {  // O was staged in Q's place: release Q once TMA has read it
      if (threadIdx.x % 128 == 0) bulk_wait_read<0>();
      warpgroup_sync(1 + c);
      mbarrier_arrive(smem.q_empty());
    }
    ++q_uses;
  }
  if (c == 0) consumer.take_turn();
  if (threadIdx.x % 128 == 0) bulk_wait<0>();
#else
  __trap();  // built for an architecture without wgmma and TMA: the launcher refuses before this
#endif
}

}  // namespace flashcheck::kernels::hopper
