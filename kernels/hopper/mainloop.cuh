// The Hopper kernel's mainloop: the shared-memory plan, the producer's TMA
// loads and the consumers' two wgmma products per key tile.
//
// Shared memory (1024-byte aligned panels: a panel is one TMA box of 128
// bytes a row (64 f16/bf16 columns, 128 fp8 ones) x rows, 128-byte swizzled):
//   Q      kPanels panels of kBlockM rows, loaded once per tile;
//   O      the same shape, the epilogue's staging for the TMA store; when it
//          does not fit (d = 256) O is staged in Q's place;
//   K, V   a ring of kStages stages of kPanels panels of kBlockN rows (fp8:
//          V transposed, V^T's D rows of kBlockN keys, see launch.cuh);
//   mbarriers: Q full/empty, per stage K full/empty and V full/empty, and
//          per tile slot full/empty (the scheduler's hand-over of tile ids);
//   the tile slots: kTileSlots ints.
// "full" completes when TMA has written a buffer (the producer arms it with
// the byte count); "empty" when all 256 consumer threads have released it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "hopper/hopper_ptx.cuh"
#include "hopper/mask.cuh"
#include "hopper/scheduler.cuh"
#include "hopper/softmax.cuh"
#include "hopper/wgmma_ops.cuh"

namespace flashcheck::kernels::hopper {

inline constexpr int kBlockM = 128;       // query rows per tile: 64 per consumer warpgroup
inline constexpr int kThreads = 3 * 128;  // producer + 2 consumers
inline constexpr int kConsumerThreads = 256;
inline constexpr int kStages = 2;
// Named barriers: 0 is __syncthreads's, 1 + c consumer c's epilogue, kTurn + c its pingpong turn.
inline constexpr int kTurn = 3;
inline constexpr int kTileSlots = 2;  // tile ids in flight from the producer to the consumers

/// An element type's layout facts: a 128-byte row (one swizzle span) holds
/// 128 / bytes elements, and one wgmma's k covers 32 bytes (k16 for f16/bf16,
/// k32 for fp8). O is written in Out: T, or bf16 for the fp8 formats.
template <typename T>
struct Element {
  static constexpr int kBytes = sizeof(T);
  static constexpr bool kFp8 = kBytes == 1;
  static constexpr bool kE5m2 = std::is_same_v<T, __nv_fp8_e5m2>;
  static constexpr int kPanelCols = 128 / kBytes;
  static constexpr int kStepK = 32 / kBytes;
  using Out = std::conditional_t<kFp8, __nv_bfloat16, T>;
};

/// The wgmma wrappers for an element type and N.
template <typename T, int N>
using WgmmaOf = std::conditional_t<Element<T>::kFp8, WgmmaFp8<N, Element<T>::kE5m2>,
                                   Wgmma<N, std::is_same_v<T, __nv_bfloat16>>>;

template <typename T, int D>
struct Shape {
  // Keys per tile (registers: O D/2 + S kBlockN/2 floats). fp8: 256, as
  // cuDNN's fp8 kernel (64 x 256) and FlashAttention-3's (224) take: its
  // consumers never hold S and a tile's P V at once (Consumer::run_fp8).
  static constexpr int kBlockN = Element<T>::kFp8 ? 256 : D == 256 ? 64 : 128;
  static constexpr int kPanels = D / Element<T>::kPanelCols;
  static constexpr int kQBytes = kPanels * kBlockM * 128;
  static constexpr int kKvBytes = kPanels * kBlockN * 128;  // one stage of K (or of V)
  static constexpr bool kOInQ = D == 256;                   // 64 + 64 + 128 KiB would exceed the 227 KiB
  static constexpr int kOBytes = kOInQ ? 0 : (D / 64) * kBlockM * 128;  // O is 16-bit: D / 64 panels
  // fp8's V^T stage is D rows of kBlockN bytes in kBlockN / 128 panels of D
  // rows x 128 keys (one swizzle span a row): kKvBytes when D = 128.
  static constexpr int kVtPanelBytes = D * 128;
  static_assert(!Element<T>::kFp8 || (D == 128 && kBlockN % 128 == 0), "fp8: d = 128 only");
  static constexpr int kBarriers = 2 + 4 * kStages + 2 * kTileSlots;
  static constexpr int kSmemBytes = 1024 + kQBytes + kOBytes + 2 * kStages * kKvBytes + 8 * kBarriers + 4 * kTileSlots;
};

/// Addresses are computed, not stored, so that a runtime stage index does not
/// put an array in local memory.
template <typename T, int D>
struct Smem {
  using S = Shape<T, D>;
  std::uint32_t base;

