// Mutants of fa2_rowthread (kernels/fp32/): the same kernel with one flaw each,
// registered only in test builds. The GPU property suite must catch every one.
#include "kernels/fp32/fa2_rowthread_kernel.cuh"

namespace flashcheck::kernels {
namespace {

constexpr Capabilities kCapabilities = {
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

template <Fa2Flaw kFlaw>
class Fa2Mutant final : public gpu::GpuSubject {
 public:
  Fa2Mutant(std::string_view name, std::string_view what) : name_(name), what_(what) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return what_; }
  const Capabilities& capabilities() const override { return kCapabilities; }

 private:
  void launch(const Problem&, const gpu::AttentionArgs& args, const gpu::CallSite& site) override {
    launch_fa2_rowthread<kFlaw>(args, site);
  }
  std::string_view name_, what_;
};

template <Fa2Flaw kFlaw>
void add(std::string_view name, std::string_view what) {
  MutantRegistration([name, what] { return std::make_unique<Fa2Mutant<kFlaw>>(name, what); });
}

struct Registrations {
  Registrations() {
    add<Fa2Flaw::no_max_subtraction>("mutant-gpu-no-max-subtraction", "fa2-rowthread without the max subtraction");
    add<Fa2Flaw::causal_off_by_one>("mutant-gpu-causal-off-by-one", "fa2-rowthread whose causal rows see one key too many");
    add<Fa2Flaw::tail_rows_unwritten>("mutant-gpu-tail-rows-unwritten", "fa2-rowthread leaving a partial last row tile unwritten");
    add<Fa2Flaw::missing_syncthreads>("mutant-gpu-missing-syncthreads", "fa2-rowthread without the barrier before reloading K/V tiles");
    add<Fa2Flaw::wrong_scale>("mutant-gpu-wrong-scale", "fa2-rowthread scaling logits by 1.25 x the softmax scale");
    add<Fa2Flaw::lse_in_log2>("mutant-gpu-lse-log2", "fa2-rowthread writing LSE in log2");
    add<Fa2Flaw::write_past_last_row>("mutant-gpu-write-past-last-row", "fa2-rowthread writing one row past the last");
    add<Fa2Flaw::modifies_input>("mutant-gpu-modifies-input", "fa2-rowthread writing into its K input");
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels
