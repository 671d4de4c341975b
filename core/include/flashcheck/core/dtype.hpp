// Storage types and exact host conversions between f16/bf16/e4m3/e5m2 and f32/f64.
//
// Every conversion rounds once, to nearest with ties to even, handles
// subnormals, signed zeros, infinities and NaN, and needs no GPU. The f64 -> f16
// and f64 -> bf16 paths never pass through f32, so they do not double-round.
#pragma once

#include <cstdint>
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
/// Exact value of an f16 bit pattern.
double f16_bits_to_double(std::uint16_t bits);
/// Exact value of a bf16 bit pattern.
double bf16_bits_to_double(std::uint16_t bits);

/// Bit pattern of x in a 16-bit dtype (f16 or bf16).
std::uint16_t half_bits_from_double(DType dtype, double x);
/// Exact value of a 16-bit pattern in a 16-bit dtype (f16 or bf16).
double half_bits_to_double(DType dtype, std::uint16_t bits);

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
/// The two above for an fp8 dtype (e4m3 or e5m2).
std::uint8_t fp8_bits_from_double(DType dtype, double x);
double fp8_bits_to_double(DType dtype, std::uint8_t bits);

/// x rounded to the nearest value representable in dtype (returned exactly as a double).
double round_to(DType dtype, double x);

/// Distance between x and the exact value ref in units of the dtype's spacing at
/// ref (fractional: a correctly rounded x is within 0.5). Opposite non-zero
/// signs give +inf; NaN against NaN gives 0, NaN against a number +inf.
double ulp_distance(DType dtype, double x, double ref);

}  // namespace flashcheck
