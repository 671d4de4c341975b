#include "fp8_widen.hpp"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

namespace flashcheck::cudnn_fp8 {
namespace {

template <typename Fp8>
__global__ void widen(const Fp8* in, __nv_bfloat16* out, std::int64_t count, float scale) {
  for (std::int64_t n = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; n < count;
       n += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    out[n] = __float2bfloat16_rn(static_cast<float>(in[n]) * scale);
}

}  // namespace

cudaError_t widen_to_bf16(const void* in, void* out, std::int64_t count, bool e5m2, float scale, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((count + 255) / 256, 132 * 16));
  if (e5m2) widen<<<blocks, 256, 0, stream>>>(static_cast<const __nv_fp8_e5m2*>(in), static_cast<__nv_bfloat16*>(out), count, scale);
  else widen<<<blocks, 256, 0, stream>>>(static_cast<const __nv_fp8_e4m3*>(in), static_cast<__nv_bfloat16*>(out), count, scale);
  return cudaGetLastError();
}

}  // namespace flashcheck::cudnn_fp8
