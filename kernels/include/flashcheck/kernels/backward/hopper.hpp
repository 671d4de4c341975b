// The public face of kernels/backward/hopper.cu, the Hopper backward (issue
// 23): TMA loads, wgmma for the five products, a producer warpgroup and two
// consumer warpgroups. Its name and declared domain, for tests and tools that
// look it up in the Registry.
#pragma once

#include <string_view>

#include "flashcheck/kernels/backward/mma.hpp"

namespace flashcheck::kernels {

inline constexpr std::string_view kHopperBackwardName = "hopper-bwd";

/// The kernel's tiles: a block owns 128 keys (64 a consumer warpgroup) and
/// walks the queries 64 rows a step (backward/hopper_kernel.cuh).
inline constexpr int kHopperBackwardBlockKeys = 128;
inline constexpr int kHopperBackwardStepQueries = 64;

/// hopper-bwd's domain: fa2-mma-bwd's (f16/bf16, every product accumulated in
/// f32 with P^T and dS^T rounded to the dtype as wgmma operands; every mask;
/// GQA/MQA; padded batches; BHSD and BSHD; finite inputs only) on sm_90a, with
/// d = dv in {64, 128} (d = 256: dK and dV of 64 keys x 256 would take 256
/// registers a consumer thread). TMA needs 16-byte strides, which d >= 64
/// in f16/bf16 gives every layout. dQ's shares are added by TMA
/// reductions in whatever order they arrive (not deterministic). The forward is fa2-rowthread-bwd's, as fa2-mma-bwd's.
inline constexpr Capabilities kHopperBackwardCapabilities = [] {
  Capabilities caps = kMmaBackwardCapabilities;
  caps.head_dims = {64, 128};
  caps.tile_q = kHopperBackwardStepQueries;
  caps.tile_kv = kHopperBackwardBlockKeys;
  caps.min_compute_capability = 90;
  caps.backward_deterministic = false;
  return caps;
}();

}  // namespace flashcheck::kernels
