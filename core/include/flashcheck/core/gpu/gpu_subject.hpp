// GpuSubject: the base of every CUDA kernel under test. It owns everything
// around the launch, so that each kernel file holds only its kernel, its
// launcher and its Capabilities:
//   - the domain check (unsupported without launching), and the device check
//     (unavailable without a usable device of the declared compute capability);
//   - inputs uploaded in the problem's dtype and layout (a paged problem's
//     pools and its page table: AttentionArgs::page_table);
//   - O and LSE in guarded buffers, poisoned before the call;
//   - after the call: every CUDA error checked (a sticky one is a `fault`),
//     guard bands intact (else an out-of-bounds write), no valid output element
//     still poisoned (else an unwritten output), inputs bit-identical, the
//     page table included (else an input modification). Any violation makes
//     the run an `error` naming it.
// The backward (pass=bwd, for a subject whose Capabilities declare one) the
// same way: Q, K, V, O, dO and the handed LSE uploaded (core/backward.hpp
// says where O and LSE come from), dQ, dK and dV guarded and poisoned, the
// workspaces (D_i, an f32 dQ accumulator where asked) allocated here, and the
// same checks after the call, on dQ, dK, dV and all six inputs. bench times
// both passes through time() and time_backward().
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
/// A paged K/V cache (Problem::page_size) keeps K and V as pools of `pages`
/// pages of `page_size` keys: their "batch" strides are then a pool page's,
/// their "seq" strides a key's within the page, and key j of sequence b lives
/// in pool page page_table[b * pages_per_sequence + j / page_size], at slot
/// j % page_size (core/paging.hpp).
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
  const std::int32_t* page_table = nullptr;  // [batch, pages_per_sequence] on the device; null: contiguous K/V
  int page_size = 0, pages_per_sequence = 0, pages = 0;
  int dtype;  // DType of Q, K and V; O is output_dtype(dtype) (bf16 for fp8)
  /// fp8 (dtype e4m3 / e5m2): each input's per-tensor descale factor, the
  /// value of an element being stored x descale (HostTensor::descale); 1 otherwise.
  float q_descale = 1, k_descale = 1, v_descale = 1;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_kv, head_dim, head_dim_v;
  int mask;  // MaskKind
  int window_left, window_right;
  float scale;
  float softcap = 0;  // Problem::softcap: s <- softcap tanh(scale s / softcap); 0: none
  cudaStream_t stream;
};

/// One backward call's device tensors, as a backward launcher receives them.
/// `attention` carries Q, K, V, O (read only), the handed LSE (read only,
/// [batch, heads_q, seqlen_q]), the geometry, the strides and the stream. dO
/// has O's strides, dQ Q's, dK K's and dV V's.
struct BackwardArgs {
  AttentionArgs attention;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* delta = nullptr;     // D_i = rowsum(dO_i o O_i): [batch, heads_q, seqlen_q], f32 workspace
  float* dq_accum = nullptr;  // [batch, heads_q, seqlen_q, d] f32, zeroed on the stream before each call;
                              // null unless BackwardNeeds::dq_accumulator
};

/// What a subject's backward needs around its launch.
struct BackwardNeeds {
  bool dq_accumulator = false;       // BackwardArgs::dq_accum allocated and zeroed before each call
  bool writes_padding_rows = true;   // the kernel writes 0 to padding rows (else they are set to 0 after
                                     // the call and are not checked for the poison)
};

class GpuSubject : public Subject {
 public:
  RunResult run(const Problem& problem, const Inputs& inputs) final;
  /// The backward, checked as run() checks the forward (see the file's header).
  BackwardResult run_backward(const Problem& problem, const BackwardInputs& inputs) final;

  /// Times of the launch alone (CUDA events around each), after `warmup`
  /// launches, over `repeats` launches cycling through `input_sets` copies of
  /// the inputs (so that caches do not flatter). Throws CudaError or
  /// std::invalid_argument.
  std::optional<Timing> time(const Problem& problem, const Inputs& inputs, int warmup, int repeats,
                             int input_sets) override;
  /// The same for the backward: the launch alone (with the dQ accumulator's
  /// zeroing where the subject asks for one), the workspaces allocated once.
  std::optional<Timing> time_backward(const Problem& problem, const BackwardInputs& inputs, int warmup, int repeats,
                                      int input_sets) override;

 protected:
  /// Enqueues the kernel(s) on args.stream. Throws CudaError on a failed call
  /// (check_launch after each launch). Called only inside the domain.
  virtual void launch(const Problem& problem, const AttentionArgs& args, const CallSite& site) = 0;
  /// Enqueues the backward kernel(s) on args.attention.stream, as launch().
  /// Called only inside the backward domain (Capabilities::backward): the
  /// default, for forward-only subjects, throws Unsupported.
  virtual void launch_backward(const Problem& problem, const BackwardArgs& args, const CallSite& site);
  virtual BackwardNeeds backward_needs() const { return {}; }
  /// The LSE uploaded for the backward, from the handed one (default: as handed).
  virtual std::vector<float> backward_lse(const std::vector<float>& handed) const { return handed; }
  /// Whether the launches under way are time()'s or time_backward()'s: a
  /// subject that adds work of the harness's own to a launch (cudnn-fp8's
  /// widening of its fp8 O to bf16) leaves it out of the timed ones.
  bool timing() const { return timing_; }

 private:
  friend struct TimingScope;
  bool timing_ = false;
};

/// Sets a subject's timing() for its life (gpu_subject.cpp).
struct TimingScope {
  explicit TimingScope(GpuSubject& subject) : subject_(subject) { subject_.timing_ = true; }
  ~TimingScope() { subject_.timing_ = false; }
  TimingScope(const TimingScope&) = delete;
  TimingScope& operator=(const TimingScope&) = delete;

 private:
  GpuSubject& subject_;
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
