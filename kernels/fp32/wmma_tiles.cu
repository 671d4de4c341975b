// wmma_tiles: FlashAttention-2 order on tensor cores through WMMA (m16n16k16,
// f16 inputs, f32 accumulators); f32 in and out, f16 inside.
//
// Lineage: article 000's "v3" kernel. What changes from fa2_rowthread: both
// products run on tensor cores. Q, K and V tiles are converted f32 -> f16 while
// they are staged into shared memory; S = Q K^T accumulates over d in chunks of
// 16 in f32 fragments, is scaled and stored to shared memory as f32 for an
// online softmax in f32 (row max, sum and rescale factor), and P goes back as
// f16 into O += P V, whose accumulators stay in registers for the whole key
// loop; O / l and LSE = m + log(l) are written in f32 at the end. What changes
// from the article: a warp owns 16 query rows for the whole key loop (the
// article splits S tiles over warps and round-trips O through global memory
// after every key tile), so rescaling O is a per-row multiply of register
// fragments; masks, tails, GQA, padded batches, LSE and NaN semantics are
// added. Why: the tensor-core step before fragment-level (mma.sync) kernels.
// Tiles: 4 warps x 16 query rows = 64 rows per block, 32 keys per K/V tile.
// Key tiles no row of the block sees are skipped, a warp skips the tiles none
// of its rows sees, and only boundary tiles test the mask per element.
// Non-finite values: a V tile holding Inf/NaN (in f16, so also |v| > 65504)
// is staged with those entries zeroed and they are added back, for visible
// keys only, by a scalar pass; so a masked key's Inf is never multiplied by
// its zero weight (0 * Inf = NaN).
// Domain: f32 storage, f16 compute (compute_dtype = f16); d = dv, a multiple of
// 16 in 16..128; any seqlen_q/seqlen_kv (zero-padded tails, padded keys masked);
// none/causal_tl/causal_br/window masks; GQA/MQA; padded batches; LSE; BHSD and
// BSHD; sm_80+. Inputs beyond f16's range become +-Inf, as in f16 attention.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10):
//   f32 B=4 H=16 N=M=1024 d=64: 0.582 ms, 29.53 TFLOP/s; causal_br 0.382 ms, 22.51 TFLOP/s
//   f32 B=2 H=16 N=M=2048 d=128: 1.550 ms, 44.33 TFLOP/s
//   decode f32 B=16 Hq=32 Hkv=8 Sq=1 Skv=8192 d=128: 3.691 ms
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "common/attention.cuh"

namespace flashcheck::kernels {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 16;                 // query rows per warp: one WMMA tile high
constexpr int kBlockRows = kWarps * kWarpRows;  // 64 query rows per block
constexpr int kKeys = 32;                     // keys per K/V tile: two 16-key WMMA tiles
constexpr int kMaxHeadDim = 128;
constexpr int kMaxChunks = kMaxHeadDim / 16;  // O accumulator fragments per warp
constexpr int kHalfPad = 8;                   // halves of padding per shared row (16 bytes: fewer bank conflicts)
constexpr int kScoreLd = kKeys + 4;           // floats per row of a warp's score tile
constexpr int kProbLd = kKeys + kHalfPad;     // halves per row of a warp's weight tile
constexpr int kFixupLd = kProbLd / 2;         // floats per row of an O fragment staged in that space
static_assert(kFixupLd % 4 == 0, "WMMA float tiles need a leading dimension of 16 bytes");
static_assert(kWarpRows * 2 == 32, "the softmax gives each query row of a warp a pair of lanes");
static_assert(kKeys == 32, "a row's visible keys in a tile are one 32-bit mask, 16 keys per lane of a pair");
static_assert(kMaxHeadDim % 16 == 0, "head dims are whole WMMA tiles");

constexpr Capabilities kCapabilities = {
    .dtypes = {DType::f32},
    .head_dims = {16, 32, 48, 64, 80, 96, 112, 128},
    .max_head_dim = kMaxHeadDim,
    .max_head_dim_v = kMaxHeadDim,
    .head_dim_v_equal = true,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .tile_q = kBlockRows,
    .tile_kv = kKeys,
    .needs_gpu = true,
    .min_compute_capability = 80,
    .compute_dtype = DType::f16,
};

using FragQ = wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major>;
using FragP = FragQ;
// K^T as the B operand: row-major K [keys][d] read as column-major [d][keys].
using FragKt = wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major>;
using FragV = wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
// Each of the 256 accumulator elements lives in exactly one lane: the per-row
// rescale and the output write below touch each element once.
static_assert(FragAcc::num_elements * 32 == 16 * 16, "accumulator elements must not be replicated across lanes");

/// Byte offsets of the dynamic shared memory regions (each 128-byte aligned).
struct SharedLayout {
  int q_tile, k_tile, v_tile, scores, probs, row_scalar, row_bits, bytes;
  int q_ld, k_ld, v_ld;  // halves per row

  __host__ __device__ SharedLayout(int head_dim, int head_dim_v) {
    auto align = [](int offset) { return (offset + 127) / 128 * 128; };
    q_ld = head_dim + kHalfPad;
    k_ld = head_dim + kHalfPad;
    v_ld = head_dim_v + kHalfPad;
    q_tile = 0;
    k_tile = align(q_tile + kBlockRows * q_ld * 2);
    v_tile = align(k_tile + kKeys * k_ld * 2);
    scores = align(v_tile + kKeys * v_ld * 2);
    probs = align(scores + kWarps * kWarpRows * kScoreLd * 4);
    row_scalar = align(probs + kWarps * kWarpRows * kProbLd * 2);
    row_bits = align(row_scalar + kWarps * kWarpRows * 4);
    bytes = align(row_bits + kWarps * kWarpRows * 4);
  }
};

__device__ __forceinline__ bool half_is_finite(half x) { return (__half_as_ushort(x) & 0x7c00u) != 0x7c00u; }

// Converts 4 floats to halves at `to` (8-byte aligned).
__device__ __forceinline__ void store_halves(half* to, float4 x) {
  reinterpret_cast<__half2*>(to)[0] = __floats2half2_rn(x.x, x.y);
  reinterpret_cast<__half2*>(to)[1] = __floats2half2_rn(x.z, x.w);
}

// Converts 4 floats to halves at `to`, zeroing the non-finite ones; true if there was one.
__device__ __forceinline__ bool store_finite_halves(half* to, float4 x) {
  half h[4] = {__float2half_rn(x.x), __float2half_rn(x.y), __float2half_rn(x.z), __float2half_rn(x.w)};
  bool nonfinite = false;
  for (half& value : h)
    if (!half_is_finite(value)) {
      value = __float2half_rn(0.0f);
      nonfinite = true;
    }
  reinterpret_cast<__half2*>(to)[0] = __halves2half2(h[0], h[1]);
  reinterpret_cast<__half2*>(to)[1] = __halves2half2(h[2], h[3]);
  return nonfinite;
}

// grid: x = 64-row query tile, y = batch * heads_q (from bh_offset); block: 4 warps.
// Three blocks per SM caps registers at 168, what the kernel needs without
// spilling (left free, ptxas for sm_90a settles on 128 and spills).
__global__ void __launch_bounds__(kThreads, 3) wmma_tiles_kernel(const gpu::AttentionArgs a, int bh_offset) {
  extern __shared__ __align__(128) unsigned char shared[];
  const int bh = bh_offset + blockIdx.y, b = bh / a.heads_q, h = bh % a.heads_q, hk = h / (a.heads_q / a.heads_kv);
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int row_begin = blockIdx.x * kBlockRows;
  if (row_begin >= lq) return;  // uniform across the block: safe before any barrier
  const int d = a.head_dim, dv = a.head_dim_v, d_chunks = d / 16, dv_chunks = dv / 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const SharedLayout layout(d, dv);
  half* q_tile = reinterpret_cast<half*>(shared + layout.q_tile);  // [64][q_ld]
  half* k_tile = reinterpret_cast<half*>(shared + layout.k_tile);  // [32][k_ld]
  half* v_tile = reinterpret_cast<half*>(shared + layout.v_tile);  // [32][v_ld]
  // Per warp: S then the f32 weights [16][kScoreLd], the f16 weights [16][kProbLd],
  // a float and a 32-bit word per row.
  float* warp_scores = reinterpret_cast<float*>(shared + layout.scores) + warp * kWarpRows * kScoreLd;
  half* warp_probs = reinterpret_cast<half*>(shared + layout.probs) + warp * kWarpRows * kProbLd;
  float* row_scalar = reinterpret_cast<float*>(shared + layout.row_scalar) + warp * kWarpRows;
  unsigned* row_bits = reinterpret_cast<unsigned*>(shared + layout.row_bits) + warp * kWarpRows;

  const float* q = static_cast<const float*>(a.q) + b * a.q_batch_stride + h * a.q_head_stride;
  const float* k = static_cast<const float*>(a.k) + b * a.k_batch_stride + hk * a.k_head_stride;
  const float* v = static_cast<const float*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;
  float* o = static_cast<float*>(a.o) + b * a.o_batch_stride + h * a.o_head_stride;

  // Which (row, column) each accumulator element holds: WMMA leaves the mapping
  // unspecified, so load a tile holding row * 16 + column and read it back.
  int element_cell[FragAcc::num_elements];
  {
    for (int n = lane; n < 16 * 16; n += 32) warp_scores[n / 16 * kScoreLd + n % 16] = static_cast<float>(n);
    __syncwarp();
    FragAcc probe;
    wmma::load_matrix_sync(probe, warp_scores, kScoreLd, wmma::mem_row_major);
#pragma unroll
    for (int e = 0; e < FragAcc::num_elements; ++e) element_cell[e] = static_cast<int>(probe.x[e]);
    __syncwarp();
  }

  // Q tile, rows past the sequence zero (their outputs are never written).
  // Rows are 16-float multiples (d % 16 == 0), so float4 loads are aligned.
  for (int n = threadIdx.x; n < kBlockRows * (d / 4); n += kThreads) {
    const int r = n / (d / 4), c = n % (d / 4) * 4, i = row_begin + r;
    const float4 x = i < lq ? *reinterpret_cast<const float4*>(q + i * a.q_seq_stride + c) : make_float4(0, 0, 0, 0);
    store_halves(q_tile + r * layout.q_ld + c, x);
  }

  // This lane's share of the softmax: row lane / 2 of the warp, keys
  // (lane % 2) * 16 .. + 15 of each tile. Lane pairs hold the same row state.
  const int warp_row0 = row_begin + warp * kWarpRows;
  const int warp_rows = max(0, min(kWarpRows, lq - warp_row0));  // valid rows of this warp
  const int my_row = lane / 2, my_keys = lane % 2 * 16;
  const KeyRange my_range = my_row < warp_rows ? visible_keys(a, warp_row0 + my_row, lq, lk) : KeyRange{0, -1};
  float running_max = -INFINITY, running_sum = 0.0f;
  bool saw_key = false;

  // Key ranges grow with the row, so the keys some row sees run from the first
  // row's first key to the last valid row's last (per block and per warp).
  const KeyRange block_first_row = visible_keys(a, row_begin, lq, lk);
  const KeyRange block_last_row = visible_keys(a, min(row_begin + kBlockRows, lq) - 1, lq, lk);
  KeyRange warp_first_row{0, -1}, warp_last_row{0, -1};
  if (warp_rows > 0) {
    warp_first_row = visible_keys(a, warp_row0, lq, lk);
    warp_last_row = visible_keys(a, warp_row0 + warp_rows - 1, lq, lk);
  }

  FragAcc o_acc[kMaxChunks];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) wmma::fill_fragment(o_acc[c], 0.0f);

