// Mutants of fa2-rowthread-bwd (kernels/backward/): the same kernels with one
// flaw each, over the same domain, registered only in test builds.
//
// mutant-gpu-bwd-atomic-dq adds dQ with atomicAdd from the dK/dV kernel, as
// FlashAttention-2's backward does (flash-attention #414, #2244), while still
// declaring backward_deterministic. Its gradients are as accurate as the
// real kernel's: only the order of dQ's float sums changes from run to run,
// so the error rule cannot see it; bitwise reruns can
// (properties/gpu/backward_determinism_test.cu).
#include "backward/rowthread_kernel.cuh"

namespace flashcheck::kernels {
namespace {

struct Registrations {
  Registrations() {
    Registry::instance().add(
        [] {
          return std::make_unique<BackwardKernelSubject>(
              kAtomicDqMutantName, "fa2-rowthread-bwd adding dQ with atomicAdd from the key blocks, declared deterministic",
              kRowthreadBackwardCapabilities, launch_rowthread_forward, launch_rowthread_backward<BackwardFlaw::atomic_dq>,
              /*dq_accumulator=*/true);
        },
        Registry::Kind::mutant);
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels
