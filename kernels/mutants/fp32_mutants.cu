// Mutants of fa2_rowthread (kernels/fp32/): the same kernel with one flaw each,
// registered only in test builds. The GPU property suite must catch every one.
#include "fp32/fa2_rowthread_kernel.cuh"

namespace flashcheck::kernels {
namespace {

template <Fa2Flaw kFlaw>
void add(std::string_view name, std::string_view what) {
  gpu::KernelRegistration(name, what, kFa2Capabilities, launch_fa2_rowthread<kFlaw>, Registry::Kind::mutant);
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