  for (int tile = block_first_row.first / kKeys * kKeys; tile <= block_last_row.last; tile += kKeys) {
    // Stage K and V (keys past the sequence zero). Non-finite V entries are
    // zeroed here and added back for visible keys only (see the header).
    for (int n = threadIdx.x; n < kKeys * (d / 4); n += kThreads) {
      const int r = n / (d / 4), c = n % (d / 4) * 4, j = tile + r;
      const float4 x = j < lk ? *reinterpret_cast<const float4*>(k + j * a.k_seq_stride + c) : make_float4(0, 0, 0, 0);
      store_halves(k_tile + r * layout.k_ld + c, x);
    }
    bool v_nonfinite = false;
    for (int n = threadIdx.x; n < kKeys * (dv / 4); n += kThreads) {
      const int r = n / (dv / 4), c = n % (dv / 4) * 4, j = tile + r;
      const float4 x = j < lk ? *reinterpret_cast<const float4*>(v + j * a.v_seq_stride + c) : make_float4(0, 0, 0, 0);
      v_nonfinite |= store_finite_halves(v_tile + r * layout.v_ld + c, x);
    }
    const bool tile_v_nonfinite = __syncthreads_or(v_nonfinite);  // also the barrier after staging

    const bool warp_sees_tile = warp_rows > 0 && tile <= warp_last_row.last && tile + kKeys - 1 >= warp_first_row.first;
    if (warp_sees_tile) {
      // Every row of the warp sees every key of the tile: no per-element mask.
      const bool interior =
          warp_rows == kWarpRows && warp_last_row.first <= tile && warp_first_row.last >= tile + kKeys - 1;

      // S = scale * Q K^T for 16 rows x 32 keys, accumulated over d in chunks of 16.
#pragma unroll 1  // unrolled, the two S fragments' loads overlap and spill
      for (int key_block = 0; key_block < kKeys / 16; ++key_block) {
        FragAcc s;
        wmma::fill_fragment(s, 0.0f);
        for (int chunk = 0; chunk < d_chunks; ++chunk) {
          FragQ q_frag;
          FragKt k_frag;
          wmma::load_matrix_sync(q_frag, q_tile + warp * kWarpRows * layout.q_ld + chunk * 16, layout.q_ld);
          wmma::load_matrix_sync(k_frag, k_tile + key_block * 16 * layout.k_ld + chunk * 16, layout.k_ld);
          wmma::mma_sync(s, q_frag, k_frag, s);
        }
#pragma unroll
        for (int e = 0; e < FragAcc::num_elements; ++e) s.x[e] *= a.scale;
        wmma::store_matrix_sync(warp_scores + key_block * 16, s, kScoreLd, wmma::mem_row_major);
      }
      __syncwarp();

      // Online softmax in f32 over this lane's 16 keys, merged with the partner lane's.
      float* score_row = warp_scores + my_row * kScoreLd + my_keys;
      float tile_max = -INFINITY;
      bool tile_seen = false, tile_nan = false;
      unsigned visible_bits = 0;
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        if (!interior && !sees(my_range, tile + my_keys + n)) continue;
        const float logit = score_row[n];
        visible_bits |= 1u << (my_keys + n);
        tile_seen = true;
        if (isnan(logit)) tile_nan = true;
        else tile_max = fmaxf(tile_max, logit);
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_seen = __shfl_xor_sync(0xffffffffu, static_cast<int>(tile_seen), 1) || tile_seen;
      tile_nan = __shfl_xor_sync(0xffffffffu, static_cast<int>(tile_nan), 1) || tile_nan;
      visible_bits |= __shfl_xor_sync(0xffffffffu, visible_bits, 1);

      float correction = 1.0f, subtrahend = 0.0f, grown = running_max;
      if (tile_seen) {
        grown = tile_nan || isnan(running_max) ? quiet_nan() : fmaxf(running_max, tile_max);
        // While every logit seen is -inf, subtract 0: such keys weigh 0, not NaN.
        subtrahend = grown == -INFINITY ? 0.0f : grown;
        correction = saw_key ? __expf(running_max - subtrahend) : 0.0f;
      }
      half* prob_row = warp_probs + my_row * kProbLd + my_keys;
      float tile_sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        // Masked and padded keys weigh exactly 0 (their V entries are finite here).
        const float weight = visible_bits >> (my_keys + n) & 1u ? __expf(score_row[n] - subtrahend) : 0.0f;
        score_row[n] = weight;  // kept in f32 for the non-finite V pass
        prob_row[n] = __float2half_rn(weight);
        tile_sum += weight;
      }
      tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);  // x + y in both lanes: identical
      if (tile_seen) {
        running_sum = running_sum * correction + tile_sum;
        running_max = grown;
        saw_key = true;
      }
      if (lane % 2 == 0) {
        row_scalar[my_row] = correction;
        row_bits[my_row] = visible_bits;
      }
      __syncwarp();

