#include "properties/gpu/busy_stream.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace flashcheck::testing_gpu {
namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

// Spins for about `nanoseconds` of the global timer, doing float arithmetic.
__global__ void busy_kernel(std::uint64_t nanoseconds, float* sink) {
  std::uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  float x = static_cast<float>(threadIdx.x);
  do {
    for (int n = 0; n < 64; ++n) x = x * 0.999999f + 1.0e-6f;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
  if (x == -1.0f) *sink = x;  // never true: keeps the arithmetic
}

}  // namespace

BusyStream::BusyStream() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  stream_ = stream;
  check(cudaMalloc(&sink_, sizeof(float)), "cudaMalloc");
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
}

BusyStream::~BusyStream() {
  auto stream = static_cast<cudaStream_t>(stream_);
  cudaStreamSynchronize(stream);
  cudaFree(sink_);
  cudaStreamDestroy(stream);
}

void BusyStream::start(int blocks_per_sm, int milliseconds) {
  busy_kernel<<<blocks_per_sm * multiprocessors_, 256, 0, static_cast<cudaStream_t>(stream_)>>>(
      static_cast<std::uint64_t>(milliseconds) * 1'000'000, sink_);
  check(cudaGetLastError(), "busy_kernel launch");
}

void BusyStream::finish() { check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize"); }

}  // namespace flashcheck::testing_gpu
