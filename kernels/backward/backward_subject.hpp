// BackwardKernelSubject: a GPU subject with both passes, made of a forward
// and a backward launcher. gpu::GpuSubject (core/gpu/gpu_subject.hpp) owns
// everything around either launch: the domain and device checks, the uploads,
// the guarded and poisoned outputs, the workspaces, the checks after the call
// and the timing.
#pragma once

#include "flashcheck/core/gpu/gpu_subject.hpp"

namespace flashcheck::kernels {

using gpu::BackwardArgs;

using BackwardLauncher = void (*)(const BackwardArgs& args, const gpu::CallSite& site);

class BackwardKernelSubject final : public gpu::GpuSubject {
 public:
  /// `dq_accumulator`: the backward launcher reads a zeroed BackwardArgs::dq_accum.
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

 private:
  void launch(const Problem&, const gpu::AttentionArgs& args, const gpu::CallSite& site) override { forward_(args, site); }
  void launch_backward(const Problem&, const BackwardArgs& args, const gpu::CallSite& site) override {
    backward_(args, site);
  }
  gpu::BackwardNeeds backward_needs() const override { return {dq_accumulator_, /*writes_padding_rows=*/true}; }
  std::string_view name_, description_;
  const Capabilities& capabilities_;
  gpu::Launcher forward_;
  BackwardLauncher backward_;
  bool dq_accumulator_;
};

}  // namespace flashcheck::kernels