  __device__ explicit Smem(unsigned char* raw) : base((smem_address(raw) + 1023u) & ~1023u) {}
  __device__ std::uint32_t q() const { return base; }
  __device__ std::uint32_t o() const { return S::kOInQ ? base : base + S::kQBytes; }
  __device__ std::uint32_t k(int s) const { return base + S::kQBytes + S::kOBytes + 2 * s * S::kKvBytes; }
  __device__ std::uint32_t v(int s) const { return k(s) + S::kKvBytes; }
  __device__ std::uint32_t barriers() const { return k(kStages); }
  __device__ std::uint32_t q_full() const { return barriers(); }
  __device__ std::uint32_t q_empty() const { return barriers() + 8; }
  __device__ std::uint32_t k_full(int s) const { return barriers() + 16 + 32 * s; }
  __device__ std::uint32_t v_full(int s) const { return k_full(s) + 8; }
  __device__ std::uint32_t k_empty(int s) const { return k_full(s) + 16; }
  __device__ std::uint32_t v_empty(int s) const { return k_full(s) + 24; }
  __device__ std::uint32_t tile_full(int slot) const { return barriers() + 16 + 32 * kStages + 16 * slot; }
  __device__ std::uint32_t tile_empty(int slot) const { return tile_full(slot) + 8; }
  __device__ std::uint32_t tile_id(int slot) const { return barriers() + 8 * S::kBarriers + 4 * slot; }

  __device__ void init_barriers() const {
    mbarrier_init(q_full(), 1);
    mbarrier_init(q_empty(), kConsumerThreads);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(k_full(s), 1);
      mbarrier_init(v_full(s), 1);
      mbarrier_init(k_empty(s), kConsumerThreads);
      mbarrier_init(v_empty(s), kConsumerThreads);
    }
    for (int slot = 0; slot < kTileSlots; ++slot) {
      mbarrier_init(tile_full(slot), 1);
      mbarrier_init(tile_empty(slot), kConsumerThreads);
    }
    mbarrier_init_fence();
  }
};

/// A position in the K/V ring, counted over the block's whole life (both
/// roles count the same key tiles in the same order).
struct Ring {
  unsigned n = 0;  // unsigned: the stage and phase are a mask and a shift
  __device__ int stage() const { return static_cast<int>(n % kStages); }
  __device__ unsigned phase() const { return (n / kStages) & 1u; }
};

/// The producer's loads for one tile: its first K, then Q (once the
/// consumers have released the previous tile's Q), then the rest, each into
/// the next free stage. `q_uses` counts the tiles loaded so far.
template <typename T, int D>
__device__ __forceinline__ void produce_tile(const Smem<T, D>& smem, const CUtensorMap& map_q, const CUtensorMap& map_k,
                                             const CUtensorMap& map_v, const Tile& tile, int hk, int begin, int end,
                                             Ring& ring, int q_uses) {
  using S = Shape<T, D>;
  constexpr int kCols = Element<T>::kPanelCols;
  const auto load_k = [&](int key_tile) {
    const int s = ring.stage();
    mbarrier_wait(smem.k_empty(s), ring.phase() ^ 1);
    mbarrier_expect_bytes(smem.k_full(s), S::kKvBytes);
    for (int p = 0; p < S::kPanels; ++p)
      tma_load_4d(smem.k(s) + p * S::kBlockN * 128, &map_k, smem.k_full(s), kCols * p, key_tile * S::kBlockN, hk, tile.b);
  };
  const auto load_v = [&](int key_tile) {
    const int s = ring.stage();
    mbarrier_wait(smem.v_empty(s), ring.phase() ^ 1);
    mbarrier_expect_bytes(smem.v_full(s), S::kKvBytes);
    if constexpr (Element<T>::kFp8)  // V^T {keys, d, head, batch}: boxes of 128 keys x all D rows
      for (int p = 0; p < S::kBlockN / 128; ++p)
        tma_load_4d(smem.v(s) + p * S::kVtPanelBytes, &map_v, smem.v_full(s), key_tile * S::kBlockN + 128 * p, 0, hk,
                    tile.b);
    else
      for (int p = 0; p < S::kPanels; ++p)
        tma_load_4d(smem.v(s) + p * S::kBlockN * 128, &map_v, smem.v_full(s), kCols * p, key_tile * S::kBlockN, hk,
                    tile.b);
    ++ring.n;
  };
  if (begin < end) load_k(begin);
  mbarrier_wait(smem.q_empty(), (q_uses & 1) ^ 1);
  mbarrier_expect_bytes(smem.q_full(), S::kQBytes);
  for (int p = 0; p < S::kPanels; ++p)
    tma_load_4d(smem.q() + p * kBlockM * 128, &map_q, smem.q_full(), kCols * p, tile.q0, tile.h, tile.b);
  for (int key_tile = begin; key_tile < end; ++key_tile) {
    if (key_tile > begin) load_k(key_tile);
    load_v(key_tile);
  }
}

