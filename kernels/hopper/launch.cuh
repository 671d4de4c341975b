// The Hopper kernel's launcher: tensor maps, the sm_90a check, the grid, the
// dispatch on dtype and head dim, and the domain. Shared by the kernel's
// registration (hopper.cu) and its mutants.
#pragma once

#include <cudaTypedefs.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

/// The tensor-map element type of T (fp8 as bytes: TMA moves them unread).
template <typename T>
inline constexpr CUtensorMapDataType kMapType = std::is_same_v<T, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                : std::is_same_v<T, __half>      ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                                 : CU_TENSOR_MAP_DATA_TYPE_UINT8;

/// A 4-D map {d, seq, head, batch} over a tensor of T with the given element
/// strides, read in boxes of {128 bytes of columns (64 f16/bf16, 128 fp8),
/// rows, 1, 1} with the 128-byte swizzle; boxes past the sequence are zero-filled.
template <typename T>
inline CUtensorMap tensor_map_of(const void* data, int d, int seq, int heads, int batch, std::int64_t seq_stride,
                                 std::int64_t head_stride, std::int64_t batch_stride, int rows,
                                 const gpu::CallSite& site) {
  constexpr auto kBytes = static_cast<cuuint64_t>(sizeof(T));
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(seq),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(seq_stride) * kBytes,
                                 static_cast<cuuint64_t>(head_stride) * kBytes,
                                 static_cast<cuuint64_t>(batch_stride) * kBytes};
  return encode_4d(data, kMapType<T>, dims, strides, 128 / static_cast<int>(kBytes), rows, site);
}

