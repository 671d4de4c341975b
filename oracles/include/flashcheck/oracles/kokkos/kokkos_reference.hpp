// kokkos: the portable reference, an independent implementation of attention.
//
// cpu_f64 computes a two-pass softmax over whole rows with BLAS. This computes
// the FlashAttention recurrence: keys in tiles, a running maximum, the running
// sum and the output rescaled whenever the maximum grows (online softmax). It is
// written against Kokkos execution and memory spaces (kokkos_attention.hpp, a
// team per block of query rows, templated on the execution space and the
// accumulation type), so the same source runs on Serial (Debian's Kokkos) and
// on CUDA (a Kokkos built with scripts/build-kokkos-cuda). Its masks are its
// own code.
//
// On a GPU, in f64, it checks every row of a production-size problem (b1 h16
// N16384 d128: 2.2 TFLOP), where cpu_f64 samples rows.
//
// In double it is a second oracle. In float, with a kernel's tile sizes, it
// reproduces that kernel's arithmetic order: the report can then separate the
// error inherent to the algorithm from a kernel's own.
#pragma once

#include <cstdint>
#include <string>

#include "flashcheck/core/oracle.hpp"

namespace flashcheck {

/// Whether this build has the Kokkos reference (Kokkos found at configure time)
/// and it can run here (a CUDA Kokkos initialises only where a GPU is present).
bool kokkos_available();
/// Whether the reference can run on a GPU here: a CUDA Kokkos is built in and
/// a CUDA device is present.
bool kokkos_device_available();
/// The Kokkos version and execution spaces, e.g. "Kokkos 3.4.1 (Serial)" or
/// "Kokkos 4.6.99 (Cuda, host Serial)".
std::string kokkos_description();

/// Where the reference runs: the host execution space (Serial), or the default
/// execution space (CUDA in a CUDA Kokkos; in a host-only Kokkos a request for
/// the device throws).
enum class KokkosSpace { host, device };

/// How the reference walks the problem: query rows per team, keys per tile,
/// threads per team (0: 128 on a GPU, 1 on Serial). On a GPU, rows_per_team is
/// halved (then key_tile) until the team scratch fits; kokkos_fitted_tiling
/// says what will run.
struct KokkosTiling {
  std::int64_t rows_per_team = 64;
  std::int64_t key_tile = 32;
  std::int64_t team_size = 0;
};

/// The tiling that kokkos_reference will use for this problem in this space.
KokkosTiling kokkos_fitted_tiling(const Problem& problem, KokkosTiling tiling, KokkosSpace space);

/// The accumulation type: the arithmetic of every step after loading inputs.
enum class Accumulation { f64, f32 };

/// O and LSE of the given rows by online softmax. Throws std::runtime_error
/// when Kokkos (or, for KokkosSpace::device, a device) is not available, or
/// std::invalid_argument for a tiling outside [1, 1024].
AttentionRows kokkos_reference(const Problem& problem, const Inputs& inputs, const RowSet& rows,
                               Accumulation accumulation, KokkosTiling tiling = {},
                               KokkosSpace space = KokkosSpace::host);

/// The same-precision baseline (cpu_lowp's arithmetic: plain attention in the
/// `working` dtype, rounded after each step, f32 sums in textbook order) in the
/// given space: on the GPU it covers every row where cpu_lowp samples. Padding
/// and fully masked rows are O = 0, LSE = -inf.
AttentionRows kokkos_baseline(const Problem& problem, const Inputs& inputs, const RowSet& rows, DType working,
                              KokkosSpace space = KokkosSpace::host);

/// kokkos<double> as an Oracle.
class KokkosOracle final : public Oracle {
 public:
  explicit KokkosOracle(KokkosTiling tiling = {}, KokkosSpace space = KokkosSpace::host)
      : tiling_(tiling), space_(space) {}
  std::string_view name() const override { return "kokkos_f64"; }
  AttentionRows reference(const Problem& problem, const Inputs& inputs, const RowSet& rows) override {
    return kokkos_reference(problem, inputs, rows, Accumulation::f64, tiling_, space_);
  }

 private:
  KokkosTiling tiling_;
  KokkosSpace space_;
};

}  // namespace flashcheck
