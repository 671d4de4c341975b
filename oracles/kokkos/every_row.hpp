// The every-row reference of a GPU case: kokkos_f64 on the device over every
// query row, and cpu_f64 on sampled rows cross-checking it. Large problems are
// otherwise checked on sampled rows only (cpu_f64 runs on the host).
#pragma once

#include <cstdint>
#include <optional>

#include "core/problem.hpp"
#include "core/tensor.hpp"

namespace flashcheck {

/// How far two references apart are on the rows of `sampled` (a subset of
/// `every`'s rows): O normwise (||a - b|| / ||b||), the worst LSE difference
/// relative to 1 + |LSE|, and the positions where one is non-finite and the
/// other differs.
struct CrossCheck {
  double o_normwise = 0, lse_relative = 0;
  std::int64_t nonfinite_mismatches = 0;
  /// Two f64 references agree to f64 rounding: 1e-12, the bound of the
  /// triangulation property CpuF64AgreesWithKokkosToOneInATrillion.
  bool agrees() const { return o_normwise <= 1e-12 && lse_relative <= 1e-12 && nonfinite_mismatches == 0; }
};

CrossCheck cross_check(const Problem& problem, const AttentionRows& every, const AttentionRows& sampled);

/// kokkos_f64 on the GPU over every row, and its cross-check against
/// `cpu_sampled` (cpu_f64 on some rows of the same inputs).
struct EveryRowReference {
  AttentionRows rows;
  CrossCheck check;
};

/// std::nullopt where the device reference cannot run here (no CUDA Kokkos
/// built in, or no GPU).
std::optional<EveryRowReference> every_row_reference(const Problem& problem, const Inputs& inputs,
                                                     const AttentionRows& cpu_sampled);

}  // namespace flashcheck
