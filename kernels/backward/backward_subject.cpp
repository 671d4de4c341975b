#include "backward/backward_subject.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace flashcheck::kernels {
namespace {

using gpu::CallSite;
using gpu::check;
using gpu::DeviceBuffer;
using gpu::GuardedBuffer;

// Element strides of a [batch, heads, seq, dim] tensor in a layout (the last
// axis contiguous), as core/gpu's forward path computes them.
void strides(Layout layout, std::int64_t heads, std::int64_t seqlen, std::int64_t dim, std::int64_t& batch,
             std::int64_t& head, std::int64_t& seq) {
  if (layout == Layout::bhsd) {
    batch = heads * seqlen * dim;
    head = seqlen * dim;
    seq = dim;
  } else {
    batch = seqlen * heads * dim;
    head = dim;
    seq = heads * dim;
  }
}

DeviceBuffer upload(const void* host, std::int64_t bytes, cudaStream_t stream, const CallSite& site, const char* what) {
  DeviceBuffer device(static_cast<std::size_t>(bytes), site);
  if (bytes > 0)
    check(cudaMemcpyAsync(device.get(), host, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, stream), what,
          site);
  return device;
}

std::optional<std::string> device_refusal(const Capabilities& caps) {
  std::string why;
  if (!gpu::device_available(&why)) return why;
  if (gpu::device_compute_capability() < caps.min_compute_capability)
    return fmt::format("needs compute capability {} or newer; this device has {}", caps.min_compute_capability,
                       gpu::device_compute_capability());
  return std::nullopt;
}

// Elements of a downloaded tensor that still hold the poison's exact bits,
// and where the first one is.
std::int64_t poisoned_elements(const HostTensor& t, const char* label, std::string& first) {
  std::int64_t count = 0;
  for (std::int64_t b = 0; b < t.batch(); ++b)
    for (std::int64_t h = 0; h < t.heads(); ++h)
      for (std::int64_t s = 0; s < t.seqlen(); ++s)
        for (std::int64_t c = 0; c < t.dim(); ++c) {
          const std::int64_t at = t.offset(b, h, s, c);
          const bool poisoned =
              t.dtype() == DType::f32
                  ? std::memcmp(static_cast<const std::uint32_t*>(t.data()) + at, &GuardedBuffer::kPoison32, 4) == 0
                  : static_cast<const std::uint16_t*>(t.data())[at] == GuardedBuffer::kPoison16;
          if (poisoned && count++ == 0) first = fmt::format("{}(b={}, h={}, row={}, col={})", label, b, h, s, c);
        }
  return count;
}

}  // namespace

