// hopper-bwd's kernel (included by backward/hopper_launch.cuh; backward/hopper.cu's
// file head says what it is, what each version changed and its measured speed).
//
// A block owns kKeys = 128 keys of one (batch, K/V head) and walks the query
// rows of every query head of the GQA group in steps of kStep = 64 rows,
// skipping the steps none of whose rows sees one of its keys. The grid is 1-D,
// key block major (block i: key block i / pairs of pair i % pairs), so the
// first key blocks, which see the most rows under a causal mask, start first.
// Its 384 threads are three warpgroups:
//  - warpgroup 0, the producer: it gives its registers away (setmaxnreg);
//    warp 0 loads K and V once (TMA), then each step's Q and dO tiles (TMA)
//    into a two-stage ring and writes the step's row information (log2(e)
//    LSE_i, D_i, the keys row i sees) and id beside them; thread 32, the dQ
//    writer, adds each step's dQ share to the f32 accumulator with TMA
//    reductions; the other threads leave;
//  - warpgroups 1 and 2, the consumers: consumer c owns keys [64 c, 64 c + 64)
//    of the block as the M rows of its wgmma tiles, with their dK and dV
//    accumulators (64 x D f32 each) in registers. A step:
//      S^T  = K_c Q^T, dP^T = V_c dO^T          (wgmma ss, 64 keys x 64 queries)
//      P^T  = exp2(S^T scale log2 e - LSE_i log2 e) where query i sees the key, else 0
//      dS^T = P^T o (dP^T - D_i)                 (f32)
//      dV  += P^T dO, dK += dS^T Q               (wgmma rs: P^T and dS^T rounded to T
//                                                 as register A operands)
//      dS^T to shared memory as dS [queries][keys] (stmatrix.trans), the
//      two consumers' halves side by side; a barrier over both;
//      dQ[:, c D/2 ... + D/2] = dS K             (wgmma ss, B MN-major: 64 queries x
//                                                 D/2 over the block's 128 keys)
//      into shared memory (f32, swizzled as TMA reads it), handed to the dQ
//      writer, which adds it to the accumulator; a row kernel scales and
//      converts the accumulator after the pass.
//    and at the end dK = scale dK, dV stored from registers.
// The barriers: full[s] completes when the step's TMA bytes have landed and
// warp 0's 32 threads have written its row information and id; empty[s] when
// the 256 consumer threads have released it (one arrival a warp, after a
// __syncwarp, made racecheck report the other lanes' reads racing the
// producer's next writes); dQ full when the 256 consumer threads have written
// the share and fenced it for the async proxy; dQ empty when the writer's
// reductions have read it.
// dS is double-buffered, so one consumer barrier a step suffices: a consumer
// reaches step n + 1's barrier only after its dQ product of step n completed,
// so the buffer of step n is free again at step n + 2.
// Keys past the sequence and rows past it or that see no key weigh exactly 0:
// P^T is selected to 0 there, so dS^T is 0 too (TMA zero-fills the rows past
// the tensors; the padding rows inside them hold finite values, the domain).
// dQ is not deterministic: a row's shares from three or more key blocks meet
// in the accumulator in whatever order the reductions arrive.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backward/mma_kernel.cuh"
#include "common/attention.cuh"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "hopper/hopper_ptx.cuh"
#include "hopper/wgmma_ops.cuh"

namespace flashcheck::kernels {

/// Deliberate flaws, for the mutants (kernels/mutants/hopper_backward_mutants.cu,
/// issue 22's bug classes ported to this kernel); `none` is the real kernel.
enum class HopperBackwardFlaw {
  none,
  scale_missing_in_dk,  // dK written without the softmax scale (dS's factor)
  gqa_not_reduced,      // dK and dV (and dQ) from the first query head of each GQA group only
  masked_keys_in_dk,    // dK and dQ add the dS of keys the mask hides (P computed without the mask)
};

}  // namespace flashcheck::kernels

