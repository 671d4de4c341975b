// cpu-plain: attention as the textbook writes it, on the CPU, f32 arithmetic.
//
// Lineage: the simplest member of the family, written from the Problem spec
// alone (no code shared with oracles/). Per query row: logits with f32
// dot products, the row maximum, exp(s - max), the f32 sum, and P V in f32,
// output rounded once to the output dtype (the storage dtype; bf16 for fp8
// inputs, read as stored value x descale). It is the control for the mutants
// in kernels/mutants/, which are this kernel with one flaw switched on.
// Domain: everything the vocabulary expresses (f32/f16/bf16, e4m3/e5m2 in the forward, d <= 576,
// dv <= 512, every mask, GQA/MQA, padded batches, LSE, empty sequences,
// softcap, ALiBi, paged K/V of any page size in the forward).
// Speed: a reference loop, not a kernel to time (about 1 GFLOP/s on one core).
#pragma once

#include "flashcheck/core/subject.hpp"

namespace flashcheck {

/// One deliberate flaw, for mutants; `none` is the real kernel.
enum class PlainFlaw {
  none,
  no_max_subtraction,        // exp(s) instead of exp(s - max): overflows on large logits
  bottom_right_as_top_left,  // causal_br computed as causal_tl
  causal_off_by_one,         // a causal row also sees the key just past its diagonal
  scale_squared,             // the softmax scale applied twice
  lse_in_log2,               // LSE written as log2 instead of the natural log
  window_off_by_one,         // the sliding window's left edge one key wider
  scale_hardcoded_d64,       // at d = 64, logits scaled by 1/sqrt(64) whatever Problem::softmax_scale says
  bf16_truncating_epilogue,  // bf16 O rounded toward zero (the mantissa's low bits dropped), not to nearest
  // Backward flaws (issue 22's bug classes):
  bwd_scale_missing_in_ds,   // dS not multiplied by the softmax scale: dQ and dK off by 1/scale
  bwd_gqa_not_reduced,       // dK and dV from the first query head of each group only
  bwd_masked_keys_in_dk,     // masked keys' dS (P of the unmasked softmax) added into dK
  bwd_delta_low_precision,   // D_i = rowsum(dO o O) accumulated in the storage dtype, not f32
  bwd_d256_only_wrong,       // at d = 256 the last column of dQ is left at 0
  bwd_p_flushed,             // P below f32's smallest normal (2^-126) flushed to 0, as ex2.approx.ftz does
  // Score-modification flaws (issue 25's bug classes), in both passes:
  softcap_before_scale,      // C tanh(q.k / C) scaled afterwards, not C tanh(scale q.k / C)
  alibi_top_left,            // ALiBi's bias -slope |i - j|, top-left aligned, not bottom-right
  // Paged K/V flaws (issue 25, FlashInfer #3219's class), forward:
  page_table_ignored,        // the pool read as if its pages were in sequence order (page b x pages + n)
  page_off_by_one,           // the first key of each page read from the previous entry's page
  // fp8 flaw (issue 25), forward:
  fp8_k_descale_missing,     // K's stored fp8 values used without K's descale factor
};

inline constexpr Capabilities kCpuPlainCapabilities = {
    .dtypes = {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2},
    .min_head_dim = 1,
    .max_head_dim = 576,
    .max_head_dim_v = 512,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .softcap = true,
    .alibi = true,
    .min_page_size = 1,
    .lse = true,
    .tile_q = 1,
    .tile_kv = 16,
    .backward = true,
    .backward_deterministic = true,
};

/// cpu-plain-tc: cpu-plain whose backward rounds P and dS to the dtype before
/// the products dV = P^T dO, dQ = dS K and dK = dS^T Q, as a tensor-core
/// kernel's operands are (FlashAttention-2's backward, cuDNN's, fa2-mma-bwd);
/// the rest in f32 as cpu-plain. A CPU stand-in for those kernels' arithmetic,
/// so that the backward rule's treatment of them (Capabilities::
/// backward_operands_in_dtype) is tested without a GPU: on values=ties cases
/// it gives cuDNN's and fa2-mma-bwd's dQ to the last digit (H100, 2026-11-26).
inline constexpr std::string_view kCpuPlainTcName = "cpu-plain-tc";
inline constexpr Capabilities kCpuPlainTcCapabilities = [] {
  Capabilities caps = kCpuPlainCapabilities;
  caps.backward_operands_in_dtype = true;
  caps.forward_from = "cpu-plain";  // the same forward: its properties run there
  return caps;
}();

class CpuPlain final : public Subject {
 public:
  CpuPlain(std::string_view name = "cpu-plain", std::string_view description =
                                                    "textbook attention on the CPU in f32 (the mutants' control)",
           PlainFlaw flaw = PlainFlaw::none, bool operands_in_dtype = false)
      : name_(name), description_(description), flaw_(flaw), operands_in_dtype_(operands_in_dtype) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  const Capabilities& capabilities() const override {
    return operands_in_dtype_ ? kCpuPlainTcCapabilities : kCpuPlainCapabilities;
  }
  RunResult run(const Problem& problem, const Inputs& inputs) override;
  /// The textbook backward in f32: P recomputed from Q and K, D_i = rowsum(dO o O)
  /// from the O it is handed, dS = P o (dP - D), dQ = scale dS K, dK = scale
  /// dS^T Q, dV = P^T dO, each sum accumulated in f32 in index order and
  /// rounded once to the dtype; dK and dV summed over the GQA group. As
  /// cpu-plain-tc, P and dS (before the scale) rounded to the dtype first.
  BackwardResult run_backward(const Problem& problem, const BackwardInputs& inputs) override;

 private:
  bool sees(const Problem& p, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) const;

  std::string_view name_, description_;
  PlainFlaw flaw_;
  bool operands_in_dtype_;  // cpu-plain-tc: P and dS rounded to the dtype before their products
};

}  // namespace flashcheck
