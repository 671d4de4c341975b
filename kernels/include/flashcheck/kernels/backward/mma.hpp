// The public face of kernels/backward/mma.cu, the first tensor-core backward
// (issue 23): FlashAttention-2's Algorithm 2 on mma.sync m16n8k16, registered
// twice, with dQ added by atomics (FlashAttention-2's own shape) and with dQ in
// a pass of its own (deterministic). Its names and declared domains, for tests
// and tools that look them up in the Registry.
#pragma once

#include <limits>
#include <string_view>

#include "flashcheck/core/subject.hpp"
#include "flashcheck/kernels/backward/rowthread.hpp"

namespace flashcheck::kernels {

/// The two subjects, as the Registry names them.
inline constexpr std::string_view kMmaBackwardName = "fa2-mma-bwd";
inline constexpr std::string_view kMmaBackwardDeterministicName = "fa2-mma-bwd-det";

/// The family's tiles: the dK/dV kernel owns 128 keys a block (16 a warp; 64
/// at d = 256) and walks the queries 64 at a time (32 at d >= 128); the
/// deterministic dQ kernel owns 64 query rows a block (16 a warp; 128 at
/// d = 256) and walks the keys 64 at a time (32 at d = 256).
/// backward/mma_kernel.cuh: KvShape, QShape.
inline constexpr int kMmaBackwardBlockKeys = 128;
inline constexpr int kMmaBackwardBlockQueries = 64;

/// fa2-mma-bwd's domain (fa2-mma-bwd-det's is the same, deterministic):
/// f16/bf16 storage, every product accumulated in f32 (P and dS rounded to the
/// dtype as the A operand of their products, as FlashAttention-2 does); d = dv
/// in {64, 128, 256} (at d = 256 two warps share a key tile's dK and dV, which
/// would take 256 registers a thread alone); any seqlen_q and seqlen_kv (tails predicated); none/causal_tl/
/// causal_br/window masks; GQA/MQA (dK and dV summed over the group by the
/// kernel); padded batches; LSE; BHSD and BSHD (16-byte cp.async needs the last
/// axis contiguous and d a multiple of 8, which these head dims are). NaN/Inf
/// inputs are outside it, as for the forward mma family: the products weigh
/// the rows and keys a mask hides by an exact 0 inside the mma, and 0 * Inf is
/// NaN. The forward (Subject::run) is fa2-rowthread-bwd's, on this domain.
inline constexpr Capabilities kMmaBackwardCapabilities = {
    .dtypes = {DType::f16, DType::bf16},
    .head_dims = {64, 128, 256},
    .head_dim_v_equal = true,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .nonfinite_inputs = false,
    .tile_q = kMmaBackwardBlockQueries,
    .tile_kv = kMmaBackwardBlockKeys,
    .needs_gpu = true,
    .min_compute_capability = 80,
    // As fa2-rowthread-bwd: the forward is one pass (O unnormalised in f32),
    // and the backward's f32 sums (dP = dO V^T, then dS and dK) overflow in
    // the same regime.
    .accumulator_max = std::numeric_limits<float>::max(),
    .backward = true,
    .backward_deterministic = false,  // dQ's atomicAdd order varies from run to run
    .backward_operands_in_dtype = true,  // P^T and dS^T rounded to the dtype as the mma's A operands
    .forward_from = kRowthreadBackwardName,  // its forward kernel; the forward properties run there
};

/// fa2-mma-bwd-det's domain: fa2-mma-bwd's, bitwise repeatable (every sum in
/// a fixed order, no atomics, no element written by two blocks).
inline constexpr Capabilities kMmaBackwardDeterministicCapabilities = [] {
  Capabilities caps = kMmaBackwardCapabilities;
  caps.backward_deterministic = true;
  return caps;
}();

}  // namespace flashcheck::kernels