namespace flashcheck::kernels::hopper_bwd {

using hopper::Wgmma;

inline constexpr int kKeys = 128;  // keys a block: 64 a consumer warpgroup
inline constexpr int kStep = 64;   // query rows a step
inline constexpr int kThreads = 3 * 128;
inline constexpr int kConsumerThreads = 256;
inline constexpr int kStages = 2;
inline constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;  // 40 x 128 + 232 x 256 <= 64 K
inline constexpr int kPairBarrier = 1;                                    // named barrier over both consumers

/// Shared memory (1024-byte aligned panels of 64 columns x rows, 128 bytes a
/// row, 128-byte swizzled, as TMA writes them):
///   K, V       kPanels panels of kKeys rows each, loaded once;
///   stage s    Q then dO, kPanels panels of kStep rows each;
///   dS 0, 1    two panels of kStep rows (queries) x 64 keys: consumer c's keys in panel c;
///   dQ         a step's dQ share, kStep rows x D f32: D / 32 panels of 32
///              columns (128 bytes a row, 128-byte swizzled), as TMA reads them;
///   rows s     kStep float4 (log2(e) LSE, D_i, first key, last key) a stage;
///   barriers   K/V full, full[s], empty[s], dQ full, dQ empty; then the step
///              ids, one int a stage.
template <int D>
struct Layout {
  static constexpr int kPanels = D / 64;
  static constexpr std::uint32_t kKeyTileBytes = kPanels * kKeys * 128;
  static constexpr std::uint32_t kStepTileBytes = kPanels * kStep * 128;
  static constexpr std::uint32_t kDsBytes = 2 * kStep * 128;
  static constexpr std::uint32_t kK = 0, kV = kKeyTileBytes, kStage = 2 * kKeyTileBytes;
  static constexpr std::uint32_t kDs = kStage + kStages * 2 * kStepTileBytes;
  static constexpr std::uint32_t kDq = kDs + 2 * kDsBytes;
  static constexpr std::uint32_t kRows = kDq + kStep * D * 4;
  static constexpr std::uint32_t kBarriers = kRows + kStages * kStep * 16;
  static constexpr std::uint32_t kStepIds = kBarriers + 8 * (3 + 2 * kStages);
  static constexpr int kSmemBytes = 1024 + kStepIds + 4 * kStages;
};

template <int D>
struct Smem {
  using L = Layout<D>;
  std::uint32_t base;
  unsigned char* generic;  // the same bytes, for the row information's float4 stores and loads

  __device__ explicit Smem(unsigned char* raw) {
    const std::uint32_t raw_address = hopper::smem_address(raw);
    base = (raw_address + 1023u) & ~1023u;
    generic = raw + (base - raw_address);
  }
  __device__ std::uint32_t k() const { return base + L::kK; }
  __device__ std::uint32_t v() const { return base + L::kV; }
  __device__ std::uint32_t q(int s) const { return base + L::kStage + s * 2 * L::kStepTileBytes; }
  __device__ std::uint32_t dout(int s) const { return q(s) + L::kStepTileBytes; }
  __device__ std::uint32_t ds(int buffer) const { return base + L::kDs + buffer * L::kDsBytes; }
  __device__ std::uint32_t dq() const { return base + L::kDq; }
  __device__ float4* rows(int s) const { return reinterpret_cast<float4*>(generic + L::kRows) + s * kStep; }
  __device__ std::uint32_t kv_full() const { return base + L::kBarriers; }
  __device__ std::uint32_t full(int s) const { return kv_full() + 8 + 16 * s; }
  __device__ std::uint32_t empty(int s) const { return full(s) + 8; }
  __device__ std::uint32_t dq_full() const { return full(kStages); }
  __device__ std::uint32_t dq_empty() const { return dq_full() + 8; }
  __device__ std::uint32_t step_id(int s) const { return base + L::kStepIds + 4 * s; }

