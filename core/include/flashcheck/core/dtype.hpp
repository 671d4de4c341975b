// Storage types and exact host conversions between f16/bf16/e4m3/e5m2 and f32/f64.
//
// Every conversion rounds once, to nearest with ties to even, handles
// subnormals, signed zeros, infinities and NaN, and needs no GPU. The f64 -> f16
// and f64 -> bf16 paths never pass through f32, so they do not double-round.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace flashcheck {

/// Element type of a tensor as stored in memory. e4m3 and e5m2 are the OCP
/// 8-bit formats (below): an fp8 tensor also carries a per-tensor descale
/// factor (HostTensor::descale), and attention on fp8 inputs writes O in
/// bf16 (output_dtype), as FlashAttention-3's and cuDNN's fp8 forwards do.
enum class DType : std::uint8_t { f32, f16, bf16, e4m3, e5m2 };

/// Every dtype, in the enum's order (for lists, generators and parsers).
inline constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2};

/// e4m3 or e5m2.
constexpr bool is_fp8(DType dtype) { return dtype == DType::e4m3 || dtype == DType::e5m2; }
/// The dtype of O for inputs stored in `dtype`: bf16 for the fp8 formats, the
/// input dtype otherwise.
constexpr DType output_dtype(DType dtype) { return is_fp8(dtype) ? DType::bf16 : dtype; }

std::string_view to_string(DType dtype);
std::optional<DType> parse_dtype(std::string_view text);
/// Bytes per element in storage.
int storage_bytes(DType dtype);

/// Unit roundoff u = 2^-p of the format (half the machine epsilon).
double unit_roundoff(DType dtype);
/// Largest finite value.
double max_finite(DType dtype);
/// Smallest positive normal value.
double min_normal(DType dtype);
/// Smallest positive subnormal value.
double min_subnormal(DType dtype);
/// The descale an fp8 tensor whose largest finite magnitude is amax (> 0)
/// takes: the least power of two d with amax <= max_finite(dtype) d, which
/// puts amax in the format's top binade and keeps x / d exact (a framework's
/// amax / max_finite is within a factor 2 of it).
double fp8_descale_for(DType dtype, double amax);
/// Spacing of representable values at |x| (the subnormal spacing below min_normal).
double ulp_at(DType dtype, double x);

// ---- bit-level conversions -------------------------------------------------
/// Nearest f16 (IEEE binary16) bit pattern to x; NaN maps to a quiet NaN of the same sign.
std::uint16_t f16_bits_from_double(double x);
/// Nearest bf16 bit pattern to x; NaN maps to a quiet NaN of the same sign.
std::uint16_t bf16_bits_from_double(double x);
/// round_to(DType::bf16, x) for an f32 x, on its bits (round to nearest even
/// into the top 16 bits: f32 holds x exactly, so this is the one rounding),
/// for the baseline's per-operation roundings (oracles/cpu_lowp.cpp). A NaN
/// stays a NaN.
inline float round_to_bf16(float x) {
  auto bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return x;
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return std::bit_cast<float>(bits & 0xFFFF0000u);
}
/// Exact value of an f16 bit pattern.
double f16_bits_to_double(std::uint16_t bits);
/// Exact value of a bf16 bit pattern.
double bf16_bits_to_double(std::uint16_t bits);

namespace detail {
/// The value of a pattern of an IEEE-style binary format with kExpBits exponent
/// and kManBits fraction bits (f16: 5, 10; bf16: 8, 7), exactly: the fields
/// move into binary64's (every value of these formats is a binary64 value), no
/// ldexp; a NaN is made quiet and keeps its sign. Inline, as every tensor load
/// of a 16-bit tensor decodes (the ldexp version, then the out-of-line call,
/// were the CPU suite's hottest symbols).
template <int kExpBits, int kManBits>
inline double decode_binary(std::uint32_t bits) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr std::uint32_t kExpAllOnes = (1u << kExpBits) - 1;
  constexpr std::uint64_t kQuiet = std::uint64_t{1} << 51;
  // 2^(1 - bias - kManBits): the value of the subnormal fraction's last bit.
  constexpr double kSubnormalStep = std::bit_cast<double>(static_cast<std::uint64_t>(1 - kBias - kManBits + 1023) << 52);
  const std::uint64_t sign = (bits >> (kExpBits + kManBits)) & 1 ? std::uint64_t{1} << 63 : 0;
  const std::uint32_t exp_field = (bits >> kManBits) & kExpAllOnes;
  const std::uint64_t fraction = bits & ((1u << kManBits) - 1);
  if (exp_field == 0)  // zero or subnormal: fraction * 2^(1 - bias - kManBits), exact
    return std::bit_cast<double>(std::bit_cast<std::uint64_t>(static_cast<double>(fraction) * kSubnormalStep) | sign);
  if (exp_field == kExpAllOnes)  // Inf, or a NaN (made quiet, sign kept)
    return std::bit_cast<double>(sign | std::uint64_t{0x7FF} << 52 | (fraction ? kQuiet : 0));
  const std::uint64_t exponent = exp_field - kBias + 1023;
  return std::bit_cast<double>(sign | exponent << 52 | fraction << (52 - kManBits));
}
}  // namespace detail

