// The instruction wrappers that the mma family (kernels/mma/: basic, swizzled,
// pipelined, ldmatrix_x4, kv_pipelined) and the Hopper kernel (kernels/hopper/)
// share: ex2.approx for the online softmax's exponentials (common/softmax.cuh),
// and the rounding of an f32 pair to a packed f16/bf16 pair, for P (the A
// operand of the second product) and for O in the epilogues (mma/epilogue.cuh,
// hopper/epilogue.cuh). Each family's own PTX is beside it: mma/ptx.cuh,
// hopper/hopper_ptx.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace flashcheck::kernels {

/// 2^x on the special function unit (ex2.approx.ftz: 2 ulp; -inf -> +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// The backward's P = 2^x with subnormal results kept, at one FMUL more than
/// fast_exp2: the caller hands x + kExp2Shift (the shift folded into its row's
/// bias), whose ex2.approx.ftz is normal for every x >= -150, and the exact
/// multiply by 2^-kExp2Shift makes the subnormals (the kernels are not built
/// with -ftz). ex2.approx without .ftz cost about six instructions an
/// exponential (x halved below -126, the result squared): det d = 64 4.22 ->
/// 4.03 ms with this form (H200, 2026-11-28, docs/perf.md). Why P needs its
/// subnormals: a P below 2^-126 flushed to 0 drops its key's whole share of dK
/// and dV where every P of the key is that small (one dominant key at logit
/// gaps near 87; a GPU sweep found dK 34 times the floor, 2026-11-28), while
/// the forward's O never sees it.
inline constexpr int kExp2ShiftBits = 24;
inline constexpr float kExp2Shift = kExp2ShiftBits;
__device__ __forceinline__ float exp2_shifted_keeping_subnormals(float x_plus_shift) {
  constexpr float kUnshift = 1.0f / static_cast<float>(1 << kExp2ShiftBits);  // 2^-24, exact
  return fast_exp2(x_plus_shift) * kUnshift;
}

/// Two floats rounded (to nearest even) to T and packed, `low` in the low half.
/// kTowardZero (a mutant's flaw: kernels/mutants/mma_mutants.cu) rounds bf16
/// toward zero instead.
template <typename T, bool kTowardZero = false>
__device__ __forceinline__ std::uint32_t pack(float low, float high) {
  if constexpr (kTowardZero && std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __halves2bfloat162(__float2bfloat16_rz(low), __float2bfloat16_rz(high));
    return *reinterpret_cast<const std::uint32_t*>(&pair);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const std::uint32_t*>(&pair);
  } else {
    const __half2 pair = __floats2half2_rn(low, high);
    return *reinterpret_cast<const std::uint32_t*>(&pair);
  }
}

}  // namespace flashcheck::kernels
