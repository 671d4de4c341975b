// Exact host conversions of core/dtype: every f16 and bf16 bit pattern, the
// rounding of generated doubles (normal, subnormal, overflow, exact midpoints
// and their neighbours), single rounding from f64, special values, the format
// constants, ULP helpers and dtype names.
//
// The references are independent of core/dtype.cpp: GCC's _Float16 (whose
// conversions from double are correctly rounded, ties to even) for f16,
// std::bit_cast of the top half of a float for bf16 values, and a brute-force
// search over the ordered bit patterns for rounding to bf16.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flashcheck/core/dtype.hpp"
#include "flashcheck/core/random.hpp"

namespace flashcheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string hex16(std::uint16_t bits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%04X", static_cast<unsigned>(bits));
  return text;
}

// A double both as a hex float and as its bit pattern, so failures can be replayed exactly.
std::string describe(double x) {
  char text[96];
  std::snprintf(text, sizeof text, "%a (bits 0x%016llX)", x,
                static_cast<unsigned long long>(std::bit_cast<std::uint64_t>(x)));
  return text;
}

bool same_double(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

// Collects failures of a loop over many inputs: counts all, keeps the first few
// messages, so one broken rule does not print 65,536 lines.
class FailureLog {
 public:
  void add(const std::string& message) {
    if (count_++ < kKept) text_ += "  " + message + "\n";
  }
  std::int64_t count() const { return count_; }
  std::string text() const {
    return count_ == 0 ? std::string() : text_ + (count_ > kKept ? "  ...\n" : "");
  }

 private:
  static constexpr std::int64_t kKept = 12;
  std::int64_t count_ = 0;
  std::string text_;
};

// ---- independent references --------------------------------------------------

std::uint16_t gcc_f16_bits(double x) {
  const auto half = static_cast<_Float16>(x);
  std::uint16_t bits;
  std::memcpy(&bits, &half, sizeof bits);
  return bits;
}

double gcc_f16_value(std::uint16_t bits) {
  _Float16 half;
  std::memcpy(&half, &bits, sizeof half);
  return static_cast<double>(half);
}

double float_bf16_value(std::uint16_t bits) {
  return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16));
}

bool f16_is_nan(std::uint16_t bits) { return (bits & 0x7C00) == 0x7C00 && (bits & 0x03FF) != 0; }
bool bf16_is_nan(std::uint16_t bits) { return (bits & 0x7F80) == 0x7F80 && (bits & 0x007F) != 0; }

// A 16-bit format described by its ordered positive finite patterns
// 0 .. max_finite_pattern and the pattern of +Inf right after them.
struct HalfFormat {
  const char* name;
  DType dtype;
  std::uint16_t max_finite_pattern;
  std::uint16_t inf_pattern;
  std::uint16_t quiet_bit;
  int emin, emax, precision;
  double (*value)(std::uint16_t);  // independent decoder
  // The value the rounding treats +Inf as: 2^(emax+1), the next binade's start.
  // Its pattern is even, so the midpoint max + ulp/2 ties to Inf, as IEEE requires.
  double overflow_value() const { return std::ldexp(1.0, emax + 1); }
  double magnitude(std::uint16_t positive_pattern) const {
    return positive_pattern == inf_pattern ? overflow_value() : value(positive_pattern);
  }
  bool is_nan(std::uint16_t bits) const { return (bits & 0x7FFF) > inf_pattern; }
};

const HalfFormat kF16{"f16", DType::f16, 0x7BFF, 0x7C00, 0x0200, -14, 15, 11, gcc_f16_value};
const HalfFormat kBF16{"bf16", DType::bf16, 0x7F7F, 0x7F80, 0x0040, -126, 127, 8, float_bf16_value};

// Brute-force round to nearest, ties to even: binary search for the largest
// pattern not above |x|, then compare |x| with the exact midpoint to the next one.
std::uint16_t reference_round(const HalfFormat& format, double x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double magnitude = std::fabs(x);
  if (std::isinf(magnitude) || magnitude >= format.overflow_value()) return sign | format.inf_pattern;
  std::uint32_t lo = 0, hi = format.max_finite_pattern;  // value(lo) <= magnitude holds
  while (lo < hi) {
    const std::uint32_t probe = (lo + hi + 1) / 2;
    if (format.value(static_cast<std::uint16_t>(probe)) <= magnitude) lo = probe;
    else hi = probe - 1;
  }
  const auto below = static_cast<std::uint16_t>(lo);
  if (format.value(below) == magnitude) return sign | below;
  const auto above = static_cast<std::uint16_t>(below + 1);  // inf_pattern after the largest finite
  const double midpoint = (format.value(below) + format.magnitude(above)) / 2;  // exact in binary64
  std::uint16_t nearest;
  if (magnitude < midpoint) nearest = below;
  else if (magnitude > midpoint) nearest = above;
  else nearest = (below & 1) == 0 ? below : above;
  return sign | nearest;
}

std::uint16_t subject_round(const HalfFormat& format, double x) {
  return format.dtype == DType::f16 ? f16_bits_from_double(x) : bf16_bits_from_double(x);
}

double subject_value(const HalfFormat& format, std::uint16_t bits) {
  return format.dtype == DType::f16 ? f16_bits_to_double(bits) : bf16_bits_to_double(bits);
}

// ---- generated inputs ---------------------------------------------------------

