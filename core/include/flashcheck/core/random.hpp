// Counter-based random numbers: the value at index i depends only on
// (seed, stream, i), so generation is deterministic and independent of how the
// work is split across threads. (std:: distributions differ between standard
// libraries, so they are not used for anything that must replay.)
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace flashcheck {

/// SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mix.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class CounterRng {
 public:
  constexpr CounterRng(std::uint64_t seed, std::uint64_t stream) : key_(mix64(seed ^ mix64(stream))) {}
  /// 64 random bits for counter i.
  constexpr std::uint64_t bits(std::uint64_t i) const { return mix64(key_ ^ mix64(i)); }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform(std::uint64_t i) const { return static_cast<double>(bits(i) >> 11) * 0x1.0p-53; }
  /// Uniform in (0, 1].
  double uniform_open0(std::uint64_t i) const { return (static_cast<double>(bits(i) >> 11) + 1.0) * 0x1.0p-53; }
  /// Standard normal (Box-Muller on counters 2i and 2i+1).
  double normal(std::uint64_t i) const {
    const double radius = std::sqrt(-2.0 * std::log(uniform_open0(2 * i)));
    return radius * std::cos(2.0 * std::numbers::pi * uniform(2 * i + 1));
  }

 private:
  std::uint64_t key_;
};

}  // namespace flashcheck
