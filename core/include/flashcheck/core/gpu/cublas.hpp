// cuBLAS, loaded on first use. Linked directly, libcublas and libcublasLt run
// their static initializers in every flashcheck process at start: about
// 0.16 s and 217 MB of resident memory on the CI machine (docs/perf.md,
// 2026-11-28), though only two callers ever run a GEMM (cublas-unfused and
// the bench's GEMM ceiling). Compiled only with CUDA; included only by CUDA
// sources.
#pragma once

#include <cublas_v2.h>

namespace flashcheck::gpu {

/// cublasGemmEx as exported, with a cublasComputeType_t (C++ also sees an
/// inline overload taking a cudaDataType); the cast in decltype below fails to
/// compile if the header's function differs.
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                        const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

/// The cuBLAS functions flashcheck calls, each typed as cuBLAS declares it
/// (decltype only: nothing here refers to the library's symbols).
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(static_cast<CublasGemmEx>(&cublasGemmEx)) gemm_ex = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

/// The table, from the cuBLAS library found when flashcheck was configured
/// (else the one the loader finds by its soname), loaded on the first call;
/// safe to call from any thread. Throws std::runtime_error naming the
/// library and the loader's message where it cannot be loaded or lacks a
/// function (a later call tries again).
const Cublas& cublas();

}  // namespace flashcheck::gpu
