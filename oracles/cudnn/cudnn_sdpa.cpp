// cudnn: cuDNN's fused attention (SDPA) through the cuDNN frontend graph API,
// as a subject (and, by the judge, as the peer baseline of half-precision
// kernels).
//
// One graph per geometry (shapes, strides, dtype, mask, padding, scale), built
// once and cached. Masks map to the frontend's attributes: causal top-left and
// bottom-right, and the sliding window as a diagonal band aligned bottom-right
// (our window of W keys left of the diagonal is cuDNN's left bound W + 1, a
// window length that counts the diagonal key). Padded batches pass their
// lengths as [batch, 1, 1, 1] int32 tensors with the padding mask. LSE is
// cuDNN's softmax stats (natural log). Every refusal by cuDNN or the frontend
// (validation, no engine, unsupported head dim...) becomes `unsupported`
// carrying cuDNN's message, so the domain is discovered, not guessed.
#include <cudnn.h>
#include <cudnn_frontend.h>
#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>

#include "core/gpu/gpu_subject.hpp"

namespace flashcheck {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the variant pack.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kSeqQ, kSeqKv };

constexpr Capabilities kCapabilities = {
    .dtypes = {DType::f16, DType::bf16},
    // cuDNN's fused kernels want head dims that are multiples of 8; which of
    // these a given cuDNN and GPU accept is discovered at launch.
    .head_dims = {32, 64, 80, 96, 128, 160, 192, 256},
    .max_head_dim_v = 256,
    .head_dim_v_equal = true,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
    .empty_sequences = false,  // cuDNN takes no zero-length sequence dimension
    // Measured on the H200 (cuDNN 9.14): a NaN in V at a masked key makes that
    // output column NaN (masked probabilities multiply V as zeros), so
    // non-finite inputs are outside the domain; subnormal inputs are flushed to
    // zero in some configurations (bf16, d=192) and not in others (f16, d=80).
    .nonfinite_inputs = false,
    .may_flush_subnormals = true,
    .tile_q = 128,
    .tile_kv = 128,
    .needs_gpu = true,
    .min_compute_capability = 80,
    .accumulator_max = std::numeric_limits<float>::max(),  // measured: near_overflow(3000,0.9) bf16 gives -inf (issue 20)
    .known_deviations = "masked keys' non-finite values leak into O (0 x NaN); subnormal inputs may be flushed to zero; "
                        "bottom-right alignment with max seqlen_q > seqlen_kv is refused (fully masked rows arise only "
                        "through padding, where O = 0 and LSE = -inf as flashcheck's convention)",
};

struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace_bytes = 0;
};

class CudnnSdpa final : public gpu::GpuSubject {
 public:
  std::string_view name() const override { return "cudnn"; }
  std::string_view description() const override {
    return "cuDNN fused attention (SDPA) through the cuDNN frontend graph API";
  }
  const Capabilities& capabilities() const override { return kCapabilities; }
  std::string version_info() const override {
    return fmt::format("cuDNN {} (built against {}), cudnn-frontend {}", cudnnGetVersion(), CUDNN_VERSION,
                       CUDNN_FRONTEND_VERSION);
  }
  ~CudnnSdpa() override {
    if (handle_ && !gpu::context_poisoned()) cudnnDestroy(handle_);
  }

 private:
  static std::string key(const Problem& p, const gpu::AttentionArgs& a) {
    return fmt::format("{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}", p.batch, p.heads_q, p.heads_kv, p.seqlen_q,
                       p.seqlen_kv, p.head_dim, p.head_dim_v, static_cast<int>(p.dtype), static_cast<int>(p.layout),
                       static_cast<int>(p.mask), p.window_left, p.window_right, p.padded(), p.softmax_scale,
                       a.q_seq_stride, a.k_seq_stride, a.o_seq_stride);
  }

  static void refuse_if_bad(fe::error_t status, const char* step) {
    if (!status.is_good()) throw gpu::Unsupported(fmt::format("cuDNN refused ({}): {}", step, status.get_message()));
  }