/// Bit pattern of x in a 16-bit dtype (f16 or bf16).
std::uint16_t half_bits_from_double(DType dtype, double x);
/// Exact value of a 16-bit pattern in a 16-bit dtype (f16 or bf16).
inline double half_bits_to_double(DType dtype, std::uint16_t bits) {
  return dtype == DType::bf16 ? detail::decode_binary<8, 7>(bits) : detail::decode_binary<5, 10>(bits);
}

// ---- FP8 (OCP 8-bit floating point, the formats of Hopper's cvt and wgmma) --
/// E4M3: 4 exponent bits (bias 7), 3 fraction bits, no infinities, NaN only at
/// S.1111.111, largest 448, smallest subnormal 2^-9. E5M2: 5 exponent bits
/// (bias 15), 2 fraction bits, IEEE-style (infinities, NaNs), largest 57344,
/// smallest subnormal 2^-16. Conversions from double round once, to nearest
/// with ties to even, and saturate as PTX's cvt.rn.satfinite does: a magnitude
/// past the largest finite value after rounding (an infinity included) becomes
/// that value with its sign; NaN stays NaN (E4M3 S.1111.111, E5M2 S.11111.11).
std::uint8_t e4m3_bits_from_double(double x);
std::uint8_t e5m2_bits_from_double(double x);
/// Exact value of an E4M3 / E5M2 bit pattern.
double e4m3_bits_to_double(std::uint8_t bits);
double e5m2_bits_to_double(std::uint8_t bits);

namespace detail {
/// 2^n, exactly, at compile time.
constexpr double exact_pow2(int n) {
  double x = 1;
  for (; n > 0; --n) x *= 2;
  for (; n < 0; ++n) x /= 2;
  return x;
}

/// Every pattern's value of an 8-bit format with `fraction_bits` fraction bits
/// and bias `bias`: IEEE-style (`ieee`: the top exponent holds the infinities
/// and NaNs, E5M2) or with the one NaN S.1111.111 (E4M3). NaNs are quiet and
/// keep their sign, and -0 is -0.
constexpr std::array<double, 256> fp8_values(int fraction_bits, int bias, bool ieee) {
  std::array<double, 256> values{};
  const int exp_all_ones = (1 << (7 - fraction_bits)) - 1;
  for (int bits = 0; bits < 128; ++bits) {
    const int exponent = bits >> fraction_bits, fraction = bits & ((1 << fraction_bits) - 1);
    double value = 0;
    if (ieee && exponent == exp_all_ones)
      value = fraction == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
    else if (!ieee && bits == 0x7F)
      value = std::numeric_limits<double>::quiet_NaN();
    else if (exponent == 0)
      value = fraction * exact_pow2(1 - bias - fraction_bits);
    else
      value = ((1 << fraction_bits) + fraction) * exact_pow2(exponent - bias - fraction_bits);
    values[bits] = value;
    values[bits | 0x80] = std::bit_cast<double>(std::bit_cast<std::uint64_t>(value) | std::uint64_t{1} << 63);
  }
  return values;
}
}  // namespace detail

/// The values of every E4M3 and E5M2 pattern, indexed by the pattern (the
/// tensors' loads decode through these: a load is one array read).
inline constexpr std::array<double, 256> kE4m3Values = detail::fp8_values(3, 7, false);
inline constexpr std::array<double, 256> kE5m2Values = detail::fp8_values(2, 15, true);

/// The two above for an fp8 dtype (e4m3 or e5m2).
std::uint8_t fp8_bits_from_double(DType dtype, double x);
inline double fp8_bits_to_double(DType dtype, std::uint8_t bits) {
  return (dtype == DType::e5m2 ? kE5m2Values : kE4m3Values)[bits];
}

/// x rounded to the nearest value representable in dtype (returned exactly as a double).
double round_to(DType dtype, double x);

/// Distance between x and the exact value ref in units of the dtype's spacing at
/// ref (fractional: a correctly rounded x is within 0.5). Opposite non-zero
/// signs give +inf; NaN against NaN gives 0, NaN against a number +inf.
double ulp_distance(DType dtype, double x, double ref);

}  // namespace flashcheck