/// tensor_map_of for f16 (bf16 false) or bf16.
inline CUtensorMap tensor_map(const void* data, bool bf16, int d, int seq, int heads, int batch, std::int64_t seq_stride,
                              std::int64_t head_stride, std::int64_t batch_stride, int rows, const gpu::CallSite& site) {
  return bf16 ? tensor_map_of<__nv_bfloat16>(data, d, seq, heads, batch, seq_stride, head_stride, batch_stride, rows, site)
              : tensor_map_of<__half>(data, d, seq, heads, batch, seq_stride, head_stride, batch_stride, rows, site);
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
/// process's life. The zeroing is on `stream`: a cudaMemset on the legacy
/// stream does not order a non-blocking stream's kernel after it, and the
/// harness's streams are non-blocking. A first launch could then read what
/// the allocation held before (a freed buffer's poison: a negative tile id,
/// an LSE store far outside its tensor). The likely cause of a sticky fault
/// that the gpu-quick tier met in hopper-fp8 on an H100, in 2 of 7 runs of
/// the same cases (2026-11-27; docs/perf.md, "The GPU tiers' time").
inline int* scheduler_counters(cudaStream_t stream, const gpu::CallSite& site) {
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  int device = 0;
  gpu::check(cudaGetDevice(&device), "cudaGetDevice", site);
  const std::lock_guard lock(mutex);
  int*& pair = counters[{device, stream}];
  if (!pair) {
    gpu::check(cudaMalloc(reinterpret_cast<void**>(&pair), 2 * sizeof(int)), "cudaMalloc", site);
    gpu::check(cudaMemsetAsync(pair, 0, 2 * sizeof(int), stream), "cudaMemsetAsync (scheduler counters)", site);
  }
  return pair;
}

/// fp8's V^T: wgmma takes fp8 B operands K-major only, and O += P V's k is
/// the keys, so V [key][c] is transposed to vt[b][hk][c][key], the keys
/// padded with zeros to a multiple of 128 (a tile) and each 16 keys stored in
/// the order of P's fragment slots (softmax.cuh, to_fragments): slot 4t + i
/// holds key 2t + i (i < 2) or 8 + 2t + i - 2, so a 4-byte word of V^T holds
/// keys 2t, 2t + 1, 2t + 8 and 2t + 9 of one column. One block per (128 keys,
/// K/V head, batch entry): V's rows are read in 16 bytes, each thread
/// transposes a 4 x 4 block of bytes (one word of 4 key rows) in registers,
/// and V^T's rows are written a warp's 128 bytes at a time. v2 moved single
/// bytes through shared memory with 8-way bank conflicts: 51 us for b=4
/// hkv=16 N=4096 on the H100, where V's two passes over DRAM take about 20.
template <int D>
__global__ void __launch_bounds__(256) transpose_v_fp8(const gpu::AttentionArgs a, std::uint8_t* vt, int keys_padded) {
  __shared__ alignas(16) std::uint8_t in[128][D + 16];  // [key][c]: 16-byte rows; words of 4 rows apart by 4 banks
  __shared__ std::uint32_t out[D][33];                    // [c][a word of 4 keys]: the odd stride spreads the columns
  const int key0 = static_cast<int>(blockIdx.x) * 128, hk = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const auto* v = static_cast<const std::uint8_t*>(a.v) + b * a.v_batch_stride + hk * a.v_head_stride;
  for (int n = static_cast<int>(threadIdx.x); n < 128 * D / 16; n += 256) {
    const int key = n / (D / 16), chunk = n % (D / 16);
    uint4 value = make_uint4(0, 0, 0, 0);
    if (key0 + key < a.seqlen_kv) value = *reinterpret_cast<const uint4*>(v + (key0 + key) * a.v_seq_stride + chunk * 16);
    *reinterpret_cast<uint4*>(&in[key][chunk * 16]) = value;
  }
  __syncthreads();
  // Thread n: word t = n % 4 of 16-key group g, columns 4 w .. 4 w + 3 (a warp: 8 words of columns x the 4 t).
  for (int n = static_cast<int>(threadIdx.x); n < 128 * D / 16; n += 256) {
    const int t = n % 4, w = n / 4 % (D / 4), g = n / D;
    const int row = 16 * g + 2 * t;
    const auto word = [&](int key) { return *reinterpret_cast<const std::uint32_t*>(&in[key][4 * w]); };
    const std::uint32_t r0 = word(row), r1 = word(row + 1), r2 = word(row + 8), r3 = word(row + 9);
    const std::uint32_t low01 = __byte_perm(r0, r1, 0x5140), high01 = __byte_perm(r0, r1, 0x7362);  // bytes 0-1, 2-3
    const std::uint32_t low23 = __byte_perm(r2, r3, 0x5140), high23 = __byte_perm(r2, r3, 0x7362);
    out[4 * w + 0][4 * g + t] = __byte_perm(low01, low23, 0x5410);
    out[4 * w + 1][4 * g + t] = __byte_perm(low01, low23, 0x7632);
    out[4 * w + 2][4 * g + t] = __byte_perm(high01, high23, 0x5410);
    out[4 * w + 3][4 * g + t] = __byte_perm(high01, high23, 0x7632);
  }
  __syncthreads();
  auto* rows = reinterpret_cast<std::uint32_t*>(vt + (static_cast<std::int64_t>(b) * a.heads_kv + hk) * D * keys_padded + key0);
  for (int n = static_cast<int>(threadIdx.x); n < D * 32; n += 256)
    rows[static_cast<std::int64_t>(n / 32) * (keys_padded / 4) + n % 32] = out[n / 32][n % 32];
}

template <typename T, int D, HopperFlaw kFlaw>
void launch(const gpu::AttentionArgs& args, const gpu::CallSite& site) {
  using S = Shape<T, D>;
  using Out = typename Element<T>::Out;
  constexpr bool kFp8 = Element<T>::kFp8;
  // fp8: the descales of Q and K fold into the logit scale (the mutant
  // forgets them); V's multiplies O in the epilogue.
  gpu::AttentionArgs a = args;
  if (kFp8 && kFlaw != HopperFlaw::fp8_descale_missing) a.scale = args.scale * args.q_descale * args.k_descale;
  const int query_blocks = (a.seqlen_q + kBlockM - 1) / kBlockM;
  const int heads = a.batch * a.heads_q;
  if (query_blocks == 0 || heads == 0) return;
  auto* kernel = hopper_forward<T, D, kFlaw>;
  const DeviceShape shape = prepare(kernel, S::kSmemBytes, site);
  if (static_cast<long long>(query_blocks) * heads > INT_MAX)
    throw gpu::Unsupported("hopper: more than 2^31 tiles");
  const CUtensorMap q = tensor_map_of<T>(a.q, D, a.seqlen_q, a.heads_q, a.batch, a.q_seq_stride, a.q_head_stride,
                                         a.q_batch_stride, kBlockM, site);
  // No key: K and V are never loaded; map the (non-empty) Q tensor in their place.
  const bool keys = a.seqlen_kv > 0;
  const CUtensorMap k = keys ? tensor_map_of<T>(a.k, D, a.seqlen_kv, a.heads_kv, a.batch, a.k_seq_stride,
                                                a.k_head_stride, a.k_batch_stride, S::kBlockN, site)
                             : q;
  CUtensorMap v = q;
  // fp8: V^T, allocated in stream order from the device's default pool
  // (gpu::DeviceBuffer: the pool keeps what is freed, so a timed launch maps
  // no memory once warm) and freed after the kernels that read it.
  gpu::DeviceBuffer vt_buffer;
  if constexpr (kFp8) {  // (a constexpr branch: transpose_v_fp8 is instantiated for fp8's D only)
    if (keys) {
      const int keys_padded = (a.seqlen_kv + S::kBlockN - 1) / S::kBlockN * S::kBlockN;
      const auto bytes = static_cast<std::size_t>(a.batch) * a.heads_kv * D * keys_padded;
      vt_buffer = gpu::DeviceBuffer(bytes, a.stream, site);
      auto* vt = static_cast<std::uint8_t*>(vt_buffer.get());
      transpose_v_fp8<D><<<dim3(keys_padded / 128, a.heads_kv, a.batch), 256, 0, a.stream>>>(a, vt, keys_padded);
      gpu::check_launch("transpose_v_fp8", site);
      const cuuint64_t dims[4] = {static_cast<cuuint64_t>(keys_padded), static_cast<cuuint64_t>(D),
                                  static_cast<cuuint64_t>(a.heads_kv), static_cast<cuuint64_t>(a.batch)};
      const cuuint64_t strides[3] = {static_cast<cuuint64_t>(keys_padded), static_cast<cuuint64_t>(D) * keys_padded,
                                     static_cast<cuuint64_t>(a.heads_kv) * D * keys_padded};
      v = encode_4d(vt, CU_TENSOR_MAP_DATA_TYPE_UINT8, dims, strides, 128, D, site, "V^T");  // panels of 128 keys
    }
  } else if (keys) {
    v = tensor_map_of<T>(a.v, D, a.seqlen_kv, a.heads_kv, a.batch, a.v_seq_stride, a.v_head_stride, a.v_batch_stride,
                         S::kBlockN, site);
  }
  // O is stored in boxes of one consumer warpgroup's 64 rows.
  const CUtensorMap o = tensor_map_of<Out>(a.o, D, a.seqlen_q, a.heads_q, a.batch, a.o_seq_stride, a.o_head_stride,
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

/// The fp8 path: e4m3 (or e5m2) Q, K, V at d = 128, O in bf16.
template <HopperFlaw kFlaw>
void launch_hopper_fp8(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  if (a.dtype == static_cast<int>(DType::e5m2)) launch<__nv_fp8_e5m2, 128, kFlaw>(a, site);
  else launch<__nv_fp8_e4m3, 128, kFlaw>(a, site);
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

/// hopper-fp8's domain: hopper's, in e4m3 and e5m2 at d = 128 (V^T's tile
/// rows are kBlockN = 128 keys of one byte, one swizzle span). Finite inputs
/// (kMmaCapabilities): fp8 P V multiplies masked keys' values by weight 0.
inline constexpr Capabilities kHopperFp8Capabilities = [] {
  Capabilities c = kHopperCapabilities;
  c.dtypes = {DType::e4m3, DType::e5m2};
  c.head_dims = {128};
  c.tile_kv = Shape<__nv_fp8_e4m3, 128>::kBlockN;
  c.product_accumulation_unit = 0x1p-13;  // fp8 wgmma's accumulation (Capabilities says why)
  return c;
}();

}  // namespace flashcheck::kernels::hopper
