// Mutants of fa2-mma-bwd-det (kernels/backward/mma.cu): the same kernels with
// one flaw each (issue 22's backward bug classes, ported from cpu-plain's
// mutants and fa2-rowthread-bwd's), over the same domain, registered only in
// test builds. The backward properties of the GPU suite must catch each one
// (GpuMutants.<name>), while passing fa2-mma-bwd-det itself, the control.
//
// mutant-mma-bwd-atomic-dq is fa2-mma-bwd (dQ added with atomicAdd from the
// key blocks) declaring itself deterministic: its gradients are as accurate as
// the real kernels', so only the judge's reruns of a declared-deterministic
// backward can see it.
#include "backward/mma_kernel.cuh"

namespace flashcheck::kernels {
namespace {

template <MmaBackwardFlaw kFlaw>
void add(std::string_view name, std::string_view what) {
  Registry::instance().add(
      [name, what] {
        return std::make_unique<BackwardKernelSubject>(name, what, kMmaBackwardDeterministicCapabilities,
                                                       launch_rowthread_forward,
                                                       launch_mma_backward</*kAtomicDq=*/false, kFlaw>,
                                                       /*dq_accumulator=*/false);
      },
      Registry::Kind::mutant);
}

struct Registrations {
  Registrations() {
    Registry::instance().add(
        [] {
          return std::make_unique<BackwardKernelSubject>(
              "mutant-mma-bwd-atomic-dq", "fa2-mma-bwd (dQ added with atomicAdd) declaring itself deterministic",
              kMmaBackwardDeterministicCapabilities, launch_rowthread_forward, launch_mma_backward_atomic,
              /*dq_accumulator=*/true);
        },
        Registry::Kind::mutant);
    add<MmaBackwardFlaw::scale_missing_in_ds>("mutant-mma-bwd-scale-missing-in-ds",
                                              "fa2-mma-bwd-det without the softmax scale in dK and dQ");
    add<MmaBackwardFlaw::gqa_not_reduced>(
        "mutant-mma-bwd-gqa-not-reduced",
        "fa2-mma-bwd-det taking dK and dV from the first query head of each GQA group only");
    add<MmaBackwardFlaw::masked_keys_in_dk>("mutant-mma-bwd-masked-keys-in-dk",
                                            "fa2-mma-bwd-det adding masked keys' dS into dK");
    add<MmaBackwardFlaw::delta_low_precision>(
        "mutant-mma-bwd-delta-low-precision",
        "fa2-mma-bwd-det accumulating D_i = rowsum(dO o O) in the storage dtype instead of f32");
    add<MmaBackwardFlaw::d256_only_wrong>("mutant-mma-bwd-d256-only-wrong",
                                          "fa2-mma-bwd-det leaving the last column of dQ at 0 when d = 256");
    add<MmaBackwardFlaw::p_flushed>("mutant-mma-bwd-p-flushed",
                                    "fa2-mma-bwd-det computing dK and dV's P with ex2.approx.ftz, a subnormal P flushed to 0");
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels
