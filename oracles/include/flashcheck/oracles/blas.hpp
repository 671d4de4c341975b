// The BLAS entry points the CPU oracles use, and its threading control.
#pragma once

#include <cblas.h>

#include <cstdint>

namespace flashcheck {

/// Below these sizes the CPU oracles stay on one thread: starting an OpenMP
/// team (and its busy-waiting when ctest runs tests side by side) costs more
/// than the work. Elements converted per K/V head; multiply-adds per head group.
inline constexpr std::int64_t kParallelElements = 1 << 15;
inline constexpr std::int64_t kParallelWork = 1 << 22;

/// The oracles parallelise over row blocks themselves; each BLAS call runs on
/// the calling thread. Call once before a parallel region that calls BLAS.
inline void use_single_threaded_blas() {
#ifdef FLASHCHECK_HAVE_OPENBLAS
  openblas_set_num_threads(1);
#endif
}

}  // namespace flashcheck
