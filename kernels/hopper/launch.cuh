// The Hopper kernel's launcher: tensor maps, the sm_90a check, the grid, the
// dispatch on dtype and head dim, and the domain. Shared by the kernel's
// registration (hopper.cu) and its mutants.
#pragma once

#include <cudaTypedefs.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/launch.cuh"
#include "hopper/kernel.cuh"

namespace flashcheck::kernels::hopper {

/// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_function(const gpu::CallSite& site) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [&] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    gpu::check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found),
               "cudaGetDriverEntryPointByVersion", site);
    if (found != cudaDriverEntryPointSuccess || !function)
      throw gpu::Unsupported("the driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12+ drivers)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

/// A 4-D tiled map of `type` over `data` (dims innermost first; strides in
/// bytes, of axes 1 to 3), read or written in boxes of {box_inner, box_rows,
/// 1, 1} with the 128-byte swizzle; boxes past the bounds are zero-filled on
/// loads and cut on stores. `what` names the tensor in the error ("" for none).
inline CUtensorMap encode_4d(const void* data, CUtensorMapDataType type, const cuuint64_t (&dims)[4],
                             const cuuint64_t (&strides)[3], int box_inner, int box_rows, const gpu::CallSite& site,
                             std::string_view what = {}) {
  CUtensorMap map{};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_inner), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result = encode_function(site)(&map, type, 4, const_cast<void*>(data), dims, strides, box,
                                                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    throw gpu::CudaError(cudaErrorInvalidValue,
                         "cuTensorMapEncodeTiled failed (CUresult " + std::to_string(static_cast<int>(result)) + ")" +
                             (what.empty() ? std::string() : " for " + std::string(what)) + " in " + site.kernel +
                             " on " + site.problem,
                         false);
  return map;
}

/// A 4-D map {d, seq, head, batch} over an f16/bf16 tensor with the given
/// element strides, read in boxes of {64, rows, 1, 1} with the 128-byte
/// swizzle; boxes past the sequence are zero-filled.
inline CUtensorMap tensor_map(const void* data, bool bf16, int d, int seq, int heads, int batch, std::int64_t seq_stride,
                       std::int64_t head_stride, std::int64_t batch_stride, int rows, const gpu::CallSite& site) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(seq),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(seq_stride) * 2, static_cast<cuuint64_t>(head_stride) * 2,
                                 static_cast<cuuint64_t>(batch_stride) * 2};
  return encode_4d(data, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, dims, strides, 64,
                   rows, site);
}

/// What a launch needs from its device: the SM count and the L2 size.
struct DeviceShape {
  int sms, l2_bytes;
};