  CachedGraph build(const Problem& p, const gpu::AttentionArgs& a) {
    auto graph = std::make_shared<fe::graph::Graph>();
    const auto io = p.dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
    graph->set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(
        fe::DataType_t::FLOAT);
    auto tensor = [&](const char* name, Uid uid, std::int64_t heads, std::int64_t seq, std::int64_t dim,
                      std::int64_t batch_stride, std::int64_t head_stride, std::int64_t seq_stride) {
      return graph->tensor(fe::graph::Tensor_attributes()
                               .set_name(name)
                               .set_uid(uid)
                               .set_dim({p.batch, heads, seq, dim})
                               .set_stride({batch_stride, head_stride, seq_stride, 1}));
    };
    auto q = tensor("Q", kQ, p.heads_q, p.seqlen_q, p.head_dim, a.q_batch_stride, a.q_head_stride, a.q_seq_stride);
    auto k = tensor("K", kK, p.heads_kv, p.seqlen_kv, p.head_dim, a.k_batch_stride, a.k_head_stride, a.k_seq_stride);
    auto v = tensor("V", kV, p.heads_kv, p.seqlen_kv, p.head_dim_v, a.v_batch_stride, a.v_head_stride, a.v_seq_stride);
    auto attributes = fe::graph::SDPA_attributes()
                          .set_name("flashcheck_sdpa")
                          .set_generate_stats(true)
                          .set_attn_scale(static_cast<float>(p.softmax_scale));
    if (p.mask == MaskKind::causal_tl) attributes.set_causal_mask(true);
    if (p.mask == MaskKind::causal_br) attributes.set_causal_mask_bottom_right(true);
    if (p.mask == MaskKind::window) {
      attributes.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT);
      if (p.window_left >= 0) attributes.set_diagonal_band_left_bound(static_cast<int>(p.window_left) + 1);
      if (p.window_right >= 0) attributes.set_diagonal_band_right_bound(static_cast<int>(p.window_right));
    }
    if (p.padded()) {
      auto lengths = [&](const char* name, Uid uid) {
        return graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name(name)
                                 .set_uid(uid)
                                 .set_dim({p.batch, 1, 1, 1})
                                 .set_stride({1, 1, 1, 1})
                                 .set_data_type(fe::DataType_t::INT32));
      };
      attributes.set_padding_mask(true).set_seq_len_q(lengths("seq_q", kSeqQ)).set_seq_len_kv(lengths("seq_kv", kSeqKv));
    }
    auto [o, stats] = graph->sdpa(q, k, v, attributes);
    o->set_output(true).set_uid(kO).set_dim({p.batch, p.heads_q, p.seqlen_q, p.head_dim_v}).set_stride(
        {a.o_batch_stride, a.o_head_stride, a.o_seq_stride, 1});
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(
        {p.batch, p.heads_q, p.seqlen_q, 1}).set_stride({p.heads_q * p.seqlen_q, p.seqlen_q, 1, 1});

    refuse_if_bad(graph->validate(), "validate");
    refuse_if_bad(graph->build_operation_graph(handle_), "build_operation_graph");
    refuse_if_bad(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    refuse_if_bad(graph->check_support(handle_), "check_support");
    refuse_if_bad(graph->build_plans(handle_), "build_plans");
    CachedGraph cached{graph, 0};
    refuse_if_bad(graph->get_workspace_size(cached.workspace_bytes), "get_workspace_size");
    return cached;
  }

  void launch(const Problem& p, const gpu::AttentionArgs& a, const gpu::CallSite& site) override {
    if (p.seqlen_q == 0 || p.seqlen_kv == 0)
      throw gpu::Unsupported("cuDNN SDPA takes no empty sequence dimension");
    std::lock_guard<std::mutex> lock(mutex_);
    if (!handle_) {
      const cudnnStatus_t created = cudnnCreate(&handle_);
      if (created != CUDNN_STATUS_SUCCESS)
        throw gpu::Unsupported(fmt::format("cudnnCreate failed: {}", cudnnGetErrorString(created)));
    }
    if (cudnnSetStream(handle_, a.stream) != CUDNN_STATUS_SUCCESS)
      throw gpu::CudaError(cudaErrorUnknown, fmt::format("cudnnSetStream failed on problem '{}'", site.problem), false);
    const std::string graph_key = key(p, a);
    auto found = cache_.find(graph_key);
    if (found == cache_.end()) found = cache_.emplace(graph_key, build(p, a)).first;
    const CachedGraph& cached = found->second;
    if (workspace_.bytes() < static_cast<std::size_t>(cached.workspace_bytes))
      workspace_ = gpu::DeviceBuffer(static_cast<std::size_t>(cached.workspace_bytes), site);
    std::unordered_map<std::int64_t, void*> pack = {{kQ, const_cast<void*>(a.q)},
                                                    {kK, const_cast<void*>(a.k)},
                                                    {kV, const_cast<void*>(a.v)},
                                                    {kO, a.o},
                                                    {kStats, a.lse}};
    if (p.padded()) {
      pack[kSeqQ] = const_cast<std::int32_t*>(a.lens_q);
      pack[kSeqKv] = const_cast<std::int32_t*>(a.lens_kv);
    }
    auto status = cached.graph->execute(handle_, pack, workspace_.get());
    if (!status.is_good())
      throw gpu::CudaError(cudaErrorUnknown,
                           fmt::format("cuDNN execute failed: {} on problem '{}'", status.get_message(), site.problem),
                           false);
    gpu::check_launch("cudnn sdpa", site);
  }

  std::mutex mutex_;
  cudnnHandle_t handle_ = nullptr;
  std::map<std::string, CachedGraph> cache_;
  gpu::DeviceBuffer workspace_;
};

SubjectRegistration<CudnnSdpa> registration;

}  // namespace
}  // namespace flashcheck
