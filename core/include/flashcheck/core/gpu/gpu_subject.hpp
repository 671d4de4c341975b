// GpuSubject: the base of every CUDA kernel under test. It owns everything
// around the launch, so that each kernel file holds only its kernel, its
// launcher and its Capabilities:
//   - the domain check (unsupported without launching), and the device check
//     (unavailable without a usable device of the declared compute capability);
//   - inputs uploaded in the problem's dtype and layout;
//   - O and LSE in guarded buffers, poisoned before the call;
//   - after the call: every CUDA error checked (a sticky one is a `fault`),
//     guard bands intact (else an out-of-bounds write), no valid output element
//     still poisoned (else an unwritten output), inputs bit-identical (else an
//     input modification). Any violation makes the run an `error` naming it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "flashcheck/core/gpu/runtime.hpp"
#include "flashcheck/core/subject.hpp"

namespace flashcheck::gpu {

/// One call's device tensors and geometry, as a kernel's launcher receives it.
/// Strides are in elements, for the [batch, head, seq] axes (the last axis is
/// contiguous); they encode the layout. LSE is [batch, heads_q, seqlen_q].
struct AttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // null when the subject does not write LSE
  std::int64_t q_batch_stride, q_head_stride, q_seq_stride;
  std::int64_t k_batch_stride, k_head_stride, k_seq_stride;
  std::int64_t v_batch_stride, v_head_stride, v_seq_stride;
  std::int64_t o_batch_stride, o_head_stride, o_seq_stride;
  const std::int32_t* lens_q = nullptr;   // per-sequence lengths on the device, or null
  const std::int32_t* lens_kv = nullptr;
  int dtype;  // DType of Q, K, V and O
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim, head_dim_v;
  int mask;  // MaskKind
  int window_left, window_right;
  float scale;
  cudaStream_t stream;
};

class GpuSubject : public Subject {
 public:
  RunResult run(const Problem& problem, const Inputs& inputs) final;

  /// Times of the launch alone (CUDA events around each), after `warmup`
  /// launches, over `repeats` launches cycling through `input_sets` copies of
  /// the inputs (so that caches do not flatter). Throws CudaError or
  /// std::invalid_argument.
  std::optional<Timing> time(const Problem& problem, const Inputs& inputs, int warmup, int repeats,
                             int input_sets) override;

 protected:
  /// Enqueues the kernel(s) on args.stream. Throws CudaError on a failed call
  /// (check_launch after each launch). Called only inside the domain.
  virtual void launch(const Problem& problem, const AttentionArgs& args, const CallSite& site) = 0;
};

/// The launcher of a kernel whose domain and launch need nothing but the args.
using Launcher = void (*)(const AttentionArgs& args, const CallSite& site);

/// A GpuSubject made of a name, a description, a domain and a launcher: what
/// most kernel files register.
class KernelSubject final : public GpuSubject {
 public:
  KernelSubject(std::string_view name, std::string_view description, const Capabilities& capabilities,
                Launcher launcher)
      : name_(name), description_(description), capabilities_(capabilities), launcher_(launcher) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  const Capabilities& capabilities() const override { return capabilities_; }

 private:
  void launch(const Problem&, const AttentionArgs& args, const CallSite& site) override { launcher_(args, site); }
  std::string_view name_, description_;
  const Capabilities& capabilities_;
  Launcher launcher_;
};

/// Registers a KernelSubject (or, with Registry::Kind::mutant, a mutant) at
/// static-initialisation time. The strings and the Capabilities must be static.
struct KernelRegistration {
  KernelRegistration(std::string_view name, std::string_view description, const Capabilities& capabilities,
                     Launcher launcher, Registry::Kind kind = Registry::Kind::subject) {
    Registry::instance().add(
        [=, &capabilities] { return std::make_unique<KernelSubject>(name, description, capabilities, launcher); }, kind);
  }
};

}  // namespace flashcheck::gpu
