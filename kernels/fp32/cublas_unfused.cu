// cublas_unfused: unfused attention, S = Q K^T and O = P V in cuBLAS SGEMM around a
// three-pass masked softmax.
//
// Lineage: article 000's cuBLAS baseline (section 2). What changes from it: the
// softmax applies the mask (masked keys get weight exactly 0; a row that sees
// no key gets all-zero weights and LSE = -inf), propagates NaN like the plain
// formula (NaN-aware max, no epsilon in the sum), writes LSE, and the GEMMs take
// GQA, padded batches and both layouts through leading dimensions and batch
// strides instead of assuming one contiguous [b*h, N, d] block. Why: it is the
// unfused reference point the fused kernels are timed against, so it must be
// correct on the same domain. The softmax uses expf/logf (not __expf) because
// the f32 baseline of the tolerance rule is plain f32 attention.
// Domain: f32 storage and arithmetic; d in 1..256, dv in 1..256; any
// seqlen_q/seqlen_kv; none/causal_tl/causal_br/window masks; GQA/MQA; padded
// batches; LSE; BHSD and BSHD; sm_80+.
// Domain: finite inputs only (see known_deviations): P V is a GEMM over every
// key, so a masked key's zero weight meets its V value, and 0 * Inf = NaN.
// Declared with nonfinite_inputs = false.
// Handle: created on the first launch, under a lock, into a local that is kept
// only once it is configured (a failed creation's output is never used). A
// creation that fails (ALLOC_FAILED or NOT_INITIALIZED while other processes
// create their contexts and handles at once: issue 20's one-off failure 1.88 s
// into `ctest -L gpu -j 8`) is tried again, up to kCreationAttempts times; the
// failed attempts, with cuBLAS's status, the pending CUDA error and the free
// device memory, go into the error when all fail and into stats() when a later
// one succeeds. cuBLAS itself is loaded on the first creation
// (core/gpu/cublas.hpp), not when the process starts.
// Speed (H200, 2026-11-21, scripts/gpu-check: CUDA events, median of 10):
//   f32 B=4 H=16 N=M=1024 d=64: 1.184 ms, 14.51 TFLOP/s; causal_br 1.076 ms, 7.99 TFLOP/s
//   f32 B=2 H=16 N=M=2048 d=128: 2.580 ms, 26.64 TFLOP/s
//   decode f32 B=16 Hq=32 Hkv=8 Sq=1 Skv=8192 d=128: 3.378 ms
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/attention.cuh"
#include "flashcheck/core/gpu/cublas.hpp"
#include "flashcheck/kernels/fp32/cublas_unfused.hpp"

namespace flashcheck::kernels {
namespace {

testing::CublasCreate cublas_create = nullptr;  // nullptr: cuBLAS's own (gpu::cublas().create)

constexpr int kSoftmaxThreads = 128;  // one block per score row
static_assert(kSoftmaxThreads % 32 == 0 && kSoftmaxThreads <= 32 * 32, "block_reduce combines whole warps in one step");

constexpr Capabilities kCapabilities = {
    .dtypes = {DType::f32},
    .min_head_dim = 1,
    .max_head_dim = 256,
    .max_head_dim_v = 256,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .nonfinite_inputs = false,
    // Not a tiled kernel: the softmax block strides over a row kSoftmaxThreads
    // keys at a time, which is where its edge cases are.
    .tile_kv = kSoftmaxThreads,
    .needs_gpu = true,
    .min_compute_capability = 80,
    .known_deviations = "masked keys with non-finite values poison the GEMM (0*Inf)",
};

constexpr int kCreationAttempts = 4;
constexpr int kCreationBackoffMs = 50;  // times the attempt number: 50, 100, 150 ms between attempts

/// A failed cuBLAS call in words: the call, cuBLAS's status (name and text),
/// the CUDA error pending after it, if any (a non-sticky one is cleared; a
/// sticky one is thrown as gpu::CudaError, since it poisons the context), and
/// the device's free memory.
std::string describe_cublas_failure(cublasStatus_t status, const char* call, const gpu::CallSite& site) {
  std::string text = std::string(call) + " failed: " + gpu::cublas().status_name(status) + " (" +
                     gpu::cublas().status_string(status) + ")";
  const cudaError_t pending = cudaGetLastError();
  if (gpu::is_sticky(pending)) gpu::check(pending, call, site);
  if (pending != cudaSuccess)
    text += std::string("; pending CUDA error ") + cudaGetErrorName(pending) + " (" + cudaGetErrorString(pending) + ")";
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess)
    text += "; device memory free " + std::to_string(free_bytes >> 20) + " MiB of " + std::to_string(total_bytes >> 20) +
            " MiB";
  else
    cudaGetLastError();
  return text;
}

/// Throws gpu::CudaError naming the cuBLAS status, the pending CUDA error, the
/// call, the kernel and the problem.
void check_cublas(cublasStatus_t status, const char* call, const gpu::CallSite& site) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw gpu::CudaError(cudaErrorUnknown,
                       describe_cublas_failure(status, call, site) + " in kernel " + site.kernel + " on problem '" +
                           site.problem + "'",
                       /*sticky=*/false);
}

