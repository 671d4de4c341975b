// Mutants of decode (kernels/decode/): the same kernel reading a paged K/V
// cache with one flaw each (contiguous K/V read as decode reads them),
// registered only in test builds. The GPU property suite must catch every one.
#include "decode/decode_kernel.cuh"

namespace flashcheck::kernels {
namespace {

struct Registrations {
  Registrations() {
    gpu::KernelRegistration("mutant-decode-page-table-ignored",
                            "decode that reads the paged pool as if its pages were in sequence order",
                            kDecodeCapabilities, launch_decode<KeyReading::paged_table_ignored>,
                            Registry::Kind::mutant);
    gpu::KernelRegistration("mutant-decode-page-off-by-one",
                            "decode that reads the first key of each page after the first from the previous "
                            "page's table entry",
                            kDecodeCapabilities, launch_decode<KeyReading::paged_off_by_one>, Registry::Kind::mutant);
  }
} registrations;

}  // namespace
}  // namespace flashcheck::kernels
