// cudnn-fp8's O, widened: cuDNN's fp8 SDPA writes O in fp8 on sm_90 (its bf16
// O needs sm_100), and flashcheck's fp8 problems take O in bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashcheck::cudnn_fp8 {

/// out[n] = bf16(in[n] x scale) for n < count, on `stream`: `in` e4m3 (or
/// e5m2) bytes, `out` bf16. A power-of-two scale keeps it exact (an fp8 value
/// has at most 4 significant bits; bf16 holds 8). Returns the launch's error.
cudaError_t widen_to_bf16(const void* in, void* out, std::int64_t count, bool e5m2, float scale, cudaStream_t stream);

}  // namespace flashcheck::cudnn_fp8
