// own-attention: a kernel of "your own", the one this example checks with an
// installed flashcheck.
//
// A plain CPU loop in f32 (per query row: scaled logits, the row maximum,
// exp(s - max), the sum, P V, then O and the natural-log LSE), written from
// flashcheck's Problem spec alone, as a kernel outside flashcheck would be.
// Domain: f32 storage, head dims 1..256, no mask and both causal alignments,
// GQA/MQA, both layouts, LSE; no per-sequence lengths, no sliding window.
// Speed: a reference loop, not a kernel to time.
#pragma once

#include <string_view>

#include "flashcheck/core/subject.hpp"

namespace own_kernel {

/// A deliberate flaw, to show that the judge catches one; `none` is the kernel.
enum class Flaw { none, scale_applied_twice };

/// The domain, declared next to the launcher: flashcheck's generators draw
/// inside it, and a problem outside it comes back `unsupported`.
inline constexpr flashcheck::Capabilities kOwnAttentionCapabilities = {
    .dtypes = {flashcheck::DType::f32},
    .min_head_dim = 1,
    .max_head_dim = 256,
    .max_head_dim_v = 256,
    .masks = {flashcheck::MaskKind::none, flashcheck::MaskKind::causal_tl, flashcheck::MaskKind::causal_br},
    .gqa = true,
    .lse = true,
    .tile_q = 1,
    .tile_kv = 1,
};
static_assert(!kOwnAttentionCapabilities.needs_gpu, "a CPU loop");
static_assert(!kOwnAttentionCapabilities.masks.contains(flashcheck::MaskKind::window),
              "the loop has no sliding window: declaring one would make every window case fail");
static_assert(!kOwnAttentionCapabilities.varlen, "the loop reads the padded lengths only");

class OwnAttention final : public flashcheck::Subject {
 public:
  explicit OwnAttention(Flaw flaw = Flaw::none) : flaw_(flaw) {}
  std::string_view name() const override {
    return flaw_ == Flaw::none ? "own-attention" : "own-attention-scale-twice";
  }
  std::string_view description() const override {
    return flaw_ == Flaw::none ? "the example's own CPU attention loop (examples/own-kernel)"
                               : "own-attention with the softmax scale applied twice (a planted flaw)";
  }
  const flashcheck::Capabilities& capabilities() const override { return kOwnAttentionCapabilities; }
  flashcheck::RunResult run(const flashcheck::Problem& problem, const flashcheck::Inputs& inputs) override;

 private:
  Flaw flaw_;
};

}  // namespace own_kernel