// Doubles that exercise every rounding path of `format`, deterministically:
// normal and subnormal magnitudes with random 52-bit significands, the overflow
// region, arbitrary binary64 bit patterns (including binary64 subnormals), and
// exact midpoints between adjacent values with the doubles on either side.
std::vector<double> rounding_inputs(const HalfFormat& format, std::uint64_t seed) {
  const CounterRng rng(seed, format.dtype == DType::f16 ? 16 : 17);
  std::uint64_t counter = 0;
  auto next_bits = [&] { return rng.bits(counter++); };
  auto random_sign = [&](double magnitude) { return (next_bits() & 1) ? -magnitude : magnitude; };
  auto random_significand = [&] {  // in [1, 2)
    return 1.0 + std::ldexp(static_cast<double>(next_bits() >> 12), -52);
  };
  std::vector<double> inputs;

  // Normal range, every binade equally likely.
  for (int i = 0; i < 200000; ++i) {
    const int exponent =
        format.emin + static_cast<int>(next_bits() % static_cast<std::uint64_t>(format.emax - format.emin + 1));
    inputs.push_back(random_sign(std::ldexp(random_significand(), exponent)));
  }
  // Subnormal range, including magnitudes below half the smallest subnormal.
  const double min_subnormal_value = std::ldexp(1.0, format.emin - (format.precision - 1));
  for (int i = 0; i < 100000; ++i) {
    const double unit = std::ldexp(static_cast<double>(next_bits() >> 11), -53);  // [0, 1)
    const double scale = (i % 4 == 0) ? 2 * min_subnormal_value : std::ldexp(1.0, format.emin);
    inputs.push_back(random_sign(unit * scale));
  }
  // Overflow region: a few ULPs below the largest finite value up to 4x the next binade.
  const double max_value = format.value(format.max_finite_pattern);
  const double top_ulp = std::ldexp(1.0, format.emax - (format.precision - 1));
  for (int i = 0; i < 50000; ++i) {
    const double unit = std::ldexp(static_cast<double>(next_bits() >> 11), -53);
    const double low = max_value - 4 * top_ulp, high = 4 * format.overflow_value();
    inputs.push_back(random_sign(low + unit * (high - low)));
  }
  for (double huge : {1e10, 1e38, 3.5e38, 1e300, DBL_MAX}) {
    inputs.push_back(huge);
    inputs.push_back(-huge);
  }
  // Arbitrary binary64 bit patterns (NaNs are left out: they have their own test).
  for (int i = 0; i < 100000; ++i) {
    const double x = std::bit_cast<double>(next_bits());
    if (!std::isnan(x)) inputs.push_back(x);
  }
  // Binary64 subnormals and the smallest normals: far below any 16-bit subnormal.
  for (int i = 0; i < 1000; ++i) {
    inputs.push_back(random_sign(std::bit_cast<double>(next_bits() >> 12)));
    inputs.push_back(random_sign(DBL_MIN * random_significand()));
  }
  // Midpoints between adjacent finite values and the doubles on either side of them.
  for (int i = 0; i < 100000; ++i) {
    const auto below = static_cast<std::uint16_t>(next_bits() % format.max_finite_pattern);  // has a finite successor
    const double midpoint = (format.value(below) + format.value(static_cast<std::uint16_t>(below + 1))) / 2;
    for (double x : {midpoint, std::nextafter(midpoint, -kInf), std::nextafter(midpoint, kInf)})
      inputs.push_back(random_sign(x));
  }
  return inputs;
}

// ---- exhaustive decoding ------------------------------------------------------

TEST(DtypeTest, F16DecodeMatchesFloat16OnAllPatterns) {
  FailureLog failures;
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const double got = f16_bits_to_double(bits);
    const double want = gcc_f16_value(bits);
    if (f16_is_nan(bits)) {
      if (!std::isnan(got) || std::signbit(got) != std::signbit(want))
        failures.add(hex16(bits) + ": want NaN with sign " + std::to_string(std::signbit(want)) + ", got " +
                     describe(got));
    } else if (!same_double(got, want)) {
      failures.add(hex16(bits) + ": want " + describe(want) + ", got " + describe(got));
    }
  }
  EXPECT_EQ(failures.count(), 0) << "f16_bits_to_double differs from _Float16:\n" << failures.text();
}

TEST(DtypeTest, Bf16DecodeMatchesTopHalfOfFloatOnAllPatterns) {
  FailureLog failures;
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const double got = bf16_bits_to_double(bits);
    const double want = float_bf16_value(bits);
    if (bf16_is_nan(bits)) {
      if (!std::isnan(got) || std::signbit(got) != std::signbit(want))
        failures.add(hex16(bits) + ": want NaN with sign " + std::to_string(std::signbit(want)) + ", got " +
                     describe(got));
    } else if (!same_double(got, want)) {
      failures.add(hex16(bits) + ": want " + describe(want) + ", got " + describe(got));
    }
  }
  EXPECT_EQ(failures.count(), 0) << "bf16_bits_to_double differs from bit_cast<float>(bits << 16):\n"
                                 << failures.text();
}

// Every non-NaN pattern (±0, subnormals, normals, ±Inf) survives decode then encode.
void expect_round_trip(const HalfFormat& format) {
  FailureLog failures;
  std::int64_t checked = 0;
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    if (format.is_nan(bits)) continue;
    ++checked;
    const std::uint16_t back = subject_round(format, subject_value(format, bits));
    if (back != bits) failures.add(hex16(bits) + " -> " + describe(subject_value(format, bits)) + " -> " + hex16(back));
  }
  EXPECT_EQ(checked, 65536 - 2 * (0x7FFF - format.inf_pattern)) << format.name;
  EXPECT_EQ(failures.count(), 0) << format.name << " decode/encode round trip broken:\n" << failures.text();
}

TEST(DtypeTest, F16RoundTripsEveryNonNanPattern) { expect_round_trip(kF16); }
TEST(DtypeTest, Bf16RoundTripsEveryNonNanPattern) { expect_round_trip(kBF16); }

// ---- rounding of generated doubles ---------------------------------------------

TEST(DtypeTest, F16RoundingMatchesFloat16OnGeneratedDoubles) {
  const auto inputs = rounding_inputs(kF16, 2024);
  ASSERT_GT(inputs.size(), 700000u);
  FailureLog failures, reference_failures;
  for (double x : inputs) {
    const std::uint16_t want = gcc_f16_bits(x);
    const std::uint16_t got = f16_bits_from_double(x);
    if (got != want) failures.add(describe(x) + ": want " + hex16(want) + ", got " + hex16(got));
    // The brute-force reference must agree with _Float16 too, which validates it for bf16.
    const std::uint16_t brute = reference_round(kF16, x);
    if (brute != want) reference_failures.add(describe(x) + ": _Float16 " + hex16(want) + ", brute " + hex16(brute));
  }
  EXPECT_EQ(failures.count(), 0) << "f16_bits_from_double differs from (_Float16)x:\n" << failures.text();
  EXPECT_EQ(reference_failures.count(), 0) << "test reference disagrees with _Float16:\n" << reference_failures.text();
}