  __device__ void init_barriers() const {
    hopper::mbarrier_init(kv_full(), 1);
    for (int s = 0; s < kStages; ++s) {
      hopper::mbarrier_init(full(s), 32);      // warp 0's threads (thread 0's arrival arms the bytes)
      // Every consumer thread arrives: with one arrival a warp (after a
      // __syncwarp) compute-sanitizer's racecheck saw the other lanes' reads of
      // the row information race the producer's next writes (24 hazards, H100).
      hopper::mbarrier_init(empty(s), kConsumerThreads);
    }
    hopper::mbarrier_init(dq_full(), kConsumerThreads);
    hopper::mbarrier_init(dq_empty(), 1);  // the dQ writer's thread
    hopper::mbarrier_init_fence();
  }
};

/// stmatrix.sync.aligned.m8n8.x4.trans: four 8 x 8 b16 matrices stored
/// transposed; lane l gives the address of stored row l % 8 of matrix l / 8,
/// and its register m holds (row l / 4, columns 2 (l % 4), + 1) of matrix m
/// before the transpose.
__device__ __forceinline__ void stmatrix_x4_trans(std::uint32_t address, const std::uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

/// The steps of one block: step s is query rows [i0, i0 + kStep) of query
/// head hk group + s / per_head, i0 = (s % per_head) kStep. Both roles walk
/// them in the same order (the producer hands each step's id to the consumers).
struct Steps {
  const gpu::AttentionArgs& a;
  int lq, lk, hk, group, per_head, count, key0, key_last;

  __device__ int head(int s) const { return hk * group + s / per_head; }
  __device__ int first_row(int s) const { return s % per_head * kStep; }
  /// The first step from s on that a row of sees a key of the block.
  __device__ int next(int s) const {
    for (; s < count; ++s) {
      const int i0 = first_row(s);
      const KeyRange seen = rowthread_bwd::keys_of_rows(a, i0, min(i0 + kStep, lq) - 1, lq, lk);
      if (seen.first <= key_last && seen.last >= key0) break;
    }
    return s;
  }
};

template <typename T, int D, HopperBackwardFlaw kFlaw>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_backward(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                    const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_do,
                    const __grid_constant__ CUtensorMap map_dq, const BackwardArgs args) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout<D>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kTilesQ = kStep / 8, kTilesD = D / 8, kHalfD = D / 2;
  extern __shared__ unsigned char smem_raw[];
  const Smem<D> smem(smem_raw);

  const gpu::AttentionArgs& a = args.attention;
  // Tile-major (mma_bwd::tile_major_blocks): the first key blocks first, which
  // under a causal mask see the most query rows (longest first: the short
  // ones fill the last wave).
  const int pairs = a.batch * a.heads_kv, pair = mma_bwd::pair_of_block(pairs);
  const int b = pair / a.heads_kv, hk = pair % a.heads_kv, group = a.heads_q / a.heads_kv;
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int key0 = mma_bwd::tile_of_block(pairs) * kKeys;
  // The warpgroup index through a shuffle, so that the compiler knows it is warp-uniform.
  const int warpgroup = __shfl_sync(kFullWarp, static_cast<int>(threadIdx.x) / 128, 0);
  const int per_head = (lq + kStep - 1) / kStep;
  const int heads_walked = kFlaw == HopperBackwardFlaw::gqa_not_reduced ? 1 : group;
  const Steps steps{a, lq, lk, hk, group, per_head, heads_walked * per_head, key0, min(key0 + kKeys, lk) - 1};
  const bool any_key = key0 < lk;  // else every key of the block is padding: dK = dV = 0 (block-uniform)

  if (threadIdx.x == 0) smem.init_barriers();
  __syncthreads();

  if (warpgroup == 0) {
    hopper::registers_down<kProducerRegisters>();
    if (threadIdx.x > 32 || !any_key) return;  // warp 0 and the dQ writer stay
    if (threadIdx.x == 32) {
      // Warp 1's first thread, the dQ writer: adds each step's dQ share, which
      // the consumers leave in shared memory, to the f32 accumulator with TMA
      // reductions (a box of 32 columns x kStep rows each), in the steps' order.
      int n = 0;
      for (int s = steps.next(0); s < steps.count; s = steps.next(s + 1), ++n) {
        hopper::mbarrier_wait(smem.dq_full(), n & 1);
        for (int p = 0; p < D / 32; ++p)
          hopper::tma_reduce_add_4d(&map_dq, smem.dq() + p * kStep * 128, 32 * p, steps.first_row(s), steps.head(s), b);
        hopper::bulk_commit();
        hopper::bulk_wait_read<0>();  // the share is read: the consumers may write the next one
        hopper::mbarrier_arrive(smem.dq_empty());
      }
      hopper::bulk_wait<0>();
      return;
    }
    const int lane = static_cast<int>(threadIdx.x);
    if (lane == 0) {
      hopper::mbarrier_expect_bytes(smem.kv_full(), 2 * L::kKeyTileBytes);
      for (int p = 0; p < L::kPanels; ++p) {
        hopper::tma_load_4d(smem.k() + p * kKeys * 128, &map_k, smem.kv_full(), 64 * p, key0, hk, b);
        hopper::tma_load_4d(smem.v() + p * kKeys * 128, &map_v, smem.kv_full(), 64 * p, key0, hk, b);
      }
    }
    int s = steps.next(0);
    for (int n = 0;; ++n) {
      const int stage = n % kStages;
      hopper::mbarrier_wait(smem.empty(stage), ((n / kStages) & 1) ^ 1);
      if (lane == 0) hopper::store_shared(smem.step_id(stage), static_cast<std::uint32_t>(s < steps.count ? s : -1));
      if (s >= steps.count) {
        hopper::mbarrier_arrive(smem.full(stage));
        break;
      }
      const int h = steps.head(s), i0 = steps.first_row(s);
      const std::int64_t row_base = (static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q;
      for (int r = lane; r < kStep; r += 32) {
        const mma_bwd::RowInfo info = mma_bwd::row_info(a, a.lse + row_base, args.delta + row_base, i0 + r, lq, lk);
        smem.rows(stage)[r] =
            float4{info.lse_log2, info.delta, __int_as_float(info.keys.first), __int_as_float(info.keys.last)};
      }
      if (lane == 0) {
        hopper::mbarrier_expect_bytes(smem.full(stage), 2 * L::kStepTileBytes);
        for (int p = 0; p < L::kPanels; ++p) {
          hopper::tma_load_4d(smem.q(stage) + p * kStep * 128, &map_q, smem.full(stage), 64 * p, i0, h, b);
          hopper::tma_load_4d(smem.dout(stage) + p * kStep * 128, &map_do, smem.full(stage), 64 * p, i0, h, b);
        }
      } else {
        hopper::mbarrier_arrive(smem.full(stage));
      }
      s = steps.next(s + 1);
    }
    return;
  }

  hopper::registers_up<kConsumerRegisters>();
  const int c = warpgroup - 1;
  const int warp = static_cast<int>(threadIdx.x) / 32 % 4, lane = static_cast<int>(threadIdx.x) % 32;
  // This thread's keys in the block: 64 c + 16 warp + lane / 4 (+ 8); its query
  // columns in a step: 8 nt + 2 (lane % 4) (+ 1).
  const int thread_key = key0 + 64 * c + 16 * warp + lane / 4;
  float dk[kTilesD][4] = {}, dv[kTilesD][4] = {};

  if (any_key) {
    const float scale_log2 = a.scale * mma_bwd::kLog2e;
    hopper::mbarrier_wait(smem.kv_full(), 0);
    for (int n = 0;; ++n) {
      const int stage = n % kStages;
      hopper::mbarrier_wait(smem.full(stage), (n / kStages) & 1);
      const int s = static_cast<int>(hopper::load_shared(smem.step_id(stage)));
      if (s < 0) break;

      // S^T = K_c Q^T and dP^T = V_c dO^T, each a commit group: D / 16
      // k-steps, 32 bytes along a 128-byte row each; A is this consumer's 64
      // key rows of the key tile, B the step's query tile.
      float st[kTilesQ][4], dpt[kTilesQ][4];
      auto issue_keys_by_queries = [&](float(&acc)[kTilesQ][4], std::uint32_t key_tile, std::uint32_t step_tile) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          const std::uint32_t at = (kk / 4) * kKeys * 128 + c * 64 * 128 + (kk % 4) * 32;
          const std::uint32_t bt = (kk / 4) * kStep * 128 + (kk % 4) * 32;
          Wgmma<kStep, kBf16>::ss(acc, hopper::sw128_descriptor(key_tile + at, 16, 1024),
                                  hopper::sw128_descriptor(step_tile + bt, 16, 1024), kk > 0);
        }
        hopper::wgmma_commit();
      };
      hopper::wgmma_fence();
      issue_keys_by_queries(st, smem.k(), smem.q(stage));
      issue_keys_by_queries(dpt, smem.v(), smem.dout(stage));

      // P^T (in st) while dP^T's product runs.
      const float4* rows = smem.rows(stage);
      hopper::wgmma_wait<1>();
      hopper::fence_operands(st);
      [[maybe_unused]] float p_unmasked[kFlaw == HopperBackwardFlaw::masked_keys_in_dk ? kTilesQ : 1][4];
#pragma unroll
      for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float4 row = rows[nt * 8 + lane % 4 * 2 + e % 2];  // log2(e) LSE, D_i, first key, last key
          const int key = thread_key + e / 2 * 8;
          const bool live = key >= __float_as_int(row.z) && key <= __float_as_int(row.w);
          const float weight = exp2_shifted_keeping_subnormals(fmaf(st[nt][e], scale_log2, -row.x));
          if constexpr (kFlaw == HopperBackwardFlaw::masked_keys_in_dk)
            p_unmasked[nt][e] = key < lk && row.x != -INFINITY ? weight : 0.0f;
          st[nt][e] = live ? weight : 0.0f;
        }

      hopper::wgmma_wait<0>();
      hopper::fence_operands(dpt);
#pragma unroll
      for (int nt = 0; nt < kTilesQ; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float delta = rows[nt * 8 + lane % 4 * 2 + e % 2].y;
          float weight = st[nt][e];  // P^T: 0 exactly where the key is hidden
          if constexpr (kFlaw == HopperBackwardFlaw::masked_keys_in_dk) weight = p_unmasked[nt][e];
          dpt[nt][e] = weight * (dpt[nt][e] - delta);
        }
      // Both packed only now: P^T's f32 values live on for dS^T, and its
      // fragments beside them would put the step past 240 registers (d = 128).
      std::uint32_t pt[kTilesQ / 2][4], dst[kTilesQ / 2][4];
      to_fragments<T>(st, pt);
      to_fragments<T>(dpt, dst);

      // dS^T into this consumer's panel of the step's dS buffer, as dS [query][key]:
      // k-tile kc's fragment is the four 8 x 8 matrices (queries 16 kc + 8 (m / 2),
      // keys 16 warp + 8 (m % 2)), each stored transposed.
      const std::uint32_t ds_panel = smem.ds(n % 2) + c * kStep * 128;
#pragma unroll
      for (int kc = 0; kc < kTilesQ / 2; ++kc) {
        const int m = lane / 8, query = 16 * kc + 8 * (m / 2) + lane % 8, chunk = 2 * warp + m % 2;
        stmatrix_x4_trans(ds_panel + query * 128 + ((chunk ^ (query % 8)) * 16), dst[kc]);
      }
      hopper::fence_proxy_async();  // dS's generic-proxy writes before the wgmma (async proxy) reads them

      // dV += P^T dO and dK += dS^T Q: kStep / 16 k-steps of 16 query rows (MN-major B).
      hopper::wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < kTilesQ / 2; ++kc)
        Wgmma<D, kBf16>::rs(dv, pt[kc], hopper::sw128_descriptor(smem.dout(stage) + kc * 16 * 128, kStep * 128, 1024), 1);
#pragma unroll
      for (int kc = 0; kc < kTilesQ / 2; ++kc)
        Wgmma<D, kBf16>::rs(dk, dst[kc], hopper::sw128_descriptor(smem.q(stage) + kc * 16 * 128, kStep * 128, 1024), 1);
      hopper::wgmma_commit();

