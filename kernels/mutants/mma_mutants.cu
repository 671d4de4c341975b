// Mutants of the flagship kv_pipelined (kernels/mma/): the same kernel with one
// flaw each, over the same domain, registered only in test builds. The GPU
// property suite must catch every one.
#include "kernels/mma/kv_pipelined_kernel.cuh"

namespace flashcheck::kernels::mma {
namespace {

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
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels::mma