BackwardResult BackwardKernelSubject::run_backward(const Problem& p, const BackwardInputs& in) {
  if (auto refusal = refuse_backward_outside(capabilities(), p)) return *refusal;
  BackwardResult result;
  if (auto refusal = device_refusal(capabilities())) {
    result.status = gpu::context_poisoned() ? Status::fault : Status::unavailable;
    result.message = *refusal;
    return result;
  }
  if (static_cast<std::int64_t>(in.forward.lse.size()) != p.lse_elements()) {
    result.status = Status::error;
    result.message = fmt::format("the handed LSE holds {} values; the problem needs {}", in.forward.lse.size(),
                                 p.lse_elements());
    return result;
  }
  const CallSite site{std::string(name()), to_line(p)};
  try {
    gpu::Stream stream(site);
    const cudaStream_t s = stream.get();
    const HostTensor &q = in.inputs.q, &k = in.inputs.k, &v = in.inputs.v, &o = in.forward.o, &dout = in.dout;
    const auto lse_bytes = static_cast<std::int64_t>(in.forward.lse.size() * sizeof(float));
    DeviceBuffer device_q = upload(q.data(), q.bytes(), s, site, "cudaMemcpy (Q)");
    DeviceBuffer device_k = upload(k.data(), k.bytes(), s, site, "cudaMemcpy (K)");
    DeviceBuffer device_v = upload(v.data(), v.bytes(), s, site, "cudaMemcpy (V)");
    DeviceBuffer device_o = upload(o.data(), o.bytes(), s, site, "cudaMemcpy (O)");
    DeviceBuffer device_dout = upload(dout.data(), dout.bytes(), s, site, "cudaMemcpy (dO)");
    DeviceBuffer device_lse = upload(in.forward.lse.data(), lse_bytes, s, site, "cudaMemcpy (LSE)");
    // The lengths' host copies live until the stream is synchronised below.
    std::vector<std::int32_t> lens_q, lens_kv;
    DeviceBuffer device_lens_q, device_lens_kv;
    if (p.padded()) {
      for (std::int64_t b = 0; b < p.batch; ++b) {
        lens_q.push_back(static_cast<std::int32_t>(p.len_q(b)));
        lens_kv.push_back(static_cast<std::int32_t>(p.len_kv(b)));
      }
      device_lens_q = upload(lens_q.data(), p.batch * 4, s, site, "cudaMemcpy (lens)");
      device_lens_kv = upload(lens_kv.data(), p.batch * 4, s, site, "cudaMemcpy (lens)");
    }

    const int element_bytes = storage_bytes(p.dtype);
    GuardedBuffer dq(p.q_elements(), element_bytes, site), dk(p.k_elements(), element_bytes, site),
        dv(p.v_elements(), element_bytes, site);
    for (GuardedBuffer* buffer : {&dq, &dk, &dv}) buffer->poison(s, site);
    DeviceBuffer delta(static_cast<std::size_t>(p.lse_elements() * 4), site);
    DeviceBuffer dq_accum(dq_accumulator_ ? static_cast<std::size_t>(p.q_elements() * 4) : 0, site);
    if (dq_accum.bytes() > 0) check(cudaMemsetAsync(dq_accum.get(), 0, dq_accum.bytes(), s), "cudaMemsetAsync (dQ accumulator)", site);

    BackwardArgs args;
    gpu::AttentionArgs& a = args.attention;
    a.q = device_q.get();
    a.k = device_k.get();
    a.v = device_v.get();
    a.o = device_o.get();
    a.lse = static_cast<float*>(device_lse.get());
    strides(p.layout, p.heads_q, p.seqlen_q, p.head_dim, a.q_batch_stride, a.q_head_stride, a.q_seq_stride);
    strides(p.layout, p.heads_kv, p.seqlen_kv, p.head_dim, a.k_batch_stride, a.k_head_stride, a.k_seq_stride);
    strides(p.layout, p.heads_kv, p.seqlen_kv, p.head_dim_v, a.v_batch_stride, a.v_head_stride, a.v_seq_stride);
    strides(p.layout, p.heads_q, p.seqlen_q, p.head_dim_v, a.o_batch_stride, a.o_head_stride, a.o_seq_stride);
    a.lens_q = static_cast<const std::int32_t*>(device_lens_q.get());
    a.lens_kv = static_cast<const std::int32_t*>(device_lens_kv.get());
    a.dtype = static_cast<int>(p.dtype);
    a.batch = static_cast<int>(p.batch);
    a.heads_q = static_cast<int>(p.heads_q);
    a.heads_kv = static_cast<int>(p.heads_kv);
    a.seqlen_q = static_cast<int>(p.seqlen_q);
    a.seqlen_kv = static_cast<int>(p.seqlen_kv);
    a.head_dim = static_cast<int>(p.head_dim);
    a.head_dim_v = static_cast<int>(p.head_dim_v);
    a.mask = static_cast<int>(p.mask);
    a.window_left = static_cast<int>(p.window_left);
    a.window_right = static_cast<int>(p.window_right);
    a.scale = static_cast<float>(p.softmax_scale);
    a.stream = s;
    args.dout = device_dout.get();
    args.dq = dq.data();
    args.dk = dk.data();
    args.dv = dv.data();
    args.delta = static_cast<float*>(delta.get());
    args.dq_accum = static_cast<float*>(dq_accum.get());

    const gpu::Event start(site), stop(site);
    check(cudaEventRecord(start.get(), s), "cudaEventRecord", site);
    backward_(args, site);
    check(cudaEventRecord(stop.get(), s), "cudaEventRecord", site);
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize (after the backward kernels)", site);
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, start.get(), stop.get()), "cudaEventElapsedTime", site);
    result.time_ms = elapsed;

    std::vector<std::string> violations;
    std::int64_t first = 0;
    for (const auto& [buffer, label] : {std::pair{&dq, "dQ"}, std::pair{&dk, "dK"}, std::pair{&dv, "dV"}})
      if (const std::int64_t touched = buffer->touched_guard_elements(site, &first))
        violations.push_back(fmt::format("out-of-bounds write: {} element(s) of {}'s guard bands written, the first at "
                                         "element {} (the buffer holds {})",
                                         touched, label, first, buffer->count()));
    result.gradients = make_gradients(p);
    dq.download(result.gradients.dq.data(), site);
    dk.download(result.gradients.dk.data(), site);
    dv.download(result.gradients.dv.data(), site);
    std::int64_t unwritten = 0;
    std::string first_unwritten;
    for (const auto& [tensor, label] : {std::pair{&result.gradients.dq, "dQ"}, std::pair{&result.gradients.dk, "dK"},
                                        std::pair{&result.gradients.dv, "dV"}}) {
      std::string where;
      const std::int64_t count = poisoned_elements(*tensor, label, where);
      if (count > 0 && unwritten == 0) first_unwritten = where;
      unwritten += count;
    }
    if (unwritten)
      violations.push_back(fmt::format("unwritten output: {} element(s) of dQ, dK, dV still hold the poison, the first {}",
                                       unwritten, first_unwritten));

    // Inputs must come back bit-identical.
    for (const auto& [host, device_buffer, label] :
         {std::tuple{q.data(), &device_q, "Q"}, std::tuple{k.data(), &device_k, "K"},
          std::tuple{v.data(), &device_v, "V"}, std::tuple{o.data(), &device_o, "O"},
          std::tuple{dout.data(), &device_dout, "dO"},
          std::tuple{static_cast<const void*>(in.forward.lse.data()), &device_lse, "LSE"}}) {
      std::vector<unsigned char> after(device_buffer->bytes());
      if (after.empty()) continue;
      check(cudaMemcpy(after.data(), device_buffer->get(), after.size(), cudaMemcpyDeviceToHost),
            "cudaMemcpy (input check)", site);
      if (std::memcmp(after.data(), host, after.size()) != 0)
        violations.push_back(fmt::format("input modification: the kernel wrote to {}", label));
    }
    if (!violations.empty()) {
      result.status = Status::error;
      for (const auto& violation : violations) result.message += (result.message.empty() ? "" : "; ") + violation;
    }
  } catch (const gpu::Unsupported& refusal) {
    result = BackwardResult{};
    result.status = Status::unsupported;
    result.message = refusal.what();
  } catch (const gpu::CudaError& error) {
    result.status = error.sticky() ? Status::fault : Status::error;
    result.message = error.what();
  }
  return result;
}

}  // namespace flashcheck::kernels
