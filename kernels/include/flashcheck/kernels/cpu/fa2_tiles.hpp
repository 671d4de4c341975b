// cpu-fa2-tiles: FlashAttention-2's two algorithms as loops over tiles, on the
// CPU in f32, so that CPU-only CI has a kernel-shaped forward and backward.
//
// Lineage: the FA2 paper (Dao 2023, the seed article on FlashAttention-2),
// Algorithm 1 (forward: query tiles outer, key tiles inner, online softmax with
// a running maximum and sum, LSE = m + log l) and Algorithm 2 (backward: key
// tiles outer, query tiles inner, P recomputed from the LSE it is handed,
// D_i = rowsum(dO o O) first, dQ accumulated across key tiles in f32, dK and
// dV per key tile). Written from the algorithms, not from any kernel here.
// What it adds over cpu-plain: the tile structure, so that lengths that are
// not a multiple of the tile, the LSE round trip, and the D_i preprocessing
// are exercised the way a GPU kernel exercises them.
// Domain: f32/f16/bf16, d <= 256, every mask, GQA, varlen, LSE, softcap and
// ALiBi (issue 25: the logits modified inside each tile, and dS times the
// softcap's 1 - tanh^2 in the backward, FlashAttention-2's softcap-with-varlen
// path), both passes (the backward deterministic: every sum runs in a fixed order);
// a paged K/V cache of any page size in the forward (each key tile's rows read
// from their pool pages: tiles of 16 keys across pages of other sizes).
// Speed: a reference loop (about 1 GFLOP/s on one core), not a kernel to time.
#pragma once

#include "flashcheck/core/subject.hpp"

namespace flashcheck {

/// One deliberate flaw, for mutants; `none` is the real kernel.
enum class TileFlaw {
  none,
  lse_wrong_base,           // backward: P = 2^(S log2 e - LSE), reading the natural-log LSE as log2
  nan_at_non_tile_lengths,  // backward: the last key tile's rows past the sequence are read (NaN) unmasked
};

inline constexpr Capabilities kCpuFa2TilesCapabilities = {
    .dtypes = {DType::f32, DType::f16, DType::bf16},
    .min_head_dim = 1,
    .max_head_dim = 256,
    .max_head_dim_v = 256,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .softcap = true,
    .alibi = true,
    .min_page_size = 1,
    .lse = true,
    .tile_q = 16,
    .tile_kv = 16,
    .backward = true,
    .backward_deterministic = true,
};

class CpuFa2Tiles final : public Subject {
 public:
  CpuFa2Tiles(std::string_view name = "cpu-fa2-tiles",
              std::string_view description = "FlashAttention-2's Algorithms 1 and 2 as f32 tile loops on the CPU",
              TileFlaw flaw = TileFlaw::none)
      : name_(name), description_(description), flaw_(flaw) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  const Capabilities& capabilities() const override { return kCpuFa2TilesCapabilities; }
  RunResult run(const Problem& problem, const Inputs& inputs) override;
  BackwardResult run_backward(const Problem& problem, const BackwardInputs& inputs) override;

 private:
  std::string_view name_, description_;
  TileFlaw flaw_;
};

}  // namespace flashcheck