/// The once-per-device part of launching one instantiation: the sm_90a check,
/// the shared-memory opt-in, and the device's shape, done on its first launch
/// on each device and kept (every launch did them in v5, host work inside a
/// timed launch: docs/perf.md, issue 9, review).
template <typename Kernel>
DeviceShape prepare(Kernel* kernel, int smem_bytes, const gpu::CallSite& site) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, DeviceShape> prepared;  // every instantiation has one type
  int device = 0;
  gpu::check(cudaGetDevice(&device), "cudaGetDevice", site);
  const std::lock_guard lock(mutex);
  const std::pair key{device, reinterpret_cast<const void*>(kernel)};
  if (const auto found = prepared.find(key); found != prepared.end()) return found->second;
  cudaFuncAttributes attributes{};
  gpu::check(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes", site);
  if (attributes.binaryVersion < 90)
    throw gpu::Unsupported("hopper was not built for sm_90a (CMAKE_CUDA_ARCHITECTURES needs 90a-real)");
  gpu::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
             "cudaFuncSetAttribute", site);
  DeviceShape shape{};
  gpu::check(cudaDeviceGetAttribute(&shape.sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute", site);
  gpu::check(cudaDeviceGetAttribute(&shape.l2_bytes, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute", site);
  prepared.emplace(key, shape);
  return shape;
}

/// The scheduler's two counters (tiles taken, blocks finished) for launches
/// on `stream`, zeroed once: each launch's last block zeroes them again
/// (scheduler.cuh), so a launch costs no allocation or memset. One pair per
/// device and stream, as launches on one stream never overlap; kept for the
/// process's life.
inline int* scheduler_counters(cudaStream_t stream, const gpu::CallSite& site) {
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  int device = 0;
  gpu::check(cudaGetDevice(&device), "cudaGetDevice", site);
  const std::lock_guard lock(mutex);
  int*& pair = counters[{device, stream}];
  if (!pair) {
    gpu::check(cudaMalloc(reinterpret_cast<void**>(&pair), 2 * sizeof(int)), "cudaMalloc", site);
    gpu::check(cudaMemset(pair, 0, 2 * sizeof(int)), "cudaMemset", site);
  }
  return pair;
}

template <typename T, int D, HopperFlaw kFlaw>
void launch(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  using S = Shape<D>;
  const int query_blocks = (a.seqlen_q + kBlockM - 1) / kBlockM;
  const int heads = a.batch * a.heads_q;
  if (query_blocks == 0 || heads == 0) return;
  auto* kernel = hopper_forward<T, D, kFlaw>;
  const DeviceShape shape = prepare(kernel, S::kSmemBytes, site);
  if (static_cast<long long>(query_blocks) * heads > INT_MAX)
    throw gpu::Unsupported("hopper: more than 2^31 tiles");
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  const CUtensorMap q = tensor_map(a.q, kBf16, D, a.seqlen_q, a.heads_q, a.batch, a.q_seq_stride, a.q_head_stride,
                                   a.q_batch_stride, kBlockM, site);
  // No key: K and V are never loaded; map the (non-empty) Q tensor in their place.
  const bool keys = a.seqlen_kv > 0;
  const CUtensorMap k = keys ? tensor_map(a.k, kBf16, D, a.seqlen_kv, a.heads_kv, a.batch, a.k_seq_stride,
                                          a.k_head_stride, a.k_batch_stride, S::kBlockN, site)
                             : q;
  const CUtensorMap v = keys ? tensor_map(a.v, kBf16, D, a.seqlen_kv, a.heads_kv, a.batch, a.v_seq_stride,
                                          a.v_head_stride, a.v_batch_stride, S::kBlockN, site)
                             : q;
  // O is stored in boxes of one consumer warpgroup's 64 rows.
  const CUtensorMap o = tensor_map(a.o, kBf16, D, a.seqlen_q, a.heads_q, a.batch, a.o_seq_stride, a.o_head_stride,
                                   a.o_batch_stride, kBlockM / 2, site);
  // Head groups of an eighth of the L2: a half (v5) let K and V be re-read
  // from DRAM 2.5 times over (ncu, docs/perf.md), hidden by the ring but not free.
  const TileScheduler scheduler{query_blocks, heads, head_group(a, shape.l2_bytes / 8), scheduler_counters(a.stream, site)};
  const int grid = std::min(scheduler.tiles(), shape.sms);
  kernel<<<grid, kThreads, S::kSmemBytes, a.stream>>>(q, k, v, o, a, scheduler);
  gpu::check_launch("hopper_forward", site);
}

template <HopperFlaw kFlaw>
void launch_hopper(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  with_instance(a, [&]<typename T, int D>() { launch<T, D, kFlaw>(a, site); });
}

/// The mma family's domain on sm_90 only. TMA's strides must be multiples of
/// 16 bytes, which d >= 64 in f16/bf16 guarantees for every layout.
inline constexpr Capabilities kHopperCapabilities = [] {
  Capabilities c = kMmaCapabilities;
  c.tile_q = kBlockM;
  c.tile_kv = 128;
  c.min_compute_capability = 90;
  c.softcap = true;
  return c;
}();

}  // namespace flashcheck::kernels::hopper