// NaN wins: a NaN visible logit makes the row NaN, as in the plain formula.
struct MaxKeepingNan {
  __device__ float operator()(float x, float y) const { return isnan(x) ? x : (isnan(y) ? y : fmaxf(x, y)); }
};
struct Add {
  __device__ float operator()(float x, float y) const { return x + y; }
};

// Block-wide reduction in a fixed order (deterministic); every thread gets the result.
template <typename Combine>
__device__ float block_reduce(float value, float* scratch, Combine combine) {
  for (int offset = 16; offset > 0; offset /= 2) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = value;
  __syncthreads();
  value = scratch[0];
  for (int warp = 1; warp < kSoftmaxThreads / 32; ++warp) value = combine(value, scratch[warp]);
  __syncthreads();  // scratch is reused by the next reduction
  return value;
}

// One block per row of the scores of query head h = hk * group + group_index
// (hk = blockIdx.y), row i = blockIdx.x. Overwrites the row's scores with the
// weights P in place: max, exp-sum and normalise over the visible keys, 0 for
// the masked ones (so that the second GEMM skips them, for finite V).
__global__ void __launch_bounds__(kSoftmaxThreads)
    masked_softmax_kernel(const gpu::AttentionArgs a, float* scores, std::int64_t scores_ld, int b, int group_index,
                          int lq, int lk) {
  __shared__ float scratch[kSoftmaxThreads / 32];
  const int i = blockIdx.x, hk = blockIdx.y, h = hk * (a.heads_q / a.heads_kv) + group_index;
  float* row = scores + (static_cast<std::int64_t>(hk) * lq + i) * scores_ld;
  float* lse = a.lse ? a.lse + (static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i : nullptr;
  const KeyRange range = visible_keys(a, i, lq, lk);
  if (range.first > range.last) {  // fully masked (uniform across the block): weights 0, LSE = -inf
    for (int j = threadIdx.x; j < lk; j += kSoftmaxThreads) row[j] = 0.0f;
    if (threadIdx.x == 0 && lse) *lse = -INFINITY;
    return;
  }
  float maximum = -INFINITY;
  for (int j = range.first + threadIdx.x; j <= range.last; j += kSoftmaxThreads)
    maximum = MaxKeepingNan{}(maximum, row[j]);
  maximum = block_reduce(maximum, scratch, MaxKeepingNan{});
  // No special case for a -inf or +inf maximum: s - max is then NaN somewhere,
  // and the row comes out NaN as the plain formula's does.
  float sum = 0.0f;
  for (int j = range.first + threadIdx.x; j <= range.last; j += kSoftmaxThreads) sum += expf(row[j] - maximum);
  sum = block_reduce(sum, scratch, Add{});
  for (int j = threadIdx.x; j < lk; j += kSoftmaxThreads) row[j] = sees(range, j) ? expf(row[j] - maximum) / sum : 0.0f;
  if (threadIdx.x == 0 && lse) *lse = maximum + logf(sum);
}

// A sequence without keys: every valid row is fully masked (O = 0, LSE = -inf).
// Row i = blockIdx.x of query head h = blockIdx.y.
__global__ void no_keys_kernel(const gpu::AttentionArgs a, int b) {
  const int i = blockIdx.x, h = blockIdx.y;
  float* out = static_cast<float*>(a.o) + b * a.o_batch_stride + h * a.o_head_stride + i * a.o_seq_stride;
  for (int c = threadIdx.x; c < a.head_dim_v; c += blockDim.x) out[c] = 0.0f;
  if (threadIdx.x == 0 && a.lse) a.lse[(static_cast<std::int64_t>(b) * a.heads_q + h) * a.seqlen_q + i] = -INFINITY;
}

class CublasUnfused final : public gpu::GpuSubject {
 public:
  ~CublasUnfused() override {
    // At process exit; a poisoned context cannot run cuBLAS's teardown.
    if (handle_ && !gpu::context_poisoned()) gpu::cublas().destroy(handle_);
  }
  std::string_view name() const override { return "cublas-unfused"; }
  std::string_view description() const override {
    return "unfused attention: cuBLAS SGEMM, three-pass masked softmax, cuBLAS SGEMM (f32, S materialised)";
  }
  const Capabilities& capabilities() const override { return kCapabilities; }
  std::string stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (creation_failures_.empty()) return {};
    return std::string("cublas-unfused: ") +
           (handle_ ? "cuBLAS handle created after failed attempt(s): " : "cuBLAS handle not created: ") +
           creation_failures_;
  }

 private:
  // Sets handle_ to a new handle in pedantic math mode, or throws
  // gpu::CudaError naming every failed attempt.
  void create_handle(const gpu::CallSite& site) {
    try {
      gpu::cublas();  // loaded here, on the first creation: a missing library is this launch's error
    } catch (const std::runtime_error& missing) {
      throw gpu::CudaError(cudaErrorUnknown,
                           std::string(missing.what()) + " in kernel " + site.kernel + " on problem '" + site.problem + "'",
                           /*sticky=*/false);
    }
    std::string failures;
    for (int attempt = 1; attempt <= kCreationAttempts; ++attempt) {
      if (attempt > 1) std::this_thread::sleep_for(std::chrono::milliseconds(kCreationBackoffMs * (attempt - 1)));
      cublasHandle_t created = nullptr;
      std::string failure;
      if (const cublasStatus_t status = (cublas_create ? cublas_create : gpu::cublas().create)(&created);
          status != CUBLAS_STATUS_SUCCESS) {
        failure = describe_cublas_failure(status, "cublasCreate", site);  // `created` may hold anything: dropped
      } else if (const cublasStatus_t mode = gpu::cublas().set_math_mode(created, CUBLAS_PEDANTIC_MATH);
                 mode != CUBLAS_STATUS_SUCCESS) {
        // Pedantic math: FP32 in every phase. It rules out TF32 tensor cores
        // and FP32 emulation even when NVIDIA_TF32_OVERRIDE or the emulation
        // environment variables ask for them, so the subject stays plain f32;
        // a handle without it is not kept.
        failure = describe_cublas_failure(mode, "cublasSetMathMode", site);
        gpu::cublas().destroy(created);
      } else {
        handle_ = created;
        if (!failures.empty()) creation_failures_ = failures;
        return;
      }
      failures += (failures.empty() ? "" : "; ") + std::string("attempt ") + std::to_string(attempt) + ": " + failure;
    }
    creation_failures_ = failures;
    throw gpu::CudaError(cudaErrorUnknown,
                         "cuBLAS handle not created in " + std::to_string(kCreationAttempts) + " attempts (" + failures +
                             ") in kernel " + site.kernel + " on problem '" + site.problem + "'",
                         /*sticky=*/false);
  }

  void launch(const Problem& problem, const gpu::AttentionArgs& args, const gpu::CallSite& site) override {
    // One handle per subject, bound to each launch's stream: one launch at a time.
    std::lock_guard<std::mutex> lock(mutex_);
    if (!handle_) create_handle(site);
    check_cublas(gpu::cublas().set_stream(handle_, args.stream), "cublasSetStream", site);

    const int group = args.heads_q / args.heads_kv;
    // Scores of one (batch, query head in group) pair across all K/V heads:
    // [heads_kv][lq][ld], ld = lk rounded up to 4 floats (16-byte rows).
    auto scores_ld = [](std::int64_t lk) { return (lk + 3) / 4 * 4; };
    std::int64_t scores_elements = 0;
    for (std::int64_t b = 0; b < problem.batch; ++b)
      scores_elements = std::max(scores_elements, args.heads_kv * problem.len_q(b) * scores_ld(problem.len_kv(b)));
    // Stream-ordered: freed on args.stream behind the products that read it.
    const gpu::DeviceBuffer scores_buffer(static_cast<std::size_t>(scores_elements) * sizeof(float), args.stream,
                                          site);
    auto* scores = static_cast<float*>(scores_buffer.get());

    const float zero = 0.0f, one = 1.0f, scale = args.scale;
    const auto* q = static_cast<const float*>(args.q);
    const auto* k = static_cast<const float*>(args.k);
    const auto* v = static_cast<const float*>(args.v);
    auto* o = static_cast<float*>(args.o);
    for (int b = 0; b < args.batch; ++b) {
      // Lengths from the host Problem: lens_q/lens_kv in args live on the device.
      const auto lq = static_cast<int>(problem.len_q(b)), lk = static_cast<int>(problem.len_kv(b));
      if (lq == 0) continue;
      if (lk == 0) {
        no_keys_kernel<<<dim3(lq, args.heads_q), 128, 0, args.stream>>>(args, b);
        gpu::check_launch("no_keys_kernel", site);
        continue;
      }
      const std::int64_t ld = scores_ld(lk);
      for (int g = 0; g < group; ++g) {
        // One batched call per query head in the group, batched over the K/V
        // heads: query head hk * group + g reads K/V head hk (no zero strides).
        // cuBLAS is column-major: a row-major [rows][ld] matrix is its transpose.
        // S^T (lk x lq) = (K as [d x lk])^T (Q as [d x lq]), scaled by alpha.
        check_cublas(gpu::cublas().sgemm_strided_batched(handle_, CUBLAS_OP_T, CUBLAS_OP_N, lk, lq, args.head_dim, &scale,
                                               k + b * args.k_batch_stride, static_cast<int>(args.k_seq_stride),
                                               args.k_head_stride, q + b * args.q_batch_stride + g * args.q_head_stride,
                                               static_cast<int>(args.q_seq_stride), group * args.q_head_stride, &zero,
                                               scores, static_cast<int>(ld), static_cast<long long>(lq) * ld,
                                               args.heads_kv),
                     "cublasSgemmStridedBatched (S = Q K^T)", site);
        masked_softmax_kernel<<<dim3(lq, args.heads_kv), kSoftmaxThreads, 0, args.stream>>>(args, scores, ld, b, g,
                                                                                             lq, lk);
        gpu::check_launch("masked_softmax_kernel", site);
        // O^T (dv x lq) = (V as [dv x lk]) (P as [lk x lq]). beta = 0: cuBLAS
        // does not read O, so its poison never reaches the result.
        check_cublas(gpu::cublas().sgemm_strided_batched(handle_, CUBLAS_OP_N, CUBLAS_OP_N, args.head_dim_v, lq, lk, &one,
                                               v + b * args.v_batch_stride, static_cast<int>(args.v_seq_stride),
                                               args.v_head_stride, scores, static_cast<int>(ld),
                                               static_cast<long long>(lq) * ld, &zero,
                                               o + b * args.o_batch_stride + g * args.o_head_stride,
                                               static_cast<int>(args.o_seq_stride), group * args.o_head_stride,
                                               args.heads_kv),
                     "cublasSgemmStridedBatched (O = P V)", site);
      }
    }
  }

  mutable std::mutex mutex_;
  cublasHandle_t handle_ = nullptr;  // created on the first launch, bound to each launch's stream
  std::string creation_failures_;    // the failed attempts of the last creation that had any
};

SubjectRegistration<CublasUnfused> registration;

}  // namespace

testing::CublasCreate testing::replace_cublas_create(CublasCreate create) {
  const CublasCreate previous = cublas_create;
  cublas_create = create;
  return previous;
}
}  // namespace flashcheck::kernels