/// A consumer warpgroup's mainloop for one tile: rows [64 c, 64 c + 64) of
/// the tile against its key tiles, into O (unnormalized) and the softmax
/// state. O is defined only when the tile has a key (the epilogue tells by
/// the row sums). Tile j's S = Q K^T and tile j - 1's O += P V are issued together;
/// the softmax of S_j runs while O's product is in flight.
template <typename T, int D, HopperFlaw kFlaw>
struct Consumer {
  using S = Shape<T, D>;
  static constexpr int kBlockN = S::kBlockN, kTilesN = kBlockN / 8, kTilesD = D / 8;
  static constexpr int kStepK = Element<T>::kStepK;
  static constexpr int kChunks = kBlockN / kStepK;  // P's A fragments: one per k step of O += P V

  const Smem<T, D>& smem;
  int c;  // which consumer: 0 or 1

  /// S = Q K^T: D / kStepK steps (k16, or k32 for fp8), each 32 bytes further along a 128-byte row.
  /// The steps' descriptors are one descriptor each for Q and K plus
  /// constant offsets (descriptor_at): v2 built each step's from its address,
  /// about 40 integer instructions a key tile (the SASS).
  __device__ __forceinline__ void issue_s(float (&s)[kTilesN][4], int stage) const {
    const std::uint64_t q = sw128_descriptor(smem.q() + c * 64 * 128, 16, 1024);
    const std::uint64_t k = sw128_descriptor(smem.k(stage), 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / kStepK; ++kk) {
      const std::uint64_t q_at = descriptor_at(q, (kk / 4) * kBlockM * 128 + (kk % 4) * 32);
      const std::uint64_t k_at = descriptor_at(k, (kk / 4) * kBlockN * 128 + (kk % 4) * 32);
      if constexpr (Element<T>::kFp8) {
        if (kk == 0) WgmmaOf<T, kBlockN>::ss_first(s, q_at, k_at);
        else WgmmaOf<T, kBlockN>::ss(s, q_at, k_at, 1);
      } else {
        WgmmaOf<T, kBlockN>::ss(s, q_at, k_at, kk > 0);
      }
    }
    wgmma_commit();
  }
  /// O += P V: kBlockN / 16 steps of k16 (16 key rows, 2048 bytes of each V panel).
  /// The tile's first product overwrites O (`accumulate` false), so that O's
  /// registers are only ever defined by wgmma and the softmax's rescale.
  /// fp8: kBlockN / 32 steps of k32 on V^T (K-major, as fp8 wgmma needs): D
  /// rows of 128 keys a panel, each step 32 bytes further along the rows; the
  /// product always overwrites (Consumer::run_fp8 adds it to O).
  __device__ __forceinline__ void issue_pv(float (&o)[kTilesD][4], const std::uint32_t (&p)[kChunks][4], int stage,
                                           bool accumulate) const {
    const std::uint64_t v = sw128_descriptor(smem.v(stage), Element<T>::kFp8 ? 16 : kBlockN * 128, 1024);
#pragma unroll
    for (int kc = 0; kc < kChunks; ++kc) {
      if constexpr (Element<T>::kFp8) {
        const std::uint64_t v_at = descriptor_at(v, (kc / 4) * S::kVtPanelBytes + (kc % 4) * 32);
        if (kc == 0) WgmmaOf<T, D>::rs_first(o, p[kc], v_at);
        else WgmmaOf<T, D>::rs(o, p[kc], v_at, 1);
      } else {
        WgmmaOf<T, D>::rs(o, p[kc], descriptor_at(v, kc * 16 * 128), kc > 0 || accumulate);
      }
    }
    wgmma_commit();
  }
  __device__ __forceinline__ void wait_k(const Ring& ring) const { mbarrier_wait(smem.k_full(ring.stage()), ring.phase()); }