TEST(DtypeTest, Bf16RoundingMatchesBruteForceOnGeneratedDoubles) {
  const auto inputs = rounding_inputs(kBF16, 2024);
  ASSERT_GT(inputs.size(), 700000u);
  FailureLog failures;
  for (double x : inputs) {
    const std::uint16_t want = reference_round(kBF16, x);
    const std::uint16_t got = bf16_bits_from_double(x);
    if (got != want) failures.add(describe(x) + ": want " + hex16(want) + ", got " + hex16(got));
  }
  EXPECT_EQ(failures.count(), 0) << "bf16_bits_from_double differs from the brute-force reference:\n"
                                 << failures.text();
}

// For every pair of adjacent values a < b (both signs, including max -> Inf),
// the exact midpoint goes to the pattern with the even last bit, and the
// doubles just beside it to the nearer value.
void expect_midpoints_tie_to_even(const HalfFormat& format) {
  FailureLog failures;
  std::int64_t pairs = 0;
  for (std::uint32_t pattern = 0; pattern <= 0xFFFF; ++pattern) {
    const auto bits = static_cast<std::uint16_t>(pattern);
    const std::uint16_t magnitude_bits = bits & 0x7FFF;
    if (magnitude_bits > format.max_finite_pattern) continue;  // Inf and NaN have no successor
    const auto next = static_cast<std::uint16_t>(bits + 1);      // next larger magnitude, same sign
    const double sign = (bits & 0x8000) ? -1.0 : 1.0;
    const double a = sign * format.value(magnitude_bits);
    const double b = sign * format.magnitude(next & 0x7FFF);  // 2^(emax+1) stands for Inf
    const double midpoint = (a + b) / 2;
    ++pairs;
    const std::uint16_t even = (bits & 1) == 0 ? bits : next;
    const std::uint16_t at_mid = subject_round(format, midpoint);
    const std::uint16_t toward_a = subject_round(format, std::nextafter(midpoint, a));
    const std::uint16_t toward_b = subject_round(format, std::nextafter(midpoint, b));
    if (at_mid != even)
      failures.add("midpoint " + describe(midpoint) + " of " + hex16(bits) + "/" + hex16(next) + ": want " +
                   hex16(even) + ", got " + hex16(at_mid));
    if (toward_a != bits)
      failures.add("just inside " + hex16(bits) + " of midpoint " + describe(midpoint) + ": got " + hex16(toward_a));
    if (toward_b != next)
      failures.add("just inside " + hex16(next) + " of midpoint " + describe(midpoint) + ": got " + hex16(toward_b));
  }
  EXPECT_EQ(pairs, 2 * (format.max_finite_pattern + 1)) << format.name;
  EXPECT_EQ(failures.count(), 0) << format.name << " ties/near-ties wrong:\n" << failures.text();
}

TEST(DtypeTest, F16MidpointsOfAllAdjacentPairsTieToEven) { expect_midpoints_tie_to_even(kF16); }
TEST(DtypeTest, Bf16MidpointsOfAllAdjacentPairsTieToEven) { expect_midpoints_tie_to_even(kBF16); }

// The bit form for f32 inputs agrees with round_to on every 251st f32
// pattern (17 million, every binade, subnormals and both signs), on each
// pattern's neighbours and on the edges: zeros, the bf16 midpoints around 1,
// the overflow threshold, the infinities.
TEST(DtypeTest, Bf16RoundingOfAFloatOnItsBitsMatchesRoundTo) {
  const auto same = [](float x) {
    const float fast = round_to_bf16(x);
    const double slow = round_to(DType::bf16, static_cast<double>(x));
    if (std::isnan(slow)) return std::isnan(fast);
    return static_cast<double>(fast) == slow && std::signbit(fast) == std::signbit(slow);
  };
  std::int64_t differ = 0;
  for (std::uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 251)
    for (std::uint32_t near : {0u, 1u}) {
      const float x = std::bit_cast<float>(static_cast<std::uint32_t>(bits) + near);
      differ += !same(x);
    }
  for (float x : {0.0f, -0.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 0x1.fefffep127f, 0x1.ff0000p127f,
                  0x1.ff0002p127f, std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(), 0x1.00ff8p-126f})
    differ += !same(x);
  EXPECT_EQ(differ, 0);
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(DtypeTest, OverflowThresholdIsMaxPlusHalfUlp) {
  // f16: max 65504, ulp 32 -> threshold 65520.
  EXPECT_EQ(f16_bits_from_double(65519.999), 0x7BFF);
  EXPECT_EQ(f16_bits_from_double(65520.0), 0x7C00);
  EXPECT_EQ(f16_bits_from_double(-65520.0), 0xFC00);
  // bf16: max (2 - 2^-7) * 2^127, ulp 2^120 -> threshold max + 2^119.
  const double bf16_threshold = std::ldexp(2.0 - std::ldexp(1.0, -7), 127) + std::ldexp(1.0, 119);
  EXPECT_EQ(bf16_bits_from_double(std::nextafter(bf16_threshold, 0.0)), 0x7F7F);
  EXPECT_EQ(bf16_bits_from_double(bf16_threshold), 0x7F80);
  EXPECT_EQ(bf16_bits_from_double(-bf16_threshold), 0xFF80);
  // FLT_MAX itself is above the bf16 threshold.
  EXPECT_EQ(bf16_bits_from_double(FLT_MAX), 0x7F80);
}

// ---- single rounding ------------------------------------------------------------

TEST(DtypeTest, F64ToF16RoundsOnceNotThroughF32) {
  // Just above the tie between 1 and 1 + 2^-10: (float)x drops the 2^-40 and
  // lands exactly on the tie, which then goes to even (1.0). One rounding gives 1 + 2^-10.
  const std::vector<std::pair<double, std::uint16_t>> cases = {
      {1.0 + 0x1p-11 + 0x1p-40, 0x3C01},
      {-(1.0 + 0x1p-11 + 0x1p-40), 0xBC01},
      {0x1p-25 + 0x1p-60, 0x0001},            // subnormal: above half of 2^-24, float rounds to the tie
      {1.0 + 0x1p-10 + 0x1p-11 - 0x1p-40, 0x3C01},  // just below a tie that would round up to even
  };
  for (const auto& [x, want] : cases) {
    const std::uint16_t via_float = gcc_f16_bits(static_cast<double>(static_cast<float>(x)));
    ASSERT_EQ(gcc_f16_bits(x), want) << describe(x) << ": the test's expectation is wrong";
    ASSERT_NE(via_float, want) << describe(x) << " is not a double-rounding case";
    EXPECT_EQ(f16_bits_from_double(x), want)
        << describe(x) << ": want " << hex16(want) << " (one rounding), got " << hex16(f16_bits_from_double(x))
        << "; rounding through f32 would give " << hex16(via_float);
  }

  // And over generated near-midpoint inputs: the double-rounding cases exist and
  // every one of them is converted correctly.
  const CounterRng rng(7, 0);
  std::int64_t double_rounding_cases = 0;
  FailureLog failures;
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const auto below = static_cast<std::uint16_t>(rng.bits(i) % 0x7BFF);
    const double midpoint = (gcc_f16_value(below) + gcc_f16_value(static_cast<std::uint16_t>(below + 1))) / 2;
    // Offsets below half an f32 ULP of the midpoint, so (float)x == midpoint.
    const double offset = std::ldexp(std::fabs(midpoint), -30) * (1.0 + rng.uniform(i + 1000000));
    for (double x : {midpoint + offset, midpoint - offset}) {
      if (gcc_f16_bits(static_cast<double>(static_cast<float>(x))) == gcc_f16_bits(x)) continue;
      ++double_rounding_cases;
      if (f16_bits_from_double(x) != gcc_f16_bits(x))
        failures.add(describe(x) + ": want " + hex16(gcc_f16_bits(x)) + ", got " + hex16(f16_bits_from_double(x)));
    }
  }
  EXPECT_GT(double_rounding_cases, 10000);
  EXPECT_EQ(failures.count(), 0) << failures.text();
}