      // O = O * correction (per row) + P V.
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        if (c >= dv_chunks) break;
#pragma unroll
        for (int e = 0; e < FragAcc::num_elements; ++e) o_acc[c].x[e] *= row_scalar[element_cell[e] / 16];
      }
#pragma unroll
      for (int key_block = 0; key_block < kKeys / 16; ++key_block) {
        FragP p_frag;
        wmma::load_matrix_sync(p_frag, warp_probs + key_block * 16, kProbLd);
#pragma unroll
        for (int c = 0; c < kMaxChunks; ++c) {
          if (c >= dv_chunks) break;
          FragV v_frag;
          wmma::load_matrix_sync(v_frag, v_tile + key_block * 16 * layout.v_ld + c * 16, layout.v_ld);
          wmma::mma_sync(o_acc[c], p_frag, v_frag, o_acc[c]);
        }
      }

      // Rare: add the zeroed non-finite V entries of visible keys, weighted in
      // f32 (a visible key of weight 0 gives 0 * Inf = NaN, as in the formula).
      // Each O fragment goes through shared memory (the f16 weights' space, now
      // free) so that lanes can address it by row and column.
      if (tile_v_nonfinite) {
        float* fixup = reinterpret_cast<float*>(warp_probs);  // [16][kFixupLd]
#pragma unroll
        for (int c = 0; c < kMaxChunks; ++c) {
          if (c >= dv_chunks) break;
          __syncwarp();
          wmma::store_matrix_sync(fixup, o_acc[c], kFixupLd, wmma::mem_row_major);
          __syncwarp();
          for (int cell = lane; cell < 16 * 16; cell += 32) {
            const int r = cell / 16, column = c * 16 + cell % 16;
            const unsigned visible = row_bits[r];
            for (int n = 0; n < kKeys; ++n) {
              if (!(visible >> n & 1u)) continue;
              const float value = __half2float(__float2half_rn(v[(tile + n) * a.v_seq_stride + column]));
              if (!isfinite(value)) fixup[r * kFixupLd + cell % 16] += warp_scores[r * kScoreLd + n] * value;
            }
          }
          __syncwarp();
          wmma::load_matrix_sync(o_acc[c], fixup, kFixupLd, wmma::mem_row_major);
        }
        __syncwarp();  // the next tile's weights overwrite the fixup space
      }
    }
    __syncthreads();  // the next tile overwrites k_tile and v_tile
  }

  if (warp_rows == 0) return;
  // Per-row epilogue: fully masked rows give O = 0 and LSE = -inf; rows whose
  // visible logits are all -inf give NaN (the plain formula's 0/0).
  const bool my_row_valid = my_row < warp_rows;
  enum : unsigned { kZeroRow, kNanRow, kDivideRow };
  const unsigned row_kind = !saw_key ? kZeroRow : running_max == -INFINITY ? kNanRow : kDivideRow;
  if (lane % 2 == 0) {
    row_scalar[my_row] = running_sum;
    row_bits[my_row] = row_kind;
    if (my_row_valid && a.lse) {
      const float lse = row_kind == kZeroRow  ? -INFINITY
                        : row_kind == kNanRow ? quiet_nan()
                                              : running_max + logf(running_sum);
      a.lse[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + warp_row0 + my_row] = lse;
    }
  }
  __syncwarp();
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    if (c >= dv_chunks) break;
#pragma unroll
    for (int e = 0; e < FragAcc::num_elements; ++e) {
      const int r = element_cell[e] / 16, column = c * 16 + element_cell[e] % 16;
      if (r >= warp_rows) continue;
      const unsigned kind = row_bits[r];
      const float value = kind == kZeroRow ? 0.0f : kind == kNanRow ? quiet_nan() : o_acc[c].x[e] / row_scalar[r];
      o[(warp_row0 + r) * a.o_seq_stride + column] = value;
    }
  }
}

void launch_wmma_tiles(const gpu::AttentionArgs& args, const gpu::CallSite& site) {
  const int row_tiles = (args.seqlen_q + kBlockRows - 1) / kBlockRows;
  const int heads = args.batch * args.heads_q;
  if (row_tiles == 0 || heads == 0) return;
  const SharedLayout layout(args.head_dim, args.head_dim_v);
  gpu::check(cudaFuncSetAttribute(wmma_tiles_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, layout.bytes),
             "cudaFuncSetAttribute (dynamic shared memory)", site);
  constexpr int kMaxGridY = 65535;
  for (int bh_offset = 0; bh_offset < heads; bh_offset += kMaxGridY) {
    const dim3 grid(row_tiles, std::min(kMaxGridY, heads - bh_offset));
    wmma_tiles_kernel<<<grid, kThreads, layout.bytes, args.stream>>>(args, bh_offset);
    gpu::check_launch("wmma_tiles_kernel", site);
  }
}

gpu::KernelRegistration registration("wmma-tiles",
                                      "FlashAttention-2 order on WMMA tensor cores, f16 operands, f32 softmax and accumulators (f32 in/out)",
                                      kCapabilities, launch_wmma_tiles);

}  // namespace
}  // namespace flashcheck::kernels
