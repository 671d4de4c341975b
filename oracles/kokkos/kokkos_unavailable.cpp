// The Kokkos references (forward and gradients) in a build without Kokkos:
// they report themselves absent.
#include <stdexcept>

#include "flashcheck/oracles/kokkos/kokkos_backward.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

namespace flashcheck {

bool kokkos_available() { return false; }

bool kokkos_device_available() { return false; }

KokkosTiling kokkos_fitted_tiling(const Problem&, KokkosTiling tiling, KokkosSpace) { return tiling; }

std::string kokkos_description() { return "not built (Kokkos not found at configure time)"; }

AttentionRows kokkos_reference(const Problem&, const Inputs&, const RowSet&, Accumulation, KokkosTiling, KokkosSpace) {
  throw std::runtime_error("the Kokkos reference is not built: install libtrilinos-kokkos-dev or set Kokkos_ROOT");
}

AttentionRows kokkos_baseline(const Problem&, const Inputs&, const RowSet&, DType, KokkosSpace) {
  throw std::runtime_error("the Kokkos baseline is not built: install libtrilinos-kokkos-dev or set Kokkos_ROOT");
}

KokkosTiling kokkos_fitted_gradient_tiling(const Problem&, KokkosTiling tiling, KokkosSpace) { return tiling; }

GradientRows kokkos_gradients(const Problem&, const Inputs&, const HostTensor&, const RowSet&, const RowSet&, KokkosTiling,
                              KokkosSpace, bool, std::int64_t) {
  throw std::runtime_error("the Kokkos gradient reference is not built: install libtrilinos-kokkos-dev or set Kokkos_ROOT");
}

GradientRows kokkos_gradient_baseline(const Problem&, const Inputs&, const HostTensor&, const RowSet&, const RowSet&,
                                      DType, KokkosSpace, std::int64_t) {
  throw std::runtime_error("the Kokkos gradient baseline is not built: install libtrilinos-kokkos-dev or set Kokkos_ROOT");
}

}  // namespace flashcheck