TEST(DtypeTest, F64ToBf16RoundsOnceNotThroughF32) {
  // 1 + 2^-8 is the tie between 1 and 1 + 2^-7; 2^-30 is lost by (float)x.
  const double x = 1.0 + 0x1p-8 + 0x1p-30;
  ASSERT_EQ(static_cast<double>(static_cast<float>(x)), 1.0 + 0x1p-8);
  ASSERT_EQ(reference_round(kBF16, 1.0 + 0x1p-8), 0x3F80);  // through f32: the tie goes to even
  EXPECT_EQ(reference_round(kBF16, x), 0x3F81);
  EXPECT_EQ(bf16_bits_from_double(x), 0x3F81) << describe(x) << ": got " << hex16(bf16_bits_from_double(x));
  EXPECT_EQ(bf16_bits_from_double(-x), 0xBF81) << describe(-x) << ": got " << hex16(bf16_bits_from_double(-x));
}

// ---- special values -----------------------------------------------------------------

TEST(DtypeTest, SignedZerosKeepTheirSign) {
  EXPECT_EQ(f16_bits_from_double(0.0), 0x0000);
  EXPECT_EQ(f16_bits_from_double(-0.0), 0x8000);
  EXPECT_EQ(bf16_bits_from_double(0.0), 0x0000);
  EXPECT_EQ(bf16_bits_from_double(-0.0), 0x8000);
  // Underflow keeps the sign too.
  EXPECT_EQ(f16_bits_from_double(-1e-30), 0x8000);
  EXPECT_EQ(bf16_bits_from_double(-1e-300), 0x8000);
  EXPECT_EQ(f16_bits_from_double(-std::numeric_limits<double>::denorm_min()), 0x8000);
  for (DType dtype : {DType::f16, DType::bf16}) {
    const double negative_zero = half_bits_to_double(dtype, 0x8000);
    EXPECT_EQ(negative_zero, 0.0) << to_string(dtype);
    EXPECT_TRUE(std::signbit(negative_zero)) << to_string(dtype);
    EXPECT_FALSE(std::signbit(half_bits_to_double(dtype, 0x0000))) << to_string(dtype);
    EXPECT_TRUE(std::signbit(round_to(dtype, -0.0))) << to_string(dtype);
  }
  EXPECT_TRUE(std::signbit(round_to(DType::f32, -0.0)));
}

TEST(DtypeTest, NanBecomesQuietNanOfTheSameSign) {
  const double quiet = std::numeric_limits<double>::quiet_NaN();
  const double signaling = std::numeric_limits<double>::signaling_NaN();
  const double payload = std::bit_cast<double>(0x7FF0000000000001ull);  // signaling, low payload bit only
  for (const HalfFormat* format : {&kF16, &kBF16}) {
    for (double nan : {quiet, signaling, payload}) {
      for (double x : {nan, -nan}) {
        const std::uint16_t bits = subject_round(*format, x);
        EXPECT_TRUE(format->is_nan(bits)) << format->name << " " << describe(x) << " -> " << hex16(bits);
        EXPECT_NE(bits & format->quiet_bit, 0) << format->name << " " << describe(x) << " -> " << hex16(bits)
                                               << " is not quiet";
        EXPECT_EQ((bits & 0x8000) != 0, std::signbit(x)) << format->name << " " << describe(x) << " -> " << hex16(bits);
      }
    }
    EXPECT_TRUE(std::isnan(round_to(format->dtype, quiet))) << format->name;
    EXPECT_TRUE(std::isnan(subject_value(*format, format->inf_pattern | format->quiet_bit))) << format->name;
  }
  EXPECT_TRUE(std::isnan(round_to(DType::f32, quiet)));
}

TEST(DtypeTest, InfinitiesMapToInfinities) {
  EXPECT_EQ(f16_bits_from_double(kInf), 0x7C00);
  EXPECT_EQ(f16_bits_from_double(-kInf), 0xFC00);
  EXPECT_EQ(bf16_bits_from_double(kInf), 0x7F80);
  EXPECT_EQ(bf16_bits_from_double(-kInf), 0xFF80);
  EXPECT_EQ(f16_bits_to_double(0x7C00), kInf);
  EXPECT_EQ(f16_bits_to_double(0xFC00), -kInf);
  EXPECT_EQ(bf16_bits_to_double(0x7F80), kInf);
  EXPECT_EQ(bf16_bits_to_double(0xFF80), -kInf);
  EXPECT_EQ(f16_bits_from_double(DBL_MAX), 0x7C00);
  EXPECT_EQ(bf16_bits_from_double(-DBL_MAX), 0xFF80);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    EXPECT_EQ(round_to(dtype, kInf), kInf) << to_string(dtype);
    EXPECT_EQ(round_to(dtype, -kInf), -kInf) << to_string(dtype);
  }
}

TEST(DtypeTest, FormatConstants) {
  EXPECT_EQ(max_finite(DType::f16), 65504.0);
  EXPECT_EQ(min_normal(DType::f16), 0x1p-14);
  EXPECT_EQ(min_subnormal(DType::f16), 0x1p-24);
  EXPECT_EQ(unit_roundoff(DType::f16), 0x1p-11);

  EXPECT_EQ(max_finite(DType::bf16), (2.0 - 0x1p-7) * 0x1p127);
  EXPECT_NEAR(max_finite(DType::bf16), 3.3895e38, 0.0001e38);
  EXPECT_EQ(min_normal(DType::bf16), 0x1p-126);
  EXPECT_EQ(min_subnormal(DType::bf16), 0x1p-133);
  EXPECT_EQ(unit_roundoff(DType::bf16), 0x1p-8);

  EXPECT_EQ(max_finite(DType::f32), static_cast<double>(FLT_MAX));
  EXPECT_EQ(min_normal(DType::f32), static_cast<double>(FLT_MIN));
  EXPECT_EQ(min_subnormal(DType::f32), static_cast<double>(std::numeric_limits<float>::denorm_min()));
  EXPECT_EQ(unit_roundoff(DType::f32), 0x1p-24);

  // The constants are the values of the extreme patterns.
  EXPECT_EQ(max_finite(DType::f16), gcc_f16_value(0x7BFF));
  EXPECT_EQ(min_normal(DType::f16), gcc_f16_value(0x0400));
  EXPECT_EQ(min_subnormal(DType::f16), gcc_f16_value(0x0001));
  EXPECT_EQ(max_finite(DType::bf16), float_bf16_value(0x7F7F));
  EXPECT_EQ(min_normal(DType::bf16), float_bf16_value(0x0080));
  EXPECT_EQ(min_subnormal(DType::bf16), float_bf16_value(0x0001));

  EXPECT_EQ(storage_bytes(DType::f32), 4);
  EXPECT_EQ(storage_bytes(DType::f16), 2);
  EXPECT_EQ(storage_bytes(DType::bf16), 2);
}

// ---- round_to, ulp_at, ulp_distance ---------------------------------------------------

TEST(DtypeTest, RoundToEachDtype) {
  // f32: ties to even at 1 + 2^-24 (down) and 1 + 3 * 2^-24 (up); a hair above a tie goes up.
  EXPECT_EQ(round_to(DType::f32, 1.0 + 0x1p-24), 1.0);
  EXPECT_EQ(round_to(DType::f32, 1.0 + 3 * 0x1p-24), 1.0 + 0x1p-22);
  EXPECT_EQ(round_to(DType::f32, 1.0 + 0x1p-24 + 0x1p-50), 1.0 + 0x1p-23);
  EXPECT_EQ(round_to(DType::f32, 0x1p-150), 0.0);                        // half the smallest subnormal: tie to 0
  EXPECT_EQ(round_to(DType::f32, 0x1p-150 + 0x1p-170), 0x1p-149);
  EXPECT_EQ(round_to(DType::f32, static_cast<double>(FLT_MAX) + 0x1p103), kInf);  // max + half ulp
  EXPECT_EQ(round_to(DType::f32, std::nextafter(static_cast<double>(FLT_MAX) + 0x1p103, 0.0)),
            static_cast<double>(FLT_MAX));
  // f16 and bf16 at the same kind of points.
  EXPECT_EQ(round_to(DType::f16, 1.0 + 0x1p-11), 1.0);
  EXPECT_EQ(round_to(DType::f16, 1.0 + 3 * 0x1p-11), 1.0 + 0x1p-9);
  EXPECT_EQ(round_to(DType::f16, 70000.0), kInf);
  EXPECT_EQ(round_to(DType::f16, 3e-8), 0x1p-24);
  EXPECT_EQ(round_to(DType::bf16, 1.0 + 0x1p-8), 1.0);
  EXPECT_EQ(round_to(DType::bf16, 1.0 + 3 * 0x1p-8), 1.0 + 0x1p-6);
  EXPECT_EQ(round_to(DType::bf16, 3.4e38), kInf);
  EXPECT_EQ(round_to(DType::bf16, 1.0 / 3.0), float_bf16_value(0x3EAB));  // 0.333984375

  // Generated values: round_to agrees with the independent references.
  const CounterRng rng(99, 3);
  FailureLog failures;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    const double x = rng.normal(i) * std::ldexp(1.0, static_cast<int>(rng.bits(i + (1ull << 40)) % 60) - 30);
    const double f16_want = gcc_f16_value(gcc_f16_bits(x));
    const double bf16_want = float_bf16_value(reference_round(kBF16, x));
    const double f32_want = static_cast<double>(static_cast<float>(x));
    if (!same_double(round_to(DType::f16, x), f16_want))
      failures.add("f16 " + describe(x) + ": want " + describe(f16_want) + ", got " + describe(round_to(DType::f16, x)));
    if (!same_double(round_to(DType::bf16, x), bf16_want))
      failures.add("bf16 " + describe(x) + ": want " + describe(bf16_want) + ", got " +
                   describe(round_to(DType::bf16, x)));
    if (!same_double(round_to(DType::f32, x), f32_want))
      failures.add("f32 " + describe(x) + ": want " + describe(f32_want) + ", got " + describe(round_to(DType::f32, x)));
  }
  EXPECT_EQ(failures.count(), 0) << failures.text();
}

TEST(DtypeTest, HalfBitsDispatchOnDtype) {
  const double third = 1.0 / 3.0;
  EXPECT_EQ(half_bits_from_double(DType::f16, third), gcc_f16_bits(third));
  EXPECT_EQ(half_bits_from_double(DType::bf16, third), 0x3EAB);
  EXPECT_EQ(half_bits_to_double(DType::f16, 0x3555), gcc_f16_value(0x3555));
  EXPECT_EQ(half_bits_to_double(DType::bf16, 0x3EAB), float_bf16_value(0x3EAB));
}

TEST(DtypeTest, UlpAtKnownPoints) {
  EXPECT_EQ(ulp_at(DType::f16, 1.0), 0x1p-10);
  EXPECT_EQ(ulp_at(DType::f16, -1.0), 0x1p-10);
  EXPECT_EQ(ulp_at(DType::f16, 0.999), 0x1p-11);
  EXPECT_EQ(ulp_at(DType::f16, 65504.0), 32.0);
  EXPECT_EQ(ulp_at(DType::f16, 1e-6), 0x1p-24);  // subnormal spacing
  EXPECT_EQ(ulp_at(DType::f16, 0.0), 0x1p-24);
  EXPECT_EQ(ulp_at(DType::bf16, 1.0), 0x1p-7);
  EXPECT_EQ(ulp_at(DType::bf16, 3.0), 0x1p-6);
  EXPECT_EQ(ulp_at(DType::bf16, 1e-39), 0x1p-133);
  EXPECT_EQ(ulp_at(DType::f32, 1.0), 0x1p-23);
  EXPECT_EQ(ulp_at(DType::f32, static_cast<double>(FLT_MAX)), 0x1p104);
  EXPECT_EQ(ulp_at(DType::f32, 1e-40), 0x1p-149);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    EXPECT_EQ(ulp_at(dtype, kInf), kInf) << to_string(dtype);
    EXPECT_EQ(ulp_at(dtype, -kInf), kInf) << to_string(dtype);
  }
}

// ulp_at(v) is the gap from v to the next larger value, for every finite
// non-negative pattern but the largest, and the same at the midpoint of that gap.
void expect_ulp_is_gap(const HalfFormat& format) {
  FailureLog failures;
  for (std::uint16_t bits = 0; bits < format.max_finite_pattern; ++bits) {
    const double value = format.value(bits), next = format.value(static_cast<std::uint16_t>(bits + 1));
    const double gap = next - value;
    for (double x : {value, -value, (value + next) / 2}) {
      if (ulp_at(format.dtype, x) != gap)
        failures.add(hex16(bits) + " at " + describe(x) + ": want gap " + describe(gap) + ", got " +
                     describe(ulp_at(format.dtype, x)));
    }
  }
  EXPECT_EQ(failures.count(), 0) << format.name << " ulp_at is not the gap:\n" << failures.text();
}

TEST(DtypeTest, F16UlpAtIsTheGapToTheNextValue) { expect_ulp_is_gap(kF16); }
TEST(DtypeTest, Bf16UlpAtIsTheGapToTheNextValue) { expect_ulp_is_gap(kBF16); }

TEST(DtypeTest, F32UlpAtIsTheGapToTheNextValue) {
  const CounterRng rng(5, 32);
  FailureLog failures;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    const auto value = std::bit_cast<float>(static_cast<std::uint32_t>(rng.bits(i) % 0x7F7FFFFFu));  // finite, < max
    const double gap = static_cast<double>(std::nextafter(value, std::numeric_limits<float>::infinity())) -
                       static_cast<double>(value);
    if (ulp_at(DType::f32, value) != gap)
      failures.add(describe(value) + ": want " + describe(gap) + ", got " + describe(ulp_at(DType::f32, value)));
  }
  EXPECT_EQ(failures.count(), 0) << failures.text();
}

TEST(DtypeTest, UlpDistanceOfCorrectlyRoundedValuesIsAtMostHalf) {
  const CounterRng rng(11, 4);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    FailureLog failures;
    double largest = 0;
    for (std::uint64_t i = 0; i < 100000; ++i) {
      // Magnitudes across the normal and subnormal ranges of the dtype, below its max.
      const double unit = rng.uniform(i);
      const double x = (i % 2 ? -1 : 1) * std::exp2(std::log2(min_subnormal(dtype)) +
                                                    unit * (std::log2(max_finite(dtype)) - std::log2(min_subnormal(dtype))));
      if (!(std::fabs(x) <= max_finite(dtype))) continue;
      const double rounded = round_to(dtype, x);
      const double distance = ulp_distance(dtype, rounded, x);
      largest = std::max(largest, distance);
      if (!(distance <= 0.5)) failures.add(std::string(to_string(dtype)) + " " + describe(x) + ": distance " +
                                           std::to_string(distance));
      // The neighbour on the other side of x is at least half an ULP away.
      const double other = rounded >= x ? rounded - ulp_at(dtype, x) : rounded + ulp_at(dtype, x);
      if (std::fabs(x) >= min_normal(dtype) * 2 && !(ulp_distance(dtype, other, x) >= 0.5))
        failures.add(std::string(to_string(dtype)) + " neighbour of " + describe(x) + " closer than half an ULP");
    }
    EXPECT_EQ(failures.count(), 0) << failures.text();
    EXPECT_GT(largest, 0.45) << to_string(dtype) << ": samples never came near half an ULP";
  }
}

TEST(DtypeTest, UlpDistanceSpecialCases) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const char* name = to_string(dtype).data();
    EXPECT_EQ(ulp_distance(dtype, 1.0, 1.0), 0.0) << name;
    EXPECT_EQ(ulp_distance(dtype, 1.0 + ulp_at(dtype, 1.0), 1.0), 1.0) << name;
    EXPECT_EQ(ulp_distance(dtype, 1.0 - ulp_at(dtype, 1.0), 1.0), 1.0) << name;  // measured at ref, not at x
    EXPECT_EQ(ulp_distance(dtype, -1e-3, 1e-3), kInf) << name;
    EXPECT_EQ(ulp_distance(dtype, 2.0, -2.0), kInf) << name;
    EXPECT_EQ(ulp_distance(dtype, nan, nan), 0.0) << name;
    EXPECT_EQ(ulp_distance(dtype, nan, 1.0), kInf) << name;
    EXPECT_EQ(ulp_distance(dtype, 1.0, nan), kInf) << name;
    EXPECT_EQ(ulp_distance(dtype, kInf, kInf), 0.0) << name;
    EXPECT_EQ(ulp_distance(dtype, -kInf, -kInf), 0.0) << name;
    EXPECT_EQ(ulp_distance(dtype, kInf, -kInf), kInf) << name;
    EXPECT_EQ(ulp_distance(dtype, max_finite(dtype), kInf), kInf) << name;
    EXPECT_EQ(ulp_distance(dtype, kInf, max_finite(dtype)), kInf) << name;
    EXPECT_EQ(ulp_distance(dtype, -0.0, 0.0), 0.0) << name;  // zeros have no sign to mismatch
    EXPECT_EQ(ulp_distance(dtype, 0.0, min_subnormal(dtype)), 1.0) << name;
  }
  EXPECT_EQ(ulp_distance(DType::bf16, 1.5, 1.0), 64.0);
  EXPECT_EQ(ulp_distance(DType::f16, 1.5, 1.0), 512.0);
}

