// fa2-rowthread-bwd's kernels (included by backward/rowthread.cu and by its
// mutant, kernels/mutants/backward_mutants.cu). The file head of
// backward/rowthread.cu says what they are. The mma backward
// (backward/mma_kernel.cuh) reuses its forward, delta_kernel,
// dq_from_accumulator_kernel and keys_of_rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backward/backward_subject.hpp"
#include "common/attention.cuh"
#include "flashcheck/kernels/backward/rowthread.hpp"

namespace flashcheck::kernels {

/// Deliberate flaws, for the mutant; `none` is the real kernel.
enum class BackwardFlaw {
  none,
  atomic_dq,  // dQ accumulated with atomicAdd from the key-block kernel (order varies run to run)
};

namespace rowthread_bwd {

inline constexpr int kThreads = kRowthreadBackwardThreads;

/// Rows of a shared-memory tile at head dims up to kDim: two f32 tiles of
/// kTileRows x kDim fill 32 KiB (64 rows at d <= 64, 16 at d <= 256).
template <int kDim>
inline constexpr int kTileRows = 4096 / kDim;

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
// Round to nearest even, as the dtype's conversion on the host does.
__device__ __forceinline__ void store(float* p, float x) { *p = x; }
__device__ __forceinline__ void store(__half* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

template <typename T>
__device__ __forceinline__ const T* at(const void* base, int b, int h, std::int64_t batch_stride, std::int64_t head_stride) {
  return static_cast<const T*>(base) + b * batch_stride + h * head_stride;
}
template <typename T>
__device__ __forceinline__ T* at(void* base, int b, int h, std::int64_t batch_stride, std::int64_t head_stride) {
  return static_cast<T*>(base) + b * batch_stride + h * head_stride;
}

/// Keys any row of [first_row, last_row] sees: every mask's first and last
/// key grow with the row, so the union runs from the first row's first key to
/// the last row's last (clipped to the sequence).
__device__ __forceinline__ KeyRange keys_of_rows(const gpu::AttentionArgs& a, int first_row, int last_row, int lq, int lk) {
  return {max(visible_keys(a, first_row, lq, lk).first, 0), min(visible_keys(a, last_row, lq, lk).last, lk - 1)};
}

// ---------------------------------------------------------------------------
// The forward (Subject::run): a thread per query row, FlashAttention-2's loop
// order (fp32/fa2_rowthread's, on any dtype and d <= 256): K/V tiles in shared
// memory, the row's output unnormalised in f32 until the end, LSE = m + log l.
template <typename T, int kDim>
__global__ void __launch_bounds__(kThreads) forward_kernel(const gpu::AttentionArgs a) {
  constexpr int kKeys = kTileRows<kDim>;
  __shared__ float k_tile[kKeys][kDim];
  __shared__ float v_tile[kKeys][kDim];
  const int pair = head_pair();
  if (pair >= a.batch * a.heads_q) return;  // the last grid slice's tail (block-uniform)
  const int b = pair / a.heads_q, h = pair % a.heads_q, hk = h / (a.heads_q / a.heads_kv);
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int row_begin = blockIdx.x * kThreads;
  if (row_begin >= lq) return;  // the whole block is padding (uniform: safe before barriers)
  const int i = row_begin + threadIdx.x;
  const bool active = i < lq;
  const T* q = at<T>(a.q, b, h, a.q_batch_stride, a.q_head_stride);
  const T* k = at<T>(a.k, b, hk, a.k_batch_stride, a.k_head_stride);
  const T* v = at<T>(a.v, b, hk, a.v_batch_stride, a.v_head_stride);
  T* o = at<T>(a.o, b, h, a.o_batch_stride, a.o_head_stride);
  const KeyRange range = visible_keys(a, active ? i : row_begin, lq, lk);
  const KeyRange block = keys_of_rows(a, row_begin, min(row_begin + kThreads, lq) - 1, lq, lk);

  float q_row[kDim], o_row[kDim];
  for (int c = 0; c < a.head_dim; ++c) q_row[c] = active ? load(q + i * a.q_seq_stride + c) : 0.0f;
  for (int c = 0; c < a.head_dim_v; ++c) o_row[c] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;
  bool saw_key = false;
  for (int tile = block.first / kKeys * kKeys; tile <= block.last; tile += kKeys) {
    for (int n = threadIdx.x; n < kKeys * kDim; n += kThreads) {
      const int j = tile + n / kDim, c = n % kDim;
      k_tile[n / kDim][c] = j < lk && c < a.head_dim ? load(k + j * a.k_seq_stride + c) : 0.0f;
      v_tile[n / kDim][c] = j < lk && c < a.head_dim_v ? load(v + j * a.v_seq_stride + c) : 0.0f;
    }
    __syncthreads();
    if (active) {
      float logits[kKeys];
      float tile_max = -INFINITY;
      bool tile_seen = false, tile_nan = false;
      for (int n = 0; n < kKeys; ++n) {
        if (!sees(range, tile + n)) continue;
        float dot = 0.0f;
        for (int c = 0; c < a.head_dim; ++c) dot += q_row[c] * k_tile[n][c];
        logits[n] = dot * a.scale;
        tile_seen = true;
        if (isnan(logits[n])) tile_nan = true;
        else tile_max = fmaxf(tile_max, logits[n]);
      }
      if (tile_seen) {
        const float grown = tile_nan || isnan(running_max) ? quiet_nan() : fmaxf(running_max, tile_max);
        // While every logit seen is -inf, subtract 0: such keys weigh 0, not NaN.
        const float subtrahend = grown == -INFINITY ? 0.0f : grown;
        const float correction = saw_key ? expf(running_max - subtrahend) : 0.0f;
        running_sum *= correction;
        for (int c = 0; c < a.head_dim_v; ++c) o_row[c] *= correction;
        for (int n = 0; n < kKeys; ++n) {
          if (!sees(range, tile + n)) continue;  // masked keys are absent, never weighted by 0
          const float weight = expf(logits[n] - subtrahend);
          running_sum += weight;
          for (int c = 0; c < a.head_dim_v; ++c) o_row[c] += weight * v_tile[n][c];
        }
        running_max = grown;
        saw_key = true;
      }
    }
    __syncthreads();  // the next tile overwrites k_tile/v_tile
  }
  if (!active) return;
  T* out = o + i * a.o_seq_stride;
  float lse;
  if (!saw_key) {  // fully masked: O = 0, LSE = -inf
    for (int c = 0; c < a.head_dim_v; ++c) store(out + c, 0.0f);
    lse = -INFINITY;
  } else if (running_max == -INFINITY) {  // every visible logit -inf: the plain formula's 0/0
    for (int c = 0; c < a.head_dim_v; ++c) store(out + c, quiet_nan());
    lse = quiet_nan();
  } else {
    const float inverse = 1.0f / running_sum;
    for (int c = 0; c < a.head_dim_v; ++c) store(out + c, o_row[c] * inverse);
    lse = running_max + logf(running_sum);
  }
  if (a.lse) a.lse[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] = lse;
}

// ---------------------------------------------------------------------------
// Backward step 1: D_i = rowsum(dO_i o O_i) in f32, a thread per query row
// (every row of the padded shape: 0 past the sequence).
template <typename T>
__global__ void __launch_bounds__(kThreads) delta_kernel(const BackwardArgs args) {
  const gpu::AttentionArgs& a = args.attention;
  const int pair = head_pair();
  if (pair >= a.batch * a.heads_q) return;  // the last grid slice's tail (block-uniform)
  const int b = pair / a.heads_q, h = pair % a.heads_q;
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= a.seqlen_q) return;
  float sum = 0.0f;
  if (i < query_length(a, b)) {
    const T* dout = at<T>(args.dout, b, h, a.o_batch_stride, a.o_head_stride) + i * a.o_seq_stride;
    const T* o = at<T>(a.o, b, h, a.o_batch_stride, a.o_head_stride) + i * a.o_seq_stride;
    for (int c = 0; c < a.head_dim_v; ++c) sum += load(dout + c) * load(o + c);
  }
  args.delta[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] = sum;
}

// ---------------------------------------------------------------------------
// Backward step 2: dK and dV, a thread per key row j of a block of keys of one
// (batch, K/V head). The thread owns its rows of dK and dV: it walks the query
// rows of every query head of the GQA group, tile by tile (Q, dO, LSE and D_i
// of the tile in shared memory), recomputes P_ij = exp(S_ij scale - LSE_i)
// where i sees j, and accumulates dV_j += P_ij dO_i and
// dK_j += dS_ij Q_i with dS_ij = P_ij (dO_i . V_j - D_i); dK = scale dK at
// the end. Query tiles that no row sees a key of the block through are skipped.
// With BackwardFlaw::atomic_dq it also adds scale dS_ij K_j to an f32 dQ with
// atomicAdd (each warp's sum first, in a fixed order; the warps' and blocks'
// adds in whatever order they arrive).
template <typename T, int kDim, BackwardFlaw kFlaw>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const BackwardArgs args) {
  constexpr int kRows = kTileRows<kDim>;
  __shared__ float q_tile[kRows][kDim];
  __shared__ float do_tile[kRows][kDim];
  __shared__ float lse_tile[kRows], delta_tile[kRows];
  const gpu::AttentionArgs& a = args.attention;
  const int pair = head_pair();
  if (pair >= a.batch * a.heads_kv) return;  // the last grid slice's tail (block-uniform)
  const int b = pair / a.heads_kv, hk = pair % a.heads_kv, group = a.heads_q / a.heads_kv;
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int key_begin = blockIdx.x * kThreads;
  const int j = key_begin + threadIdx.x;
  const bool active = j < lk;
  T* dk = at<T>(args.dk, b, hk, a.k_batch_stride, a.k_head_stride);
  T* dv = at<T>(args.dv, b, hk, a.v_batch_stride, a.v_head_stride);
  if (key_begin >= lk) {  // the whole block is padding: dK = dV = 0 (uniform)
    if (j < a.seqlen_kv) {
      for (int c = 0; c < a.head_dim; ++c) store(dk + j * a.k_seq_stride + c, 0.0f);
      for (int c = 0; c < a.head_dim_v; ++c) store(dv + j * a.v_seq_stride + c, 0.0f);
    }
    return;
  }
  const int key_last = min(key_begin + kThreads, lk) - 1;
  const T* k = at<T>(a.k, b, hk, a.k_batch_stride, a.k_head_stride);
  const T* v = at<T>(a.v, b, hk, a.v_batch_stride, a.v_head_stride);

  float k_row[kDim], v_row[kDim], dk_row[kDim], dv_row[kDim];
  for (int c = 0; c < a.head_dim; ++c) {
    k_row[c] = active ? load(k + j * a.k_seq_stride + c) : 0.0f;
    dk_row[c] = 0.0f;
  }
  for (int c = 0; c < a.head_dim_v; ++c) {
    v_row[c] = active ? load(v + j * a.v_seq_stride + c) : 0.0f;
    dv_row[c] = 0.0f;
  }
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const T* q = at<T>(a.q, b, h, a.q_batch_stride, a.q_head_stride);
    const T* dout = at<T>(args.dout, b, h, a.o_batch_stride, a.o_head_stride);
    const float* lse = a.lse + (static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q;
    const float* delta = args.delta + (static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q;
    for (int i0 = 0; i0 < lq; i0 += kRows) {
      const int i_last = min(i0 + kRows, lq) - 1;
      const KeyRange seen = keys_of_rows(a, i0, i_last, lq, lk);
      if (seen.first > key_last || seen.last < key_begin) continue;  // uniform over the block
      for (int n = threadIdx.x; n < kRows * kDim; n += kThreads) {
        const int r = n / kDim, c = n % kDim, i = i0 + r;
        q_tile[r][c] = i < lq && c < a.head_dim ? load(q + i * a.q_seq_stride + c) : 0.0f;
        do_tile[r][c] = i < lq && c < a.head_dim_v ? load(dout + i * a.o_seq_stride + c) : 0.0f;
      }
      for (int r = threadIdx.x; r < kRows; r += kThreads) {
        lse_tile[r] = i0 + r < lq ? lse[i0 + r] : -INFINITY;
        delta_tile[r] = i0 + r < lq ? delta[i0 + r] : 0.0f;
      }
      __syncthreads();
      for (int r = 0; r <= i_last - i0; ++r) {  // uniform trip count: the mutant's warp sums need every lane
        const int i = i0 + r;
        const float row_lse = lse_tile[r];
        // Fully masked rows (LSE = -inf) have no gradient and add nothing.
        const bool contributes = active && row_lse != -INFINITY && sees(visible_keys(a, i, lq, lk), j);
        float dscore = 0.0f;
        if (contributes) {
          float dot = 0.0f;
          for (int c = 0; c < a.head_dim; ++c) dot += q_tile[r][c] * k_row[c];
          const float prob = expf(dot * a.scale - row_lse);
          float dprob = 0.0f;
          for (int c = 0; c < a.head_dim_v; ++c) {
            dv_row[c] += prob * do_tile[r][c];
            dprob += do_tile[r][c] * v_row[c];
          }
          dscore = prob * (dprob - delta_tile[r]);
          for (int c = 0; c < a.head_dim; ++c) dk_row[c] += dscore * q_tile[r][c];
        }
        if constexpr (kFlaw == BackwardFlaw::atomic_dq) {
          if (__any_sync(kFullWarp, contributes)) {
            float* dq_row = args.dq_accum + ((static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i) * a.head_dim;
            for (int c = 0; c < a.head_dim; ++c) {
              const float part = warp_sum(contributes ? dscore * k_row[c] : 0.0f);
              if (threadIdx.x % 32 == 0) atomicAdd(dq_row + c, part);
            }
          }
        }
      }
      __syncthreads();  // the next tile overwrites the shared tiles
    }
  }
  if (j >= a.seqlen_kv) return;
  // Keys past the sequence (a partial last block) write 0: their accumulators are.
  for (int c = 0; c < a.head_dim; ++c) store(dk + j * a.k_seq_stride + c, active ? a.scale * dk_row[c] : 0.0f);
  for (int c = 0; c < a.head_dim_v; ++c) store(dv + j * a.v_seq_stride + c, active ? dv_row[c] : 0.0f);
}

// ---------------------------------------------------------------------------
// Backward step 3: dQ, a thread per query row of a block of rows of one
// (batch, query head). The thread owns its row of dQ: it walks the keys the
// block sees, tile by tile (K and V in shared memory), recomputes P_ij and
// dS_ij as step 2 does, and accumulates dQ_i += dS_ij K_j; dQ = scale dQ at
// the end. No atomics, no reduction across threads: the sums run in key order.
template <typename T, int kDim>
__global__ void __launch_bounds__(kThreads) dq_kernel(const BackwardArgs args) {
  constexpr int kKeys = kTileRows<kDim>;
  __shared__ float k_tile[kKeys][kDim];
  __shared__ float v_tile[kKeys][kDim];
  const gpu::AttentionArgs& a = args.attention;
  const int pair = head_pair();
  if (pair >= a.batch * a.heads_q) return;  // the last grid slice's tail (block-uniform)
  const int b = pair / a.heads_q, h = pair % a.heads_q, hk = h / (a.heads_q / a.heads_kv);
  const int lq = query_length(a, b), lk = key_length(a, b);
  const int row_begin = blockIdx.x * kThreads;
  const int i = row_begin + threadIdx.x;
  const bool active = i < lq;
  T* dq = at<T>(args.dq, b, h, a.q_batch_stride, a.q_head_stride);
  if (row_begin >= lq) {  // the whole block is padding: dQ = 0 (uniform)
    if (i < a.seqlen_q)
      for (int c = 0; c < a.head_dim; ++c) store(dq + i * a.q_seq_stride + c, 0.0f);
    return;
  }
  const T* q = at<T>(a.q, b, h, a.q_batch_stride, a.q_head_stride);
  const T* dout = at<T>(args.dout, b, h, a.o_batch_stride, a.o_head_stride);
  const T* k = at<T>(a.k, b, hk, a.k_batch_stride, a.k_head_stride);
  const T* v = at<T>(a.v, b, hk, a.v_batch_stride, a.v_head_stride);
  const std::int64_t row_index = (static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i;
  const float row_lse = active ? a.lse[row_index] : -INFINITY;
  const float row_delta = active ? args.delta[row_index] : 0.0f;
  const bool has_gradient = active && row_lse != -INFINITY;  // fully masked rows: dQ = 0
  const KeyRange range = visible_keys(a, active ? i : row_begin, lq, lk);
  const KeyRange block = keys_of_rows(a, row_begin, min(row_begin + kThreads, lq) - 1, lq, lk);

  float q_row[kDim], do_row[kDim], dq_row[kDim];
  for (int c = 0; c < a.head_dim; ++c) {
    q_row[c] = active ? load(q + i * a.q_seq_stride + c) : 0.0f;
    dq_row[c] = 0.0f;
  }
  for (int c = 0; c < a.head_dim_v; ++c) do_row[c] = active ? load(dout + i * a.o_seq_stride + c) : 0.0f;
  for (int tile = block.first / kKeys * kKeys; tile <= block.last; tile += kKeys) {
    for (int n = threadIdx.x; n < kKeys * kDim; n += kThreads) {
      const int jj = tile + n / kDim, c = n % kDim;
      k_tile[n / kDim][c] = jj < lk && c < a.head_dim ? load(k + jj * a.k_seq_stride + c) : 0.0f;
      v_tile[n / kDim][c] = jj < lk && c < a.head_dim_v ? load(v + jj * a.v_seq_stride + c) : 0.0f;
    }
    __syncthreads();
    if (has_gradient)
      for (int n = 0; n < kKeys; ++n) {
        if (!sees(range, tile + n)) continue;  // masked keys are absent
        float dot = 0.0f;
        for (int c = 0; c < a.head_dim; ++c) dot += q_row[c] * k_tile[n][c];
        const float prob = expf(dot * a.scale - row_lse);
        float dprob = 0.0f;
        for (int c = 0; c < a.head_dim_v; ++c) dprob += do_row[c] * v_tile[n][c];
        const float dscore = prob * (dprob - row_delta);
        for (int c = 0; c < a.head_dim; ++c) dq_row[c] += dscore * k_tile[n][c];
      }
    __syncthreads();  // the next tile overwrites k_tile/v_tile
  }
  if (i >= a.seqlen_q) return;
  for (int c = 0; c < a.head_dim; ++c) store(dq + i * a.q_seq_stride + c, active ? a.scale * dq_row[c] : 0.0f);
}

// The last step of the atomic-dQ backwards (the mutant, and fa2-mma-bwd):
// dQ = scale x the f32 accumulator, in the dtype; 0 past the sequence.
template <typename T>
__global__ void __launch_bounds__(kThreads) dq_from_accumulator_kernel(const BackwardArgs args) {
  const gpu::AttentionArgs& a = args.attention;
  const int pair = head_pair();
  if (pair >= a.batch * a.heads_q) return;  // the last grid slice's tail (block-uniform)
  const int b = pair / a.heads_q, h = pair % a.heads_q;
  const int i = blockIdx.x * kThreads + threadIdx.x;
  if (i >= a.seqlen_q) return;
  const bool active = i < query_length(a, b);
  const float* accum = args.dq_accum + ((static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i) * a.head_dim;
  T* dq = at<T>(args.dq, b, h, a.q_batch_stride, a.q_head_stride) + i * a.q_seq_stride;
  for (int c = 0; c < a.head_dim; ++c) store(dq + c, active ? a.scale * accum[c] : 0.0f);
}

// ---------------------------------------------------------------------------
// Dispatch: the storage type, and the smallest of 64/128/256 that holds d and dv.
template <typename Go>
void with_instance(int dtype, int head_dim, int head_dim_v, Go&& go) {
  const int widest = head_dim > head_dim_v ? head_dim : head_dim_v;
  auto by_dim = [&]<typename T>() {
    if (widest <= 64) go.template operator()<T, 64>();
    else if (widest <= 128) go.template operator()<T, 128>();
    else go.template operator()<T, 256>();
  };
  if (dtype == static_cast<int>(DType::f16)) by_dim.template operator()<__half>();
  else if (dtype == static_cast<int>(DType::bf16)) by_dim.template operator()<__nv_bfloat16>();
  else by_dim.template operator()<float>();
}

inline unsigned blocks(int rows) { return static_cast<unsigned>((rows + kThreads - 1) / kThreads); }

}  // namespace rowthread_bwd

/// Enqueues the forward on args.stream; throws gpu::CudaError.
inline void launch_rowthread_forward(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  const dim3 grid = pair_grid(rowthread_bwd::blocks(a.seqlen_q), a.batch * a.heads_q);
  if (grid.x == 0 || grid.y == 0) return;
  rowthread_bwd::with_instance(a.dtype, a.head_dim, a.head_dim_v, [&]<typename T, int kDim>() {
    rowthread_bwd::forward_kernel<T, kDim><<<grid, rowthread_bwd::kThreads, 0, a.stream>>>(a);
  });
  gpu::check_launch("rowthread_bwd::forward_kernel", site);
}

/// Enqueues the backward (D_i, then dK/dV, then dQ) on the stream; throws gpu::CudaError.
template <BackwardFlaw kFlaw>
void launch_rowthread_backward(const BackwardArgs& args, const gpu::CallSite& site) {
  using namespace rowthread_bwd;
  const gpu::AttentionArgs& a = args.attention;
  const dim3 query_grid = pair_grid(blocks(a.seqlen_q), a.batch * a.heads_q);
  const dim3 key_grid = pair_grid(blocks(a.seqlen_kv), a.batch * a.heads_kv);
  with_instance(a.dtype, a.head_dim, a.head_dim_v, [&]<typename T, int kDim>() {
    if (query_grid.x > 0 && query_grid.y > 0) {
      delta_kernel<T><<<query_grid, kThreads, 0, a.stream>>>(args);
      gpu::check_launch("rowthread_bwd::delta_kernel", site);
    }
    if (key_grid.x > 0 && key_grid.y > 0) {
      dkdv_kernel<T, kDim, kFlaw><<<key_grid, kThreads, 0, a.stream>>>(args);
      gpu::check_launch("rowthread_bwd::dkdv_kernel", site);
    }
    if (query_grid.x > 0 && query_grid.y > 0) {
      if constexpr (kFlaw == BackwardFlaw::atomic_dq) dq_from_accumulator_kernel<T><<<query_grid, kThreads, 0, a.stream>>>(args);
      else dq_kernel<T, kDim><<<query_grid, kThreads, 0, a.stream>>>(args);
      gpu::check_launch("rowthread_bwd::dq_kernel", site);
    }
  });
}

}  // namespace flashcheck::kernels
