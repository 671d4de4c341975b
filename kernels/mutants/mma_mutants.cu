// Mutants of the flagship kv_pipelined (kernels/mma/): the same kernel with one
// flaw each, over the same domain, registered only in test builds. The GPU
// property suite must catch every one.
#include "mma/kv_pipelined_kernel.cuh"

namespace flashcheck::kernels::mma {
namespace {

// A launcher that hard-codes the softmax scale for one head dimension: at
// d = 64 it passes 1/sqrt(64) whatever Problem::softmax_scale says (the kernel
// itself is kv_pipelined, unchanged). Invisible at the default scale.
void launch_scale_hardcoded_d64(const gpu::AttentionArgs& a, const gpu::CallSite& site) {
  gpu::AttentionArgs hardcoded = a;
  if (a.head_dim == 64) hardcoded.scale = 0.125f;
  launch_kv_pipelined<MmaFlaw::none>(hardcoded, site);
}

template <MmaFlaw kFlaw>
void add(std::string_view name, std::string_view what) {
  gpu::KernelRegistration(name, what, kMmaCapabilities, launch_kv_pipelined<kFlaw>, Registry::Kind::mutant);
}

struct Registrations {
  Registrations() {
    add<MmaFlaw::swizzle_write_only>("mutant-mma-swizzle-write-only",
                                     "kv_pipelined writing tiles swizzled and reading them unswizzled");
    add<MmaFlaw::short_wait>("mutant-mma-short-wait",
                             "kv_pipelined whose cp.async waits leave one group too many in flight (a race)");
    add<MmaFlaw::br_as_tl>("mutant-mma-br-as-tl", "kv_pipelined computing bottom-right causal as top-left");
    add<MmaFlaw::key_tail_unmasked>("mutant-mma-key-tail-unmasked",
                                    "kv_pipelined not masking the keys past the end in the last key tile");
    add<MmaFlaw::window_off_by_one>("mutant-mma-window-off-by-one",
                                    "kv_pipelined whose sliding window sees one key too many on the left");
    add<MmaFlaw::truncating_epilogue>("mutant-mma-bf16-truncating-epilogue",
                                      "kv_pipelined rounding its bf16 output toward zero instead of to nearest");
    gpu::KernelRegistration("mutant-mma-scale-hardcoded-d64",
                            "kv_pipelined launched with 1/sqrt(64) at d = 64, ignoring Problem::softmax_scale",
                            kMmaCapabilities, launch_scale_hardcoded_d64, Registry::Kind::mutant);
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels::mma