// ---- names ---------------------------------------------------------------------------

TEST(DtypeTest, NamesRoundTrip) {
  for (DType dtype : kDTypes) {
    const auto parsed = parse_dtype(to_string(dtype));
    ASSERT_TRUE(parsed.has_value()) << to_string(dtype);
    EXPECT_EQ(*parsed, dtype) << to_string(dtype);
  }
  EXPECT_EQ(to_string(DType::f32), "f32");
  EXPECT_EQ(to_string(DType::f16), "f16");
  EXPECT_EQ(to_string(DType::bf16), "bf16");
  EXPECT_EQ(to_string(DType::e4m3), "e4m3");
  EXPECT_EQ(to_string(DType::e5m2), "e5m2");
}

// An fp8 descale is the least power of two that holds amax.
TEST(DtypeTest, Fp8DescaleIsTheLeastPowerOfTwoThatHoldsAmax) {
  EXPECT_EQ(fp8_descale_for(DType::e4m3, 448.0), 1.0);
  EXPECT_EQ(fp8_descale_for(DType::e4m3, 448.5), 2.0);
  EXPECT_EQ(fp8_descale_for(DType::e4m3, 224.0), 0.5);
  EXPECT_EQ(fp8_descale_for(DType::e4m3, 4.5), 0x1p-6);  // 4.5 / 448 = 0.01: 2^-6 = 0.0156 holds it, 2^-7 does not
  EXPECT_EQ(fp8_descale_for(DType::e5m2, 57344.0 * 8), 8.0);
  for (double amax : {1e-30, 3.0, 1000.0, 7e8}) {
    const double d = fp8_descale_for(DType::e4m3, amax);
    EXPECT_LE(amax, 448 * d) << amax;
    EXPECT_GT(amax, 448 * d / 2) << amax;
  }
}

// The fp8 storage dtypes' limits, one byte each, and O in bf16.
TEST(DtypeTest, Fp8StorageDtypesHaveTheFormatsLimits) {
  EXPECT_EQ(storage_bytes(DType::e4m3), 1);
  EXPECT_EQ(storage_bytes(DType::e5m2), 1);
  EXPECT_EQ(max_finite(DType::e4m3), 448.0);
  EXPECT_EQ(max_finite(DType::e5m2), 57344.0);
  EXPECT_EQ(min_normal(DType::e4m3), 0x1p-6);
  EXPECT_EQ(min_normal(DType::e5m2), 0x1p-14);
  EXPECT_EQ(min_subnormal(DType::e4m3), 0x1p-9);
  EXPECT_EQ(min_subnormal(DType::e5m2), 0x1p-16);
  EXPECT_EQ(unit_roundoff(DType::e4m3), 0x1p-4);
  EXPECT_EQ(unit_roundoff(DType::e5m2), 0x1p-3);
  EXPECT_EQ(ulp_at(DType::e4m3, 300.0), 32.0);
  EXPECT_EQ(ulp_at(DType::e5m2, 1.0), 0.25);
  // round_to saturates, as cvt.rn.satfinite does; NaN stays NaN.
  EXPECT_EQ(round_to(DType::e4m3, 1e6), 448.0);
  EXPECT_EQ(round_to(DType::e4m3, -INFINITY), -448.0);
  EXPECT_EQ(round_to(DType::e5m2, INFINITY), 57344.0);
  EXPECT_EQ(round_to(DType::e4m3, 1.0 + 0x1p-4), 1.0);  // a tie, to even
  EXPECT_EQ(round_to(DType::e4m3, 1.0 + 0x1p-4 + 0x1p-20), 1.125);
  EXPECT_TRUE(std::isnan(round_to(DType::e5m2, NAN)));
  EXPECT_TRUE(is_fp8(DType::e4m3) && is_fp8(DType::e5m2) && !is_fp8(DType::bf16));
  EXPECT_EQ(output_dtype(DType::e4m3), DType::bf16);
  EXPECT_EQ(output_dtype(DType::e5m2), DType::bf16);
  EXPECT_EQ(output_dtype(DType::f16), DType::f16);
}

TEST(DtypeTest, UnknownNamesAreRejected) {
  for (const char* name : {"", "fp16", "F16", "float16", "bfloat16", "bf16 ", " f32", "f64", "fp8", "half", "E4M3",
                           "e4m3fn", "fp8_e5m2"})
    EXPECT_FALSE(parse_dtype(name).has_value()) << "'" << name << "' parsed";
}

// ---- FP8 (E4M3, E5M2) ------------------------------------------------------------

