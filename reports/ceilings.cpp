#include "flashcheck/reports/ceilings.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

#include "flashcheck/core/dtype.hpp"
#include "flashcheck/core/gpu/cublas.hpp"
#include "flashcheck/core/gpu/runtime.hpp"
#include "read_bandwidth.hpp"

namespace flashcheck::reports {

namespace {

using gpu::CallSite;
using gpu::check;

// A GEMM this large runs at cuBLAS's steady state on any current GPU (on the
// H200: 8192^3 bf16 is ~1.4 ms, 132 SMs busy for many waves).
constexpr int kGemmSize = 8192;
constexpr std::size_t kCopyBytes = std::size_t{1} << 30;  // 1 GiB: far past any L2
constexpr int kWarmup = 3;

void check_blas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("ceilings: {} failed: {}", call, gpu::cublas().status_string(status)));
}

/// Median of `repeats` timings of `work` on `stream` (CUDA events), after warm-up.
double median_ms(const std::function<void()>& work, cudaStream_t stream, int repeats, const CallSite& site) {
  for (int n = 0; n < kWarmup; ++n) work();
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (warm-up)", site);
  const gpu::Event start(site), stop(site);
  std::vector<float> times;
  for (int n = 0; n < repeats; ++n) {
    check(cudaEventRecord(start.get(), stream), "cudaEventRecord", site);
    work();
    check(cudaEventRecord(stop.get(), stream), "cudaEventRecord", site);
    check(cudaEventSynchronize(stop.get()), "cudaEventSynchronize", site);
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime", site);
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

/// Fills a device matrix with values in [-1, 1) (not zeros: a GEMM on zeros
/// draws less power and clocks higher than one on data).
void fill_random(void* device, std::int64_t count, DType dtype, const CallSite& site) {
  const int bytes = dtype == DType::f32 ? 4 : 2;
  std::vector<unsigned char> host(static_cast<std::size_t>(count) * bytes);
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (std::int64_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float value = static_cast<float>(static_cast<std::int64_t>(state >> 40) - (1 << 23)) / (1 << 23);
    if (dtype == DType::f32) {
      std::memcpy(host.data() + i * 4, &value, 4);
    } else {
      const std::uint16_t bits = half_bits_from_double(dtype, value);
      std::memcpy(host.data() + i * 2, &bits, 2);
    }
  }
  check(cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy (GEMM operand)", site);
}

double gemm_tflops(cublasHandle_t handle, cudaStream_t stream, DType dtype, int repeats) {
  const CallSite site{fmt::format("cuBLAS {} GEMM", to_string(dtype)), fmt::format("{0}x{0}x{0}", kGemmSize)};
  const std::int64_t elements = std::int64_t{kGemmSize} * kGemmSize;
  const std::size_t bytes = static_cast<std::size_t>(elements) * (dtype == DType::f32 ? 4 : 2);
  const gpu::DeviceBuffer a(bytes, site), b(bytes, site), c(bytes, site);
  fill_random(a.get(), elements, dtype, site);
  fill_random(b.get(), elements, dtype, site);
  const cudaDataType type = dtype == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  // f32 without TF32: the ceiling of the fp32 SIMT kernels.
  const cublasComputeType_t compute = dtype == DType::f32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  const float alpha = 1, beta = 0;
  const double ms = median_ms(
      [&] {
        check_blas(gpu::cublas().gemm_ex(handle, CUBLAS_OP_N, CUBLAS_OP_N, kGemmSize, kGemmSize, kGemmSize, &alpha, a.get(),
                                type, kGemmSize, b.get(), type, kGemmSize, &beta, c.get(), type, kGemmSize, compute,
                                CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
      },
      stream, repeats, site);
  return 2.0 * kGemmSize * kGemmSize * static_cast<double>(kGemmSize) / (ms * 1e-3) / 1e12;
}

}  // namespace

Ceilings measure_ceilings(int repeats) {
  std::string why;
  if (!gpu::device_available(&why)) throw std::runtime_error(why);
  const CallSite site{"ceilings", ""};
  Ceilings c;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice", site);
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties", site);
  c.device = fmt::format("{} (sm_{}{}, {} SMs)", properties.name, properties.major, properties.minor,
                         properties.multiProcessorCount);
  c.l2_bytes = properties.l2CacheSize;
  std::size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", site);
  c.free_bytes = static_cast<double>(free_bytes);

  const gpu::Stream stream(site);
  cublasHandle_t handle = nullptr;
  check_blas(gpu::cublas().create(&handle), "cublasCreate");  // loads cuBLAS (core/gpu/cublas.hpp)
  try {
    check_blas(gpu::cublas().set_stream(handle, stream.get()), "cublasSetStream");
    c.gemm_bf16_tflops = gemm_tflops(handle, stream.get(), DType::bf16, repeats);
    c.gemm_f32_tflops = gemm_tflops(handle, stream.get(), DType::f32, repeats);
  } catch (...) {
    gpu::cublas().destroy(handle);
    throw;
  }
  gpu::cublas().destroy(handle);

  const gpu::DeviceBuffer from(kCopyBytes, site), to(kCopyBytes, site);
  check(cudaMemset(from.get(), 1, kCopyBytes), "cudaMemset", site);
  const double ms = median_ms(
      [&] {
        check(cudaMemcpyAsync(to.get(), from.get(), kCopyBytes, cudaMemcpyDeviceToDevice, stream.get()),
              "cudaMemcpyAsync", site);
      },
      stream.get(), repeats, site);
  c.copy_gbps = 2.0 * static_cast<double>(kCopyBytes) / (ms * 1e-3) / 1e9;
  // The read-only ceiling: the copy's source read once, one word written a block.
  const int blocks = detail::read_all_blocks(properties.multiProcessorCount);
  const gpu::DeviceBuffer sink(static_cast<std::size_t>(blocks) * sizeof(unsigned), site);
  check(cudaMemset(sink.get(), 0, static_cast<std::size_t>(blocks) * sizeof(unsigned)), "cudaMemset", site);
  const double read_ms = median_ms(
      [&] {
        check(detail::launch_read_all(from.get(), kCopyBytes, static_cast<unsigned*>(sink.get()), blocks, stream.get()),
              "read_all launch", site);
      },
      stream.get(), repeats, site);
  c.read_gbps = static_cast<double>(kCopyBytes) / (read_ms * 1e-3) / 1e9;
  // A read that does not reach what the copy reads at the same time (half its
  // read + write figure) is the kernel's failure, not the machine's ceiling:
  // said, and left out rather than shown as one.
  if (!(c.read_gbps >= c.copy_gbps / 2)) {
    fmt::print(stderr, "ceilings: the read-only kernel read {:.0f} GB/s, below the copy's {:.0f} GB/s of reads: "
                       "no read ceiling this run\n", c.read_gbps, c.copy_gbps / 2);
    c.read_gbps = 0;
  }
  c.method = fmt::format("cuBLAS GEMM {0}x{0}x{0} (bf16 with f32 accumulation; f32 pedantic, no TF32), 1 GiB "
                         "device-to-device copy counted as read + write, 1 GiB read by {3} blocks of 16-byte "
                         "streaming loads (reports/read_bandwidth.cu); median of {1} after {2} warm-ups",
                         kGemmSize, repeats, kWarmup, blocks);
  return c;
}

CeilingRecord to_record(const Ceilings& c) {
  CeilingRecord record;
  record.time = record_time_now();
  record.device = c.device;
  record.gemm_bf16_tflops = c.gemm_bf16_tflops;
  record.gemm_f32_tflops = c.gemm_f32_tflops;
  record.copy_gbps = c.copy_gbps;
  if (c.read_gbps > 0) record.read_gbps = c.read_gbps;
  record.l2_bytes = c.l2_bytes;
  record.method = c.method;
  return record;
}

}  // namespace flashcheck::reports
