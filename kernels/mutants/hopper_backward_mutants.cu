// Mutants of hopper-bwd (kernels/backward/hopper.cu): the same kernel with one
// flaw each (issue 22's backward bug classes, as ported to fa2-mma-bwd-det),
// over the same domain, registered only in test builds. The backward
// properties of the GPU suite must catch each one (GpuMutants.<name>), while
// passing hopper-bwd itself, the control.
//
// mutant-hopper-bwd-declared-deterministic is hopper-bwd (dQ's shares added
// by TMA reductions, in whatever order the key blocks reach them) declaring
// itself deterministic: only the judge's reruns can see it.
#include "backward/hopper_launch.cuh"

namespace flashcheck::kernels {
namespace {

inline constexpr Capabilities kDeclaredDeterministic = [] {
  Capabilities caps = kHopperBackwardCapabilities;
  caps.backward_deterministic = true;
  return caps;
}();

template <HopperBackwardFlaw kFlaw>
void add(std::string_view name, std::string_view what) {
  Registry::instance().add(
      [name, what] {
        return std::make_unique<BackwardKernelSubject>(name, what, kHopperBackwardCapabilities,
                                                       launch_rowthread_forward, hopper_bwd::launch<kFlaw>,
                                                       /*dq_accumulator=*/true);
      },
      Registry::Kind::mutant);
}

struct Registrations {
  Registrations() {
    Registry::instance().add(
        [] {
          return std::make_unique<BackwardKernelSubject>(
              "mutant-hopper-bwd-declared-deterministic",
              "hopper-bwd (dQ added by TMA reductions in any order) declaring itself deterministic",
              kDeclaredDeterministic, launch_rowthread_forward, launch_hopper_backward, /*dq_accumulator=*/true);
        },
        Registry::Kind::mutant);
    add<HopperBackwardFlaw::scale_missing_in_dk>("mutant-hopper-bwd-scale-missing-in-dk",
                                                 "hopper-bwd writing dK without the softmax scale");
    add<HopperBackwardFlaw::gqa_not_reduced>(
        "mutant-hopper-bwd-gqa-not-reduced",
        "hopper-bwd taking dK and dV (and dQ) from the first query head of each GQA group only");
    add<HopperBackwardFlaw::masked_keys_in_dk>("mutant-hopper-bwd-masked-keys-in-dk",
                                               "hopper-bwd adding masked keys' dS into dK and dQ");
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels
