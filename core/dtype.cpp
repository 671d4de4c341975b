#include "flashcheck/core/dtype.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace flashcheck {
namespace {

// A binary floating-point format with `kExpBits` exponent bits and `kManBits`
// stored fraction bits, IEEE-style (bias, subnormals, Inf/NaN at the top exponent).
template <int kExpBits, int kManBits>
struct Format {
  static constexpr int bias = (1 << (kExpBits - 1)) - 1;
  static constexpr std::uint32_t exp_all_ones = (1u << kExpBits) - 1;
  static constexpr std::uint32_t sign_bit = 1u << (kExpBits + kManBits);
  static constexpr std::uint32_t man_mask = (1u << kManBits) - 1;

  // Round-to-nearest-even encoding straight from the binary64 bits, so that
  // there is exactly one rounding.
  static std::uint32_t encode(double x) {
    const auto bits = std::bit_cast<std::uint64_t>(x);
    const std::uint32_t sign = (bits >> 63) ? sign_bit : 0;
    const auto dexp = static_cast<std::int64_t>((bits >> 52) & 0x7FF);
    const std::uint64_t dman = bits & ((std::uint64_t{1} << 52) - 1);
    if (dexp == 0x7FF) {
      if (dman == 0) return sign | (exp_all_ones << kManBits);            // +-Inf
      return sign | (exp_all_ones << kManBits) | (1u << (kManBits - 1));  // quiet NaN
    }
    // Binary64 subnormals (< 2^-1022) are far below half the smallest
    // subnormal of any narrower format here: they round to a signed zero.
    if (dexp == 0) return sign;
    const std::uint64_t significand = dman | (std::uint64_t{1} << 52);  // value = sig * 2^(e - 52)
    const std::int64_t target_exp = dexp - 1023 + bias;
    // Low bits of the 53-bit significand that do not fit the target.
    std::int64_t shift = 52 - kManBits;
    if (target_exp < 1) shift += 1 - target_exp;  // result is subnormal (or zero)
    if (shift > 63) return sign;
    std::uint64_t kept = significand >> shift;
    const std::uint64_t rest = significand & ((std::uint64_t{1} << shift) - 1);
    const std::uint64_t half = std::uint64_t{1} << (shift - 1);
    if (rest > half || (rest == half && (kept & 1))) ++kept;
    if (target_exp < 1) {
      // Subnormal: `kept` is the fraction field; a carry into bit kManBits is
      // exactly the encoding of the smallest normal.
      return sign | static_cast<std::uint32_t>(kept);
    }
    std::int64_t exp_field = target_exp;
    if (kept >> (kManBits + 1)) {  // the rounding carried into a new binade
      kept >>= 1;
      ++exp_field;
    }
    if (exp_field >= static_cast<std::int64_t>(exp_all_ones)) return sign | (exp_all_ones << kManBits);
    return sign | (static_cast<std::uint32_t>(exp_field) << kManBits) |
           (static_cast<std::uint32_t>(kept) & man_mask);
  }

  // Decoding moves the fields into binary64's (dtype.hpp: detail::decode_binary).
  static double decode(std::uint32_t bits) { return detail::decode_binary<kExpBits, kManBits>(bits); }
};

using F16 = Format<5, 10>;
using BF16 = Format<8, 7>;

struct Limits {
  int precision;  // significand bits including the implicit one
  int emin;       // exponent of the smallest normal
  int emax;       // exponent of the largest binade
};

constexpr Limits limits_of(DType dtype) {
  switch (dtype) {
    case DType::f16: return {11, -14, 15};
    case DType::bf16: return {8, -126, 127};
    case DType::e4m3: return {4, -6, 8};
    case DType::e5m2: return {3, -14, 15};
    case DType::f32: break;
  }
  return {24, -126, 127};
}

}  // namespace

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view text) {
  if (text == "f32") return DType::f32;
  if (text == "f16") return DType::f16;
  if (text == "bf16") return DType::bf16;
  if (text == "e4m3") return DType::e4m3;
  if (text == "e5m2") return DType::e5m2;
  return std::nullopt;
}

int storage_bytes(DType dtype) { return dtype == DType::f32 ? 4 : is_fp8(dtype) ? 1 : 2; }

double unit_roundoff(DType dtype) { return std::ldexp(1.0, -limits_of(dtype).precision); }

double max_finite(DType dtype) {
  if (dtype == DType::e4m3) return 448;  // S.1111.111 is NaN: the top binade stops at 1.75 x 2^8
  const Limits l = limits_of(dtype);
  return std::ldexp(2.0 - std::ldexp(1.0, 1 - l.precision), l.emax);
}

double fp8_descale_for(DType dtype, double amax) {
  int exponent = 0;
  const double fraction = std::frexp(amax / max_finite(dtype), &exponent);  // fraction in [0.5, 1)
  return std::ldexp(1.0, fraction == 0.5 ? exponent - 1 : exponent);
}

double min_normal(DType dtype) { return std::ldexp(1.0, limits_of(dtype).emin); }

double min_subnormal(DType dtype) {
  const Limits l = limits_of(dtype);
  return std::ldexp(1.0, l.emin - (l.precision - 1));
}