  /// Whether the consumers release Q as soon as their last S product has
  /// read it (so the next tile's Q loads during the last O product and the
  /// epilogue), rather than after the tile. Not where O is staged in Q's place,
  /// nor in the early-read mutant (its late wait must see this tile's phase).
  static constexpr bool kEarlyQRelease = !S::kOInQ && kFlaw != HopperFlaw::early_read;
  __device__ __forceinline__ void release_q() const { mbarrier_arrive(smem.q_empty()); }

  /// Pingpong: the two consumers take turns to issue their products, so one's
  /// softmax runs while the other's products keep the tensor cores busy.
  /// Named barrier kTurn + c is consumer c's turn: the other consumer arrives
  /// on it once it has issued (and once at the start: consumer 0 goes first).
  /// fp8 takes no turns (hopper-fp8 v4): each consumer issues as soon as its
  /// operands are ready. Its softmax is longer than its products (traced:
  /// about 2600 against 1600 cycles a key tile), so the turns only tied each
  /// consumer to the other's pace. Measured on an H100: causal 0.72x -> 0.76x
  /// of cuDNN, non-causal unchanged (docs/perf.md, "hopper-fp8 v4").
  static constexpr bool kTurns = !Element<T>::kFp8;
  __device__ __forceinline__ void take_turn() const {
    if constexpr (kTurns) named_barrier_sync(kTurn + c, kConsumerThreads);
  }
  __device__ __forceinline__ void pass_turn() const {
    if constexpr (kTurns) named_barrier_arrive(kTurn + (1 - c), kConsumerThreads);
  }

  /// S = Q K^T of the key tile in `ring`'s stage (its K full), issued in this
  /// consumer's turn after `in_turn` (which runs inside the turn: fp8's
  /// previous P V), waited for; K's stage is released.
  template <typename InTurn>
  __device__ __forceinline__ void compute_s(float (&s)[kTilesN][4], const Ring& ring, InTurn&& in_turn) const {
    take_turn();
    in_turn();
    wgmma_fence();
    issue_s(s, ring.stage());
    pass_turn();
    wgmma_wait<0>();
    fence_operands(s);
    mbarrier_arrive(smem.k_empty(ring.stage()));
  }

  /// fp8: each tile's P V goes to a fresh accumulator, added to O in f32 by
  /// the CUDA cores (FlashAttention-3 and cuDNN carry O in the wgmma's). The
  /// fp8 tensor cores keep about 13 fraction bits while they accumulate
  /// (Capabilities::product_accumulation_unit): carried over a long row, O's
  /// accumulator (the sum of every tile's P V, up to the row's length times
  /// |V|) truncates each tile's addition at 2^-13 of itself. Measured on an
  /// H100 (2026-11-27, v1 without this): O 1.3 off (of about 1.9) at 32768
  /// uniform keys, and a bias of t = -4431 at 4096 (docs/perf.md). DeepGEMM
  /// promotes its fp8 products to f32 the same way.
  static constexpr bool kPromote = Element<T>::kFp8;

