// Mutants of cpu-fa2-tiles (kernels/cpu/fa2_tiles.hpp): FlashAttention-2's
// Algorithm 2 on the CPU with one deliberate backward flaw each, registered
// only in test builds. The forward (Algorithm 1) is untouched, so only the
// pass=bwd properties (Backward*) can catch them (properties/subject_suite.cpp,
// tests Mutants.*), while cpu-fa2-tiles itself, the control, passes them.
#include "flashcheck/kernels/cpu/fa2_tiles.hpp"

namespace flashcheck {
namespace {

struct TileMutant {
  TileFlaw flaw;
  std::string_view name;
  std::string_view what;
};

constexpr TileMutant kTileMutants[] = {
    {TileFlaw::lse_wrong_base, "mutant-cpu-tiles-bwd-lse-wrong-base",
     "cpu-fa2-tiles' backward reading the natural-log LSE as log2 (P = 2^(S log2 e - LSE))"},
    {TileFlaw::nan_at_non_tile_lengths, "mutant-cpu-tiles-bwd-nan-at-non-tile-lengths",
     "cpu-fa2-tiles' backward reading the last key tile's rows past the sequence (NaN) unmasked"},
};

struct Registrations {
  Registrations() {
    for (const TileMutant& mutant : kTileMutants)
      MutantRegistration([&mutant] { return std::make_unique<CpuFa2Tiles>(mutant.name, mutant.what, mutant.flaw); });
  }
} registrations;

}  // namespace
}  // namespace flashcheck
