// The domain of the misbehaving fixtures (misbehaving_subjects.cpp, and the GPU
// ones in misbehaving_gpu_subjects.cu): small f32 problems with every mask.
#pragma once

#include "flashcheck/core/subject.hpp"

namespace flashcheck::fixtures {

inline constexpr Capabilities kSmallDomain = {
    .dtypes = {DType::f32},
    .min_head_dim = 1,
    .max_head_dim = 32,
    .max_head_dim_v = 32,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
};

/// The same on the GPU (the GPU fixtures write no LSE).
inline constexpr Capabilities kSmallGpuDomain = [] {
  Capabilities c = kSmallDomain;
  c.lse = false;
  c.needs_gpu = true;
  return c;
}();

}  // namespace flashcheck::fixtures