  /// fp8's mainloop (v3). Each turn issues the previous tile's P V, waits for
  /// it and adds it to O, then issues this tile's S = Q K^T: S (kBlockN / 2
  /// registers) and the product (D / 2) are never live together, which lets
  /// the tile be 256 keys. v2 overlapped S with the previous P V inside the
  /// warpgroup (as run() does) on 128-key tiles: S, P V, O and P needed 224
  /// registers, spilled, and the consumers waited on short tiles (ncu: 0.53
  /// eligible warps a scheduler, MUFU 37% busy). The softmax of one consumer
  /// runs while the other's products keep the tensor cores busy (pingpong).
  /// run() calls it for a tile with at least one key tile.
  __device__ void run_fp8(const TileMask<kBlockN, kFlaw>& mask, Ring& ring, float (&o)[kTilesD][4],
                          OnlineSoftmax& softmax) const {
    const int begin = mask.plan.begin, end = mask.plan.end;
#pragma unroll
    for (int dt = 0; dt < kTilesD; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
    float s[kTilesN][4];
    std::uint32_t p[kChunks][4];
    // O += P V of the tile at `at` (its V stage full): a fresh product, added in f32.
    const auto add_product = [&](const Ring& at) {
      float pv[kTilesD][4];
      wgmma_fence();
      issue_pv(pv, p, at.stage(), false);
      wgmma_wait<0>();
      fence_operands(pv);
      fence_operands(p);
      mbarrier_arrive(smem.v_empty(at.stage()));
#pragma unroll
      for (int dt = 0; dt < kTilesD; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[dt][e] += pv[dt][e];
    };
    for (int key_tile = begin; key_tile < end; ++key_tile) {
      const Ring previous = ring;
      if (key_tile > begin) {
        ++ring.n;
        mbarrier_wait(smem.v_full(previous.stage()), previous.phase());
      }
      wait_k(ring);
      compute_s(s, ring, [&] {
        if (key_tile > begin) add_product(previous);
      });
      if (kEarlyQRelease && key_tile == end - 1) release_q();
      softmax.apply_softcap(s);
      mask.apply(s, key_tile);
      OnlineSoftmax::rescale(o, softmax.exponentiate<false>(s));  // O holds the tiles before this one; the running max
      OnlineSoftmax::to_fragments<T>(s, p);
    }
    mbarrier_wait(smem.v_full(ring.stage()), ring.phase());
    take_turn();
    add_product(ring);
    pass_turn();
    ++ring.n;
  }

  /// A consumer's mainloop for one tile: fp8 through run_fp8, f16/bf16 through
  /// run_overlapped; a tile without keys only releases Q.
  __device__ void run(const TileMask<kBlockN, kFlaw>& mask, Ring& ring, float (&o)[kTilesD][4],
                      OnlineSoftmax& softmax) const {
    if (mask.plan.begin >= mask.plan.end) {
      if constexpr (kEarlyQRelease) release_q();
      return;
    }
    if constexpr (kPromote) run_fp8(mask, ring, o, softmax);
    else run_overlapped(mask, ring, o, softmax);
  }

  /// f16/bf16: tile j's S and tile j - 1's P V issued together, the softmax of
  /// S_j under the P V product (the struct's header). At least one key tile.
  __device__ void run_overlapped(const TileMask<kBlockN, kFlaw>& mask, Ring& ring, float (&o)[kTilesD][4],
                                 OnlineSoftmax& softmax) const {
    const int begin = mask.plan.begin, end = mask.plan.end;
    float s[kTilesN][4];
    std::uint32_t p[kChunks][4];

    wait_k(ring);
    compute_s(s, ring, [] {});
    if (kEarlyQRelease && end == begin + 1) release_q();
    softmax.apply_softcap(s);
    mask.apply(s, begin);
    softmax.exponentiate<true>(s);  // O is still 0: nothing to rescale
    OnlineSoftmax::to_fragments<T>(s, p);

    // Both waits come before the fence: a wait is a loop, and ptxas serializes
    // every wgmma when one sits between a fence and the wgmma that follow it.
    for (int key_tile = begin + 1; key_tile < end; ++key_tile) {
      const Ring previous = ring;
      ++ring.n;
      wait_k(ring);
      mbarrier_wait(smem.v_full(previous.stage()), previous.phase());
      take_turn();
      wgmma_fence();
      issue_s(s, ring.stage());
      issue_pv(o, p, previous.stage(), key_tile > begin + 1);
      pass_turn();
      wgmma_wait<1>();  // S done; O's product may still run
      fence_operands(s);
      mbarrier_arrive(smem.k_empty(ring.stage()));
      if (kEarlyQRelease && key_tile == end - 1) release_q();
      softmax.apply_softcap(s);
      mask.apply(s, key_tile);
      const TileCorrection correction = softmax.exponentiate<true>(s);
      wgmma_wait<0>();
      fence_operands(o);
      fence_operands(p);  // P's registers stay reserved until the product that reads them is done
      mbarrier_arrive(smem.v_empty(previous.stage()));
      OnlineSoftmax::rescale(o, correction);
      OnlineSoftmax::to_fragments<T>(s, p);
    }

    mbarrier_wait(smem.v_full(ring.stage()), ring.phase());
    take_turn();
    wgmma_fence();
    issue_pv(o, p, ring.stage(), end > begin + 1);
    pass_turn();
    wgmma_wait<0>();
    fence_operands(o);
    mbarrier_arrive(smem.v_empty(ring.stage()));
    ++ring.n;
  }
};

}  // namespace flashcheck::kernels::hopper
