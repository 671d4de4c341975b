// BackwardKernelSubject: a GPU subject with both passes. The forward goes
// through gpu::GpuSubject (core/gpu/gpu_subject.hpp); run_backward does for
// the backward what GpuSubject::run does for the forward, until core/gpu owns
// it for every backward kernel (issue 23):
//   - the domain check (unsupported without launching), then the device check
//     (unavailable without a usable device of the declared compute capability);
//   - Q, K, V, O, dO and the handed LSE uploaded in the problem's dtype and
//     layout (core/backward.hpp says where O and LSE come from);
//   - dQ, dK and dV in guarded buffers, poisoned before the call; the
//     workspaces (D_i, and for the atomic mutant an f32 dQ) allocated here;
//   - after the call: every CUDA error checked (a sticky one is a `fault`),
//     guard bands intact, no element of dQ, dK or dV still poisoned (padding
//     rows included: the kernels write them 0), every input bit-identical.
//     Any violation makes the run an `error` naming it.
#pragma once

#include <cuda_runtime.h>

#include "flashcheck/core/gpu/gpu_subject.hpp"

namespace flashcheck::kernels {

/// One backward call's device tensors, as a backward launcher receives them.
/// `attention` carries Q, K, V, O (read only), the handed LSE (read only,
/// [batch, heads_q, seqlen_q]), the geometry, the strides and the stream. dO
/// has O's strides, dQ Q's, dK K's and dV V's.
struct BackwardArgs {
  gpu::AttentionArgs attention;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* delta = nullptr;     // D_i = rowsum(dO_i o O_i): [batch, heads_q, seqlen_q], f32 workspace
  float* dq_accum = nullptr;  // [batch, heads_q, seqlen_q, d] f32, zeroed; null unless the subject asks for it
};

using BackwardLauncher = void (*)(const BackwardArgs& args, const gpu::CallSite& site);

class BackwardKernelSubject final : public gpu::GpuSubject {
 public:
  /// `dq_accumulator`: allocate and zero BackwardArgs::dq_accum before each call.
  BackwardKernelSubject(std::string_view name, std::string_view description, const Capabilities& capabilities,
                        gpu::Launcher forward, BackwardLauncher backward, bool dq_accumulator)
      : name_(name),
        description_(description),
        capabilities_(capabilities),
        forward_(forward),
        backward_(backward),
        dq_accumulator_(dq_accumulator) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  const Capabilities& capabilities() const override { return capabilities_; }
  BackwardResult run_backward(const Problem& problem, const BackwardInputs& inputs) override;

 private:
  void launch(const Problem&, const gpu::AttentionArgs& args, const gpu::CallSite& site) override { forward_(args, site); }
  std::string_view name_, description_;
  const Capabilities& capabilities_;
  gpu::Launcher forward_;
  BackwardLauncher backward_;
  bool dq_accumulator_;
};

}  // namespace flashcheck::kernels
