// The BLAS entry points the CPU oracles use, and its threading control.
#pragma once

#include <cblas.h>

namespace flashcheck {

/// The oracles parallelise over row blocks themselves; each BLAS call runs on
/// the calling thread. Call once before a parallel region that calls BLAS.
inline void use_single_threaded_blas() {
#ifdef FLASHCHECK_HAVE_OPENBLAS
  openblas_set_num_threads(1);
#endif
}

}  // namespace flashcheck
