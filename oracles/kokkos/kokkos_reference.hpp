// kokkos: the portable reference, an independent implementation of attention.
//
// cpu_f64 computes a two-pass softmax over whole rows with BLAS. This computes
// the FlashAttention recurrence: keys in tiles, a running maximum, the running
// sum and the output rescaled whenever the maximum grows (online softmax). It is
// written against Kokkos execution and memory spaces (team policies, nested
// parallel_for / parallel_reduce), so the same source runs on whichever Kokkos
// backend the user built (Serial, OpenMP, CUDA). Its masks are its own code.
//
// In double it is a second oracle. In float, with a kernel's tile sizes, it
// reproduces that kernel's arithmetic order: the report can then separate the
// error inherent to the algorithm from a kernel's own.
#pragma once

#include <cstdint>
#include <string>

#include "core/oracle.hpp"

namespace flashcheck {

/// Whether this build has the Kokkos reference (Kokkos found at configure time).
bool kokkos_available();
/// The Kokkos version and execution space, e.g. "Kokkos 3.4.1 (Serial)".
std::string kokkos_description();

/// How the reference walks the problem: query rows per team, keys per tile.
struct KokkosTiling {
  std::int64_t rows_per_team = 16;
  std::int64_t key_tile = 64;
};

/// The accumulation type: the arithmetic of every step after loading inputs.
enum class Accumulation { f64, f32 };

/// O and LSE of the given rows by online softmax. Throws std::runtime_error
/// when Kokkos is not available, or std::invalid_argument for a tile outside
/// [1, 1024].
AttentionRows kokkos_reference(const Problem& problem, const Inputs& inputs, const RowSet& rows,
                               Accumulation accumulation, KokkosTiling tiling = {});

/// kokkos<double> as an Oracle.
class KokkosOracle final : public Oracle {
 public:
  explicit KokkosOracle(KokkosTiling tiling = {}) : tiling_(tiling) {}
  std::string_view name() const override { return "kokkos_f64"; }
  AttentionRows reference(const Problem& problem, const Inputs& inputs, const RowSet& rows) override {
    return kokkos_reference(problem, inputs, rows, Accumulation::f64, tiling_);
  }

 private:
  KokkosTiling tiling_;
};

}  // namespace flashcheck
