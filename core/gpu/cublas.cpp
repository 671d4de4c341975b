#include "flashcheck/core/gpu/cublas.hpp"

#include <dlfcn.h>

#include <stdexcept>
#include <string>
#include <type_traits>

// Set by core/CMakeLists.txt: the configured toolkit's library and its soname.
#ifndef FLASHCHECK_CUBLAS_LIBRARY
#define FLASHCHECK_CUBLAS_LIBRARY "libcublas.so"
#endif
#ifndef FLASHCHECK_CUBLAS_SONAME
#define FLASHCHECK_CUBLAS_SONAME "libcublas.so"
#endif

namespace flashcheck::gpu {
namespace {

Cublas load() {
  std::string tried;
  void* library = nullptr;
  for (const char* name : {FLASHCHECK_CUBLAS_LIBRARY, FLASHCHECK_CUBLAS_SONAME}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);  // never closed: the handles outlive every caller
    if (library) break;
    const char* why = dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + name + ": " + (why ? why : "not found");
  }
  if (!library) throw std::runtime_error("cuBLAS could not be loaded (" + tried + ")");
  Cublas table;
  const auto resolve = [library](auto& function, const char* symbol) {
    dlerror();
    void* address = dlsym(library, symbol);
    if (!address) {
      const char* why = dlerror();
      throw std::runtime_error(std::string("cuBLAS (") + FLASHCHECK_CUBLAS_LIBRARY + ") has no " + symbol +
                               (why ? std::string(": ") + why : std::string()));
    }
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(address);
  };
  // The exported names: cublas_v2.h maps cublasCreate, cublasDestroy and
  // cublasSetStream to their _v2 entry points.
  resolve(table.create, "cublasCreate_v2");
  resolve(table.destroy, "cublasDestroy_v2");
  resolve(table.set_stream, "cublasSetStream_v2");
  resolve(table.set_math_mode, "cublasSetMathMode");
  resolve(table.gemm_ex, "cublasGemmEx");
  resolve(table.sgemm_strided_batched, "cublasSgemmStridedBatched");
  resolve(table.status_name, "cublasGetStatusName");
  resolve(table.status_string, "cublasGetStatusString");
  return table;
}

}  // namespace

const Cublas& cublas() {
  static const Cublas table = load();  // a throw leaves it unset: the next call loads again
  return table;
}

}  // namespace flashcheck::gpu
