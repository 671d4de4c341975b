// The decode kernel's domain and instantiation dispatch, shared with splitkv
// (kernels/splitkv/), which runs the same block body on slices of the keys.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashcheck/core/gpu/gpu_subject.hpp"

namespace flashcheck::kernels {

/// Warps of a decode block: one block per SM, up to 168 registers a thread.
inline constexpr int kDecodeWarps = 12;
/// The longest query sequence (decoding, speculative decoding).
inline constexpr int kDecodeMaxSeqlenQ = 16;

/// decode's domain: f16 and bf16 storage, f32 arithmetic; d = dv in {64, 128,
/// 256} (a key row is 8, 16 or 32 lanes of 16-byte loads); seqlen_q <= 16 and
/// any seqlen_kv, 0 included; every mask; GQA/MQA; padded batches; LSE; BHSD
/// and BSHD; Inf/NaN inputs (masked keys are absent); a paged K/V cache of any
/// page size from 16 keys (a warp's step then spans at most two pages).
inline constexpr Capabilities kDecodeCapabilities = {
    .dtypes = {DType::f16, DType::bf16},
    .head_dims = {64, 128, 256},
    .max_head_dim = 256,
    .max_head_dim_v = 256,
    .head_dim_v_equal = true,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .min_page_size = 16,
    .lse = true,
    .max_seqlen_q = kDecodeMaxSeqlenQ,
    .tile_q = 4,
    .tile_kv = 96,  // keys per block step at d = 128 (12 warps x 8)
    .needs_gpu = true,
    .min_compute_capability = 80,
    .accumulator_max = std::numeric_limits<float>::max(),  // one-pass softmax: O accumulates unnormalised in f32
};

/// Calls body.template operator()<Element, kHeadDim>() for the args' dtype and
/// head dim (inside the domain).
template <typename Body>
void dispatch_decode(const gpu::AttentionArgs& a, Body&& body) {
  auto by_head_dim = [&]<typename Element>() {
    if (a.head_dim == 64) body.template operator()<Element, 64>();
    else if (a.head_dim == 128) body.template operator()<Element, 128>();
    else body.template operator()<Element, 256>();
  };
  if (a.dtype == static_cast<int>(DType::bf16)) by_head_dim.template operator()<__nv_bfloat16>();
  else by_head_dim.template operator()<__half>();
}

}  // namespace flashcheck::kernels