namespace {

// 2^k for k in the normal exponents of a double, built from its bits (the
// comparison takes one ulp per element: ldexp's scalbn alone was 2% of a CPU
// property test's profile).
double power_of_two(int k) { return std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52); }

}  // namespace

double ulp_at(DType dtype, double x) {
  const Limits l = limits_of(dtype);
  const double magnitude = std::fabs(x);
  if (!std::isfinite(magnitude)) return std::numeric_limits<double>::infinity();
  if (magnitude < power_of_two(l.emin)) return power_of_two(l.emin - (l.precision - 1));  // the subnormals' spacing
  // magnitude is normal in the dtype, so in a double too: its binade from the exponent bits.
  const int exponent = static_cast<int>(std::bit_cast<std::uint64_t>(magnitude) >> 52) - 1023;
  return power_of_two(std::min(exponent, l.emax) - (l.precision - 1));
}

std::uint16_t f16_bits_from_double(double x) { return static_cast<std::uint16_t>(F16::encode(x)); }
std::uint16_t bf16_bits_from_double(double x) { return static_cast<std::uint16_t>(BF16::encode(x)); }
double f16_bits_to_double(std::uint16_t bits) { return F16::decode(bits); }
double bf16_bits_to_double(std::uint16_t bits) { return BF16::decode(bits); }

namespace {

// Nearest pattern of an 8-bit format with kFraction fraction bits whose
// smallest normal is 2^kMinNormalExp: ties to even, saturating at the largest
// finite pattern kLargest (as PTX's cvt.rn.satfinite), NaN to kNan with x's
// sign. Every step is exact: the scalings are by powers of two, and adding
// 2^52 to a magnitude below 2^51 rounds it to an integer, ties to even (the
// default rounding mode). Patterns are contiguous across binades, so a
// rounding that carries into the next binade (or from the subnormals into the
// normals) lands on its first pattern. (Until 2026-11-27 a binary search of
// the values' table: 6% of Subject_cpu_plain.QueryPermutation's time in perf.)
template <int kFraction, int kMinNormalExp, std::uint8_t kLargest, std::uint8_t kNan>
std::uint8_t fp8_encode(const std::array<double, 256>& values, double x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | kNan;
  const double magnitude = std::fabs(x);
  if (magnitude >= values[kLargest]) return sign | kLargest;
  constexpr double kRound = 0x1p52, kMinNormal = detail::exact_pow2(kMinNormalExp);
  constexpr double kPerSubnormalUnit = detail::exact_pow2(kFraction - kMinNormalExp);
  if (magnitude < kMinNormal) {  // a subnormal pattern (or zero), in units of the smallest
    const double units = magnitude * kPerSubnormalUnit;
    return sign | static_cast<std::uint8_t>((units + kRound) - kRound);
  }
  const int exponent = static_cast<int>((std::bit_cast<std::uint64_t>(magnitude) >> 52) & 0x7FF) - 1023;
  // The significand in units of the format's last fraction bit: in [2^kFraction, 2^(kFraction + 1)).
  const double units = magnitude * std::bit_cast<double>(static_cast<std::uint64_t>(1023 + kFraction - exponent) << 52);
  const auto rounded = static_cast<int>((units + kRound) - kRound);
  return sign | static_cast<std::uint8_t>(((exponent - kMinNormalExp + 1) << kFraction) + rounded - (1 << kFraction));
}

}  // namespace

std::uint8_t e4m3_bits_from_double(double x) { return fp8_encode<3, -6, 0x7E, 0x7F>(kE4m3Values, x); }
std::uint8_t e5m2_bits_from_double(double x) { return fp8_encode<2, -14, 0x7B, 0x7F>(kE5m2Values, x); }
double e4m3_bits_to_double(std::uint8_t bits) { return kE4m3Values[bits]; }
double e5m2_bits_to_double(std::uint8_t bits) { return kE5m2Values[bits]; }

std::uint8_t fp8_bits_from_double(DType dtype, double x) {
  return dtype == DType::e5m2 ? e5m2_bits_from_double(x) : e4m3_bits_from_double(x);
}

std::uint16_t half_bits_from_double(DType dtype, double x) {
  return dtype == DType::bf16 ? bf16_bits_from_double(x) : f16_bits_from_double(x);
}


double round_to(DType dtype, double x) {
  switch (dtype) {
    case DType::f32: return static_cast<double>(static_cast<float>(x));  // IEEE RNE
    case DType::f16: return f16_bits_to_double(f16_bits_from_double(x));
    case DType::bf16: return bf16_bits_to_double(bf16_bits_from_double(x));
    case DType::e4m3:
    case DType::e5m2: return fp8_bits_to_double(dtype, fp8_bits_from_double(dtype, x));  // saturating, as cvt.satfinite
  }
  return x;
}

double ulp_distance(DType dtype, double x, double ref) {
  const double inf = std::numeric_limits<double>::infinity();
  if (std::isnan(x) || std::isnan(ref)) return (std::isnan(x) && std::isnan(ref)) ? 0.0 : inf;
  if (std::isinf(x) || std::isinf(ref)) return x == ref ? 0.0 : inf;
  if ((x < 0 && ref > 0) || (x > 0 && ref < 0)) return inf;
  return std::fabs(x - ref) / ulp_at(dtype, ref);
}

}  // namespace flashcheck
