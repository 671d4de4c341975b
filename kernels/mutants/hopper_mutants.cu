// Mutants of the Hopper kernel (kernels/hopper/): the same kernel with one
// flaw each, over the same domain, registered only in test builds.
#include "kernels/hopper/launch.cuh"

namespace flashcheck::kernels::hopper {
namespace {

template <HopperFlaw kFlaw>
void add(std::string_view name, std::string_view what) {
  gpu::KernelRegistration(name, what, kHopperCapabilities, launch_hopper<kFlaw>, Registry::Kind::mutant);
}

struct Registrations {
  Registrations() {
    add<HopperFlaw::early_read>("mutant-hopper-early-read",
                                "hopper consumers reading each stage's first K fill before its mbarrier completes");
    add<HopperFlaw::tail_unmasked>("mutant-hopper-tail-unmasked",
                                   "hopper not masking the zero-filled keys past the sequence in the softmax");
    add<HopperFlaw::no_proxy_fence>("mutant-hopper-no-proxy-fence",
                                    "hopper storing O by TMA without fence.proxy.async after writing it to shared memory");
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels::hopper