      // dQ's share: columns [c D/2, c D/2 + D/2) of dS K over the block's keys,
      // once both consumers' dS panels are written.
      hopper::named_barrier_sync(kPairBarrier, kConsumerThreads);
      hopper::wgmma_fence();  // dQ's registers were last read by the previous step's shared-memory stores
      float dq[kHalfD / 8][4];
      const int column0 = c * kHalfD;
      const std::uint32_t k_columns = smem.k() + (column0 / 64) * kKeys * 128 + (column0 % 64) * 2;
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk)
        Wgmma<kHalfD, kBf16>::ss_tb(
            dq, hopper::sw128_descriptor(smem.ds(n % 2) + (kk / 4) * kStep * 128 + (kk % 4) * 32, 16, 1024),
            hopper::sw128_descriptor(k_columns + kk * 16 * 128, kKeys * 128, 1024), kk > 0);
      hopper::wgmma_commit();

      hopper::wgmma_wait<1>();  // dV and dK done: Q, dO and the row information are free
      hopper::fence_operands(dv);
      hopper::fence_operands(dk);
      hopper::fence_operands(pt);
      hopper::fence_operands(dst);
      hopper::mbarrier_arrive(smem.empty(stage));

      // dQ's share to shared memory, once the writer warp has read the last one.
      hopper::wgmma_wait<0>();
      hopper::fence_operands(dq);
      hopper::mbarrier_wait(smem.dq_empty(), (n & 1) ^ 1);
      // Element pair (row, column0 + 8 j + 2 t) is in panel column0 / 32 + j / 4,
      // 16-byte chunk 2 (j % 4) + t / 2 of its 128-byte row, swizzled with
      // row % 8 = g: four chunk offsets a thread (the addresses, kept for
      // every j, put d = 128 past its registers).
      std::uint32_t chunk[4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) chunk[jj] = ((2 * jj + lane % 4 / 2) ^ (lane / 4)) * 16;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const std::uint32_t row = smem.dq() + column0 / 32 * kStep * 128 + (16 * warp + lane / 4 + 8 * r) * 128 +
                                  lane % 2 * 8;
#pragma unroll
        for (int j = 0; j < kHalfD / 8; ++j)
          hopper::store_shared_pair(row + j / 4 * kStep * 128 + chunk[j % 4], dq[j][2 * r], dq[j][2 * r + 1]);
      }
      hopper::fence_proxy_async();  // the writer's bulk reductions (async proxy) read it
      hopper::mbarrier_arrive(smem.dq_full());
    }
  }

  // dK = scale dK, dV: rows past the keys' sequence but inside the tensor get 0.
  T* dk_out = static_cast<T*>(args.dk) + b * a.k_batch_stride + hk * a.k_head_stride;
  T* dv_out = static_cast<T*>(args.dv) + b * a.v_batch_stride + hk * a.v_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = thread_key + 8 * r;
    if (key >= a.seqlen_kv) continue;
    const bool inside = key < lk;
#pragma unroll
    for (int j = 0; j < kTilesD; ++j) {
      const int column = 8 * j + lane % 4 * 2;
      const float scale = kFlaw == HopperBackwardFlaw::scale_missing_in_dk ? 1.0f : a.scale;
      const std::uint32_t k_pair = inside ? pack<T>(scale * dk[j][2 * r], scale * dk[j][2 * r + 1]) : 0u;
      const std::uint32_t v_pair = inside ? pack<T>(dv[j][2 * r], dv[j][2 * r + 1]) : 0u;
      *reinterpret_cast<std::uint32_t*>(dk_out + key * a.k_seq_stride + column) = k_pair;
      *reinterpret_cast<std::uint32_t*>(dv_out + key * a.v_seq_stride + column) = v_pair;
    }
  }
#else
  __trap();  // built for an architecture without wgmma and TMA: the launcher refuses before this
#endif
}

}  // namespace flashcheck::kernels::hopper_bwd
