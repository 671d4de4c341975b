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

  // 2^(1 - bias - kManBits): the value of the subnormal fraction's last bit.
  static constexpr double subnormal_step =
      std::bit_cast<double>(static_cast<std::uint64_t>(1 - bias - kManBits + 1023) << 52);

  // Decoding moves the fields into binary64's (every value of these formats is
  // a binary64 value): no ldexp. The ldexp version was the hottest symbol of
  // the CPU suite (every tensor load decodes).
  static double decode(std::uint32_t bits) {
    const std::uint64_t sign = (bits & sign_bit) ? std::uint64_t{1} << 63 : 0;
    const std::uint32_t exp_field = (bits >> kManBits) & exp_all_ones;
    const std::uint64_t fraction = bits & man_mask;
    if (exp_field == 0)  // zero or subnormal: fraction * 2^(1 - bias - kManBits), exact
      return std::bit_cast<double>(std::bit_cast<std::uint64_t>(static_cast<double>(fraction) * subnormal_step) | sign);
    constexpr std::uint64_t kQuiet = std::uint64_t{1} << 51;
    if (exp_field == exp_all_ones)  // Inf, or a NaN (made quiet, sign kept)
      return std::bit_cast<double>(sign | std::uint64_t{0x7FF} << 52 | (fraction ? kQuiet : 0));
    const std::uint64_t exponent = exp_field - bias + 1023;
    return std::bit_cast<double>(sign | exponent << 52 | fraction << (52 - kManBits));
  }
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

double ulp_at(DType dtype, double x) {
  const Limits l = limits_of(dtype);
  const double magnitude = std::fabs(x);
  if (!std::isfinite(magnitude)) return std::numeric_limits<double>::infinity();
  if (magnitude < min_normal(dtype)) return min_subnormal(dtype);
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  const int binade = std::min(exponent - 1, l.emax);
  return std::ldexp(1.0, binade - (l.precision - 1));
}

std::uint16_t f16_bits_from_double(double x) { return static_cast<std::uint16_t>(F16::encode(x)); }
std::uint16_t bf16_bits_from_double(double x) { return static_cast<std::uint16_t>(BF16::encode(x)); }
double f16_bits_to_double(std::uint16_t bits) { return F16::decode(bits); }
double bf16_bits_to_double(std::uint16_t bits) { return BF16::decode(bits); }

namespace {

// An 8-bit format's positive values, in the order of their bit patterns
// (increasing for every sign-magnitude float): `finite` patterns 0 .. finite - 1.
struct Fp8Table {
  std::array<double, 128> value{};
  int finite = 0;
  std::uint8_t nan = 0;
};

Fp8Table make_e4m3() {
  Fp8Table t;
  for (int bits = 0; bits < 128; ++bits) {
    const int exponent = bits >> 3, fraction = bits & 7;
    t.value[bits] = exponent == 0 ? std::ldexp(fraction, -9) : std::ldexp(8 + fraction, exponent - 10);
  }
  t.finite = 127;  // 0x7F is NaN
  t.nan = 0x7F;
  return t;
}

Fp8Table make_e5m2() {
  Fp8Table t;
  for (int bits = 0; bits < 124; ++bits) {
    const int exponent = bits >> 2, fraction = bits & 3;
    t.value[bits] = exponent == 0 ? std::ldexp(fraction, -16) : std::ldexp(4 + fraction, exponent - 17);
  }
  t.value[124] = std::numeric_limits<double>::infinity();
  for (int bits = 125; bits < 128; ++bits) t.value[bits] = std::numeric_limits<double>::quiet_NaN();
  t.finite = 124;  // 0x7C is Inf, 0x7D..0x7F NaN
  t.nan = 0x7F;
  return t;
}

const Fp8Table& e4m3_table() {
  static const Fp8Table table = make_e4m3();
  return table;
}

const Fp8Table& e5m2_table() {
  static const Fp8Table table = make_e5m2();
  return table;
}

// Nearest finite pattern, ties to the even pattern, saturating; every
// comparison is exact (the midpoint of two adjacent values is a double).
std::uint8_t fp8_encode(const Fp8Table& t, double x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | t.nan;
  const double magnitude = std::fabs(x);
  const double* first = t.value.data();
  const double* last = first + t.finite;
  const double* above = std::upper_bound(first, last, magnitude);  // first value > |x|
  if (above == last) return sign | static_cast<std::uint8_t>(t.finite - 1);  // past the largest: saturate
  const auto high = static_cast<int>(above - first), low = high - 1;  // |x| in [value[low], value[high])
  const double midpoint = (t.value[low] + t.value[high]) / 2;
  int nearest;
  if (magnitude < midpoint) nearest = low;
  else if (magnitude > midpoint) nearest = high;
  else nearest = (low % 2 == 0) ? low : high;
  return sign | static_cast<std::uint8_t>(nearest);
}

double fp8_decode(const Fp8Table& t, std::uint8_t bits) {
  const double magnitude = t.value[bits & 0x7F];
  return (bits & 0x80) ? -magnitude : magnitude;
}

}  // namespace

std::uint8_t e4m3_bits_from_double(double x) { return fp8_encode(e4m3_table(), x); }
std::uint8_t e5m2_bits_from_double(double x) { return fp8_encode(e5m2_table(), x); }
double e4m3_bits_to_double(std::uint8_t bits) {
  return (bits & 0x7F) == 0x7F ? std::copysign(std::numeric_limits<double>::quiet_NaN(), (bits & 0x80) ? -1.0 : 1.0)
                               : fp8_decode(e4m3_table(), bits);
}
double e5m2_bits_to_double(std::uint8_t bits) {
  const double value = fp8_decode(e5m2_table(), bits);
  return std::isnan(value) ? std::copysign(value, (bits & 0x80) ? -1.0 : 1.0) : value;
}

std::uint8_t fp8_bits_from_double(DType dtype, double x) {
  return dtype == DType::e5m2 ? e5m2_bits_from_double(x) : e4m3_bits_from_double(x);
}

double fp8_bits_to_double(DType dtype, std::uint8_t bits) {
  return dtype == DType::e5m2 ? e5m2_bits_to_double(bits) : e4m3_bits_to_double(bits);
}

std::uint16_t half_bits_from_double(DType dtype, double x) {
  return dtype == DType::bf16 ? bf16_bits_from_double(x) : f16_bits_from_double(x);
}

double half_bits_to_double(DType dtype, std::uint16_t bits) {
  return dtype == DType::bf16 ? bf16_bits_to_double(bits) : f16_bits_to_double(bits);
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
