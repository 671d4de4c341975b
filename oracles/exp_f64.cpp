#include "flashcheck/oracles/exp_f64.hpp"

#include <bit>
#include <algorithm>
#include <cmath>

namespace flashcheck {
namespace {

// Cody-Waite split of ln 2: kLn2High has trailing zero bits, so k * kLn2High is
// exact for |k| < 2^11.
constexpr double kLog2e = 1.4426950408889634074;
constexpr double kLn2High = 6.93147180369123816490e-01;
constexpr double kLn2Low = 1.90821492927058770002e-10;
// Adding 1.5 * 2^52 rounds to an integer held in the low mantissa bits.
constexpr double kRoundMagic = 0x1.8p52;
// Below this, 2^k is subnormal; above kOverflow the result is +Inf.
constexpr double kUnderflow = -708.0;
constexpr double kOverflow = 709.0;

}  // namespace

namespace {

// One chunk: the vector loop computes every element as if it were inside
// [kUnderflow, kOverflow]; the scalar loop then redoes, through libm, the
// rare elements outside that range (subnormal or zero results, overflow, NaN).
// Cloned for AVX-512, AVX2+FMA and the x86-64 baseline: the loader picks the
// clone for the running CPU, so the binary stays portable.
constexpr std::int64_t kChunk = 256;

__attribute__((target_clones("avx512f", "arch=haswell", "default"))) void exp_chunk(double* x, std::int64_t n,
                                                                                     double shift) {
  double original[kChunk];
  for (std::int64_t i = 0; i < n; ++i) original[i] = x[i] - shift;
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    // No clamping (a select or std::fmin here stops the vectorizer for AVX2 and
    // SSE2): elements outside [kUnderflow, kOverflow] or NaN compute garbage here
    // (shifts of negative values are defined in C++20) and the scalar loop below
    // redoes them.
    const double clamped = original[i];
    const double shifted = clamped * kLog2e + kRoundMagic;
    const double k = shifted - kRoundMagic;  // nearest integer to x / ln 2
    const double r = (clamped - k * kLn2High) - k * kLn2Low;  // |r| <= ln(2)/2
    // Taylor series to r^13: truncation below 5e-18 relative for |r| <= 0.347.
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // 2^k from the integer in the low bits of `shifted`.
    const auto k_bits = std::bit_cast<std::int64_t>(shifted) - std::bit_cast<std::int64_t>(kRoundMagic);
    x[i] = p * std::bit_cast<double>((k_bits + 1023) << 52);
  }
  for (std::int64_t i = 0; i < n; ++i)
    if (!(original[i] >= kUnderflow && original[i] <= kOverflow)) x[i] = std::exp(original[i]);
}

}  // namespace

void exp_in_place(double* x, std::int64_t n) {
  for (std::int64_t start = 0; start < n; start += kChunk) exp_chunk(x + start, std::min(kChunk, n - start), 0.0);
}

double exp_shifted_sum(double* x, std::int64_t n, double shift) {
  double sum = 0;
  for (std::int64_t start = 0; start < n; start += kChunk) {
    const std::int64_t count = std::min(kChunk, n - start);
    exp_chunk(x + start, count, shift);
    for (std::int64_t i = start; i < start + count; ++i) sum += x[i];
  }
  return sum;
}

}  // namespace flashcheck
