// Mutants of splitkv (kernels/splitkv/): the same kernels with one flaw each,
// registered only in test builds. The GPU property suite must catch every one.
#include <memory>

#include "splitkv/splitkv_kernel.cuh"

namespace flashcheck::kernels {
namespace {

template <SplitKvFlaw kFlaw>
void add(std::string_view name, std::string_view what) {
  Registry::instance().add([=] { return std::make_unique<SplitKvSubject<kFlaw>>(name, what); },
                           Registry::Kind::mutant);
}

struct Registrations {
  Registrations() {
    add<SplitKvFlaw::unshifted_combine>("mutant-splitkv-unshifted-combine",
                                        "splitkv whose combine sums exp(L_s) without subtracting the maximum");
    add<SplitKvFlaw::empty_split_unwritten>("mutant-splitkv-empty-split-unwritten",
                                            "splitkv whose splits that see no key exit without writing their slot");
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels
