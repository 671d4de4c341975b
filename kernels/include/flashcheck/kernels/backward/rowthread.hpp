// The public face of kernels/backward/rowthread.cu, the project's first GPU
// backward subject (issue 22 item 7's host for the atomic-dQ mutant; issue 23
// builds the fast ones): its names and its declared domain, for tests and
// tools that look it up in the Registry.
#pragma once

#include <limits>
#include <string_view>

#include "flashcheck/core/subject.hpp"

namespace flashcheck::kernels {

/// The subject and its mutant, as the Registry names them.
inline constexpr std::string_view kRowthreadBackwardName = "fa2-rowthread-bwd";
/// dQ accumulated with atomicAdd from the key-block kernel (FlashAttention-2's
/// classic backward) while still declaring backward_deterministic: only its
/// float summation order changes from run to run. Registered as a mutant in
/// flashcheck-testing (kernels/mutants/backward_mutants.cu).
inline constexpr std::string_view kAtomicDqMutantName = "mutant-gpu-bwd-atomic-dq";

/// Threads of every block of the family (a thread per query row, or per key
/// row in the dK/dV kernel), and rows of each shared-memory tile at the
/// largest head dims (the tiles shrink as d grows: 32 KiB of f32 in two tiles).
inline constexpr int kRowthreadBackwardThreads = 64;
inline constexpr int kRowthreadBackwardMaxHeadDim = 256;

/// fa2-rowthread-bwd's domain (its mutant shares it): f32, f16 and bf16
/// storage, every product and sum in f32; d, dv <= 256; any seqlen_q and
/// seqlen_kv (tails predicated); none/causal_tl/causal_br/window masks;
/// GQA/MQA (dK and dV summed over the group by the kernel); padded batches;
/// LSE; BHSD and BSHD; NaN/Inf inputs (masked keys are absent, never weighted
/// by 0). Both passes; the backward is bitwise repeatable (every sum runs in
/// one thread, in a fixed order, and no two blocks write one element).
inline constexpr Capabilities kRowthreadBackwardCapabilities = {
    .dtypes = {DType::f32, DType::f16, DType::bf16},
    .min_head_dim = 1,
    .max_head_dim = kRowthreadBackwardMaxHeadDim,
    .max_head_dim_v = kRowthreadBackwardMaxHeadDim,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .tile_q = kRowthreadBackwardThreads,
    .tile_kv = kRowthreadBackwardThreads,
    .needs_gpu = true,
    .min_compute_capability = 80,
    // The forward is one pass: O accumulates unnormalised in f32. The
    // backward's f32 sums overflow in the same regime (dP = dO V^T, then dS
    // and dK): on near_overflow values, max |V| times the keys past 3.4e38.
    .accumulator_max = std::numeric_limits<float>::max(),
    .backward = true,
    .backward_deterministic = true,
};

}  // namespace flashcheck::kernels
