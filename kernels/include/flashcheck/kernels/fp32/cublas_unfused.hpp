// cublas_unfused's test seam: the function that creates its cuBLAS handle, so
// that a test can make handle creation fail the way it may under contention
// (eight processes creating contexts and handles at once) without exhausting
// the device. Production code never calls it.
#pragma once

#include <cublas_v2.h>

namespace flashcheck::kernels::testing {

/// Creates a cuBLAS handle (cublasCreate's signature).
using CublasCreate = cublasStatus_t (*)(cublasHandle_t* handle);

/// Makes later handle creations of the cublas-unfused subject call `create`
/// (nullptr: cuBLAS's own again); returns the function used until now (nullptr
/// for cuBLAS's own). A subject that already holds a handle creates none.
CublasCreate replace_cublas_create(CublasCreate create);

}  // namespace flashcheck::kernels::testing
