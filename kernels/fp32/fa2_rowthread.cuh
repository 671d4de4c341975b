// The fa2_rowthread kernel template, shared with its mutants (kernels/mutants/).
#pragma once

#include "flashcheck/core/gpu/gpu_subject.hpp"

namespace flashcheck::kernels {

/// Deliberate flaws, for mutants; `none` is the real kernel.
enum class Fa2Flaw {
  none,
  no_max_subtraction,       // exp(s) instead of exp(s - max)
  causal_off_by_one,        // causal rows see one key past the diagonal
  tail_rows_unwritten,      // rows of a partial last query tile are never written
  missing_syncthreads,      // no barrier before the next K/V tile overwrites shared memory
  wrong_scale,              // logits scaled by 1.25 x the softmax scale
  lse_in_log2,              // LSE written in log2
  write_past_last_row,      // the last row also writes one row further
  modifies_input,           // writes into K (the harness must notice the input changed)
};

/// Enqueues fa2_rowthread with a flaw on args.stream; throws gpu::CudaError.
template <Fa2Flaw kFlaw>
void launch_fa2_rowthread(const gpu::AttentionArgs& args, const gpu::CallSite& site);

/// Rows per block (one thread each) and keys per shared-memory tile.
inline constexpr int kFa2Rows = 64;
inline constexpr int kFa2Keys = 32;
/// Largest head dim (Q/K and V): the per-thread q and o rows live in local arrays.
inline constexpr int kFa2MaxHeadDim = 128;

/// fa2_rowthread's domain (its mutants share it): f32 storage and arithmetic;
/// d, dv <= 128; any seqlen_q/seqlen_kv (tails predicated); every mask;
/// GQA/MQA; padded batches; LSE; BHSD and BSHD.
inline constexpr Capabilities kFa2Capabilities = {
    .dtypes = {DType::f32},
    .min_head_dim = 1,
    .max_head_dim = kFa2MaxHeadDim,
    .max_head_dim_v = kFa2MaxHeadDim,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .tile_q = kFa2Rows,
    .tile_kv = kFa2Keys,
    .needs_gpu = true,
    .min_compute_capability = 80,
};

}  // namespace flashcheck::kernels