// The OCP FP8 specification's landmarks, pattern by pattern.
TEST(DtypeTest, Fp8PatternsHaveTheSpecifiedValues) {
  EXPECT_EQ(e4m3_bits_to_double(0x7E), 448.0);                 // S.1111.110: the largest
  EXPECT_EQ(e4m3_bits_to_double(0x08), std::ldexp(1.0, -6));   // the smallest normal
  EXPECT_EQ(e4m3_bits_to_double(0x01), std::ldexp(1.0, -9));   // the smallest subnormal
  EXPECT_EQ(e4m3_bits_to_double(0x38), 1.0);
  EXPECT_EQ(e4m3_bits_to_double(0xBC), -1.5);
  EXPECT_TRUE(std::isnan(e4m3_bits_to_double(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_bits_to_double(0xFF)));
  EXPECT_TRUE(std::signbit(e4m3_bits_to_double(0xFF)));
  EXPECT_EQ(e4m3_bits_to_double(0x78), 256.0);  // exponent 15 holds numbers in E4M3
  EXPECT_EQ(e5m2_bits_to_double(0x7B), 57344.0);
  EXPECT_EQ(e5m2_bits_to_double(0x04), std::ldexp(1.0, -14));
  EXPECT_EQ(e5m2_bits_to_double(0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(e5m2_bits_to_double(0x3C), 1.0);
  EXPECT_EQ(e5m2_bits_to_double(0x7C), std::numeric_limits<double>::infinity());
  EXPECT_EQ(e5m2_bits_to_double(0xFC), -std::numeric_limits<double>::infinity());
  for (int bits : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}) EXPECT_TRUE(std::isnan(e5m2_bits_to_double(bits))) << bits;
  EXPECT_TRUE(std::signbit(e4m3_bits_to_double(0x80)));  // -0
  EXPECT_EQ(e4m3_bits_to_double(0x80), 0.0);
}

// Every pattern that is a number encodes back to itself; the values increase
// with the pattern; each value is an exact multiple of its binade's spacing.
TEST(DtypeTest, Fp8RoundTripsEveryNumberPattern) {
  for (int bits = 0; bits < 256; ++bits) {
    const auto b = static_cast<std::uint8_t>(bits);
    const double x4 = e4m3_bits_to_double(b), x5 = e5m2_bits_to_double(b);
    if (!std::isnan(x4)) EXPECT_EQ(e4m3_bits_from_double(x4), b) << bits;
    if (std::isfinite(x5)) EXPECT_EQ(e5m2_bits_from_double(x5), b) << bits;
    if (bits > 0 && bits < 0x7F) EXPECT_GT(x4, e4m3_bits_to_double(static_cast<std::uint8_t>(bits - 1))) << bits;
    if (bits > 0 && bits < 0x7C) EXPECT_GT(x5, e5m2_bits_to_double(static_cast<std::uint8_t>(bits - 1))) << bits;
  }
}

// Between two neighbours: below the midpoint the lower, above it the upper,
// at it the even pattern; past the largest (infinity included) the largest,
// with the sign: PTX's cvt.rn.satfinite.
TEST(DtypeTest, Fp8RoundsToNearestEvenAndSaturates) {
  struct Format {
    const char* name;
    std::uint8_t (*encode)(double);
    double (*decode)(std::uint8_t);
    int finite;
  };
  for (const Format& f : {Format{"e4m3", e4m3_bits_from_double, e4m3_bits_to_double, 0x7F},
                          Format{"e5m2", e5m2_bits_from_double, e5m2_bits_to_double, 0x7C}}) {
    SCOPED_TRACE(f.name);
    for (int bits = 0; bits + 1 < f.finite; ++bits) {
      const double low = f.decode(static_cast<std::uint8_t>(bits)), high = f.decode(static_cast<std::uint8_t>(bits + 1));
      const double midpoint = (low + high) / 2;
      const int even = bits % 2 == 0 ? bits : bits + 1;
      EXPECT_EQ(f.encode(midpoint), even) << midpoint;
      EXPECT_EQ(f.encode(-midpoint), 0x80 | even) << midpoint;
      EXPECT_EQ(f.encode(std::nextafter(midpoint, low)), bits) << midpoint;
      EXPECT_EQ(f.encode(std::nextafter(midpoint, high)), bits + 1) << midpoint;
    }
    const double largest = f.decode(static_cast<std::uint8_t>(f.finite - 1));
    for (const double past : {std::nextafter(largest, 1e300), largest * 1.07, largest * 4, 1e300,
                              std::numeric_limits<double>::infinity()}) {
      EXPECT_EQ(f.encode(past), f.finite - 1) << past;
      EXPECT_EQ(f.encode(-past), 0x80 | (f.finite - 1)) << past;
    }
    EXPECT_TRUE(std::isnan(f.decode(f.encode(std::numeric_limits<double>::quiet_NaN()))));
    EXPECT_EQ(f.encode(0.0), 0);
    EXPECT_EQ(f.encode(-0.0), 0x80);
    const double smallest = f.decode(1);
    EXPECT_EQ(f.encode(smallest / 2), 0);  // a tie: to the even pattern, zero
    EXPECT_EQ(f.encode(std::nextafter(smallest / 2, 1.0)), 1);
    EXPECT_EQ(f.encode(1e-300), 0);
  }
}

// On random doubles of every binade from below the smallest subnormal to past
// the largest: the result is no farther from x than either neighbour of the
// pattern chosen, and has x's sign.
TEST(DtypeTest, Fp8PicksTheNearerNeighbourOnRandomDoubles) {
  const CounterRng rng(20261126, 8);
  for (std::uint64_t n = 0; n < 200000; ++n) {
    const double x = std::ldexp(rng.uniform(3 * n), static_cast<int>(rng.bits(3 * n + 1) % 40) - 24) *
                     ((rng.bits(3 * n + 2) & 1) ? -1 : 1);
    using Encode = std::uint8_t (*)(double);
    using Decode = double (*)(std::uint8_t);
    for (const auto& [encode, decode] : {std::pair<Encode, Decode>{e4m3_bits_from_double, e4m3_bits_to_double},
                                         std::pair<Encode, Decode>{e5m2_bits_from_double, e5m2_bits_to_double}}) {
      const std::uint8_t bits = encode(x);
      const double got = decode(bits);
      if (std::fabs(x) >= std::fabs(decode(encode(1e300)))) continue;  // saturated: checked above
      const std::uint8_t magnitude = bits & 0x7F;
      const double below = magnitude > 0 ? decode(static_cast<std::uint8_t>(magnitude - 1)) : 0.0;
      double above = decode(static_cast<std::uint8_t>(magnitude + 1));  // past the largest: NaN or Inf, no neighbour
      if (!std::isfinite(above)) above = std::numeric_limits<double>::infinity();
      EXPECT_LE(std::fabs(std::fabs(x) - std::fabs(got)), std::fabs(std::fabs(x) - below)) << x;
      EXPECT_LE(std::fabs(std::fabs(x) - std::fabs(got)), std::fabs(above - std::fabs(x))) << x;
      EXPECT_EQ(std::signbit(got), std::signbit(x)) << x;
    }
  }
}

}  // namespace
}  // namespace flashcheck
