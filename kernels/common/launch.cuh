// The host side that the mma family (kernels/mma/: basic, swizzled, pipelined,
// ldmatrix_x4, kv_pipelined and its mutants) and the Hopper kernel
// (kernels/hopper/launch.cuh) share: the dtype values the launchers read, the
// dispatch on dtype and head dim, and the family's domain, which Hopper
// narrows to sm_90 with its own tiles (kHopperCapabilities). Each family's
// launcher is beside it: mma/launch.cuh, hopper/launch.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <limits>

#include "flashcheck/core/gpu/gpu_subject.hpp"

namespace flashcheck::kernels {

/// DType values as AttentionArgs::dtype carries them (core/dtype.hpp).
inline constexpr int kDTypeF16 = 1, kDTypeBf16 = 2;

/// The mma family's domain (each version and the mutants declare it; Hopper's
/// is this one on sm_90): f16/bf16 storage with f32 accumulation; head dims
/// 64, 128, 256 with dv = d; any lengths (tails predicated); every mask;
/// GQA/MQA; padded batches; LSE; BHSD and BSHD (16-byte loads need the last
/// axis contiguous and d a multiple of 8, which these head dims are). NaN/Inf
/// inputs are outside it: P V multiplies the values of keys masked in a
/// boundary tile by weight 0, and 0 * Inf = NaN.
inline constexpr Capabilities kMmaCapabilities = {
    .dtypes = {DType::f16, DType::bf16},
    .head_dims = {64, 128, 256},
    .head_dim_v_equal = true,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .nonfinite_inputs = false,
    .tile_q = 64,  // the mma family's kBlockQ (mma/tiles.cuh; mma/launch.cuh asserts it)
    .tile_kv = 64,
    .needs_gpu = true,
    .min_compute_capability = 80,
    .accumulator_max = std::numeric_limits<float>::max(),  // one-pass softmax: O accumulates unnormalised in f32
};

/// Calls `go.template operator()<T, D>()` for the args' dtype (__nv_bfloat16
/// or __half) and head dim (64, 128 or 256; inside the domain).
template <typename Go>
void with_instance(const gpu::AttentionArgs& a, Go&& go) {
  if (a.dtype == kDTypeBf16) {
    if (a.head_dim == 64) go.template operator()<__nv_bfloat16, 64>();
    else if (a.head_dim == 128) go.template operator()<__nv_bfloat16, 128>();
    else go.template operator()<__nv_bfloat16, 256>();
  } else {
    if (a.head_dim == 64) go.template operator()<__half, 64>();
    else if (a.head_dim == 128) go.template operator()<__half, 128>();
    else go.template operator()<__half, 256>();
  }
}

}  // namespace flashcheck::kernels
