// Mutants of the Hopper kernel (kernels/hopper/): the same kernel with one
// flaw each, over the same domain, registered only in test builds.
#include "hopper/launch.cuh"

namespace flashcheck::kernels::hopper {
namespace {

template <HopperFlaw kFlaw>
void add(std::string_view name, std::string_view what) {
  gpu::KernelRegistration(name, what, kHopperCapabilities, launch_hopper<kFlaw>, Registry::Kind::mutant);
}

struct Registrations {
  Registrations() {
    add<HopperFlaw::early_read>("mutant-hopper-early-read",
                                "hopper consumers reading the Q stage, refilled every tile, before its mbarrier completes");
    add<HopperFlaw::tail_unmasked>("mutant-hopper-tail-unmasked",
                                   "hopper not masking the zero-filled keys past the sequence in the softmax");
    add<HopperFlaw::softcap_before_scale>("mutant-hopper-softcap-before-scale",
                                          "hopper capping the unscaled logits, C tanh(q.k / C), and scaling after");
    gpu::KernelRegistration("mutant-hopper-fp8-descale-missing",
                            "hopper-fp8 leaving Q's and K's descale factors out of the logit scale",
                            kHopperFp8Capabilities, launch_hopper_fp8<HopperFlaw::fp8_descale_missing>,
                            Registry::Kind::mutant);
    add<HopperFlaw::no_proxy_fence>("mutant-hopper-no-proxy-fence",
                                    "hopper storing O by TMA without fence.proxy.async after writing it to shared memory");
    // Measured on the H200 (docs/perf.md, 2026-11-22): every output was right
    // without the fence, and compute-sanitizer (memcheck, racecheck) does not
    // model the async proxy. The flaw is a memory-model violation that this
    // hardware does not expose; the suite keeps running it (caught: passed).
    Registry::instance().mark_unobservable(
        "mutant-hopper-no-proxy-fence",
        "on the H200 the TMA store read every value written before the named barrier even without "
        "fence.proxy.async, and compute-sanitizer does not model the async proxy (docs/perf.md, 2026-11-22)");
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels::hopper
