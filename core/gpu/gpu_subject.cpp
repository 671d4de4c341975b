#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "flashcheck/core/gpu/gpu_subject.hpp"

namespace flashcheck::gpu {
namespace {

struct DeviceInputs {
  DeviceBuffer q, k, v, lens_q, lens_kv;
  std::vector<std::int32_t> host_lens_q, host_lens_kv;  // the sources of the lengths' asynchronous copies
};

DeviceInputs upload(const Problem& p, const Inputs& in, cudaStream_t stream, const CallSite& site) {
  DeviceInputs device;
  device.q = DeviceBuffer(static_cast<std::size_t>(in.q.bytes()), site);
  device.k = DeviceBuffer(static_cast<std::size_t>(in.k.bytes()), site);
  device.v = DeviceBuffer(static_cast<std::size_t>(in.v.bytes()), site);
  check(cudaMemcpyAsync(device.q.get(), in.q.data(), in.q.bytes(), cudaMemcpyHostToDevice, stream), "cudaMemcpy (Q)", site);
  check(cudaMemcpyAsync(device.k.get(), in.k.data(), in.k.bytes(), cudaMemcpyHostToDevice, stream), "cudaMemcpy (K)", site);
  check(cudaMemcpyAsync(device.v.get(), in.v.data(), in.v.bytes(), cudaMemcpyHostToDevice, stream), "cudaMemcpy (V)", site);
  if (p.padded()) {
    std::vector<std::int32_t>& lens_q = device.host_lens_q;
    std::vector<std::int32_t>& lens_kv = device.host_lens_kv;
    lens_q.resize(p.batch);
    lens_kv.resize(p.batch);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      lens_q[b] = static_cast<std::int32_t>(p.len_q(b));
      lens_kv[b] = static_cast<std::int32_t>(p.len_kv(b));
    }
    device.lens_q = DeviceBuffer(lens_q.size() * 4, site);
    device.lens_kv = DeviceBuffer(lens_kv.size() * 4, site);
    // On the kernel's stream: a cudaMemcpy from pageable memory may return
    // before its DMA lands, on the legacy stream, which a non-blocking stream's
    // kernel does not wait for.
    check(cudaMemcpyAsync(device.lens_q.get(), lens_q.data(), lens_q.size() * 4, cudaMemcpyHostToDevice, stream),
          "cudaMemcpy (lens)", site);
    check(cudaMemcpyAsync(device.lens_kv.get(), lens_kv.data(), lens_kv.size() * 4, cudaMemcpyHostToDevice, stream),
          "cudaMemcpy (lens)", site);
  }
  return device;
}

// Element strides of a [batch, heads, seq, dim] tensor in a layout.
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

AttentionArgs make_args(const Problem& p, const DeviceInputs& in, void* o, float* lse, cudaStream_t stream) {
  AttentionArgs a;
  a.q = in.q.get();
  a.k = in.k.get();
  a.v = in.v.get();
  a.o = o;
  a.lse = lse;
  strides(p.layout, p.heads_q, p.seqlen_q, p.head_dim, a.q_batch_stride, a.q_head_stride, a.q_seq_stride);
  strides(p.layout, p.heads_kv, p.seqlen_kv, p.head_dim, a.k_batch_stride, a.k_head_stride, a.k_seq_stride);
  strides(p.layout, p.heads_kv, p.seqlen_kv, p.head_dim_v, a.v_batch_stride, a.v_head_stride, a.v_seq_stride);
  strides(p.layout, p.heads_q, p.seqlen_q, p.head_dim_v, a.o_batch_stride, a.o_head_stride, a.o_seq_stride);
  a.lens_q = static_cast<const std::int32_t*>(in.lens_q.get());
  a.lens_kv = static_cast<const std::int32_t*>(in.lens_kv.get());
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
  a.stream = stream;
  return a;
}

std::optional<std::string> device_refusal(const Capabilities& caps) {
  std::string why;
  if (!device_available(&why)) return why;
  if (device_compute_capability() < caps.min_compute_capability)
    return fmt::format("needs compute capability {} or newer; this device has {}", caps.min_compute_capability,
                       device_compute_capability());
  return std::nullopt;
}

}  // namespace

RunResult GpuSubject::run(const Problem& p, const Inputs& in) {
  if (auto refusal_outside = refuse_outside(capabilities(), p)) return *refusal_outside;
  RunResult result;
  if (auto refusal = device_refusal(capabilities())) {
    // No device, no driver or too old a device: this machine cannot run it
    // (unavailable, not outside the domain). A poisoned context is a fault.
    result.status = context_poisoned() ? Status::fault : Status::unavailable;
    result.message = *refusal;
    return result;
  }
  const CallSite site{std::string(name()), to_line(p)};
  try {
    Stream stream(site);
    const DeviceInputs device = upload(p, in, stream.get(), site);
    const bool with_lse = capabilities().lse;
    GuardedBuffer o(p.o_elements(), storage_bytes(p.dtype), site);
    GuardedBuffer lse(with_lse ? p.lse_elements() : 0, 4, site);
    o.poison(stream.get(), site);
    if (with_lse) lse.poison(stream.get(), site);
    const AttentionArgs args =
        make_args(p, device, o.data(), with_lse ? static_cast<float*>(lse.data()) : nullptr, stream.get());
    const Event start(site), stop(site);
    check(cudaEventRecord(start.get(), stream.get()), "cudaEventRecord", site);
    launch(p, args, site);
    check(cudaEventRecord(stop.get(), stream.get()), "cudaEventRecord", site);
    check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize (after the kernel)", site);
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, start.get(), stop.get()), "cudaEventElapsedTime", site);
    result.time_ms = elapsed;

    std::vector<std::string> violations;
    std::int64_t first = 0;
    for (const auto& [buffer, label] : {std::pair{&o, "O"}, std::pair{&lse, "LSE"}}) {
      if (buffer->count() == 0 && buffer == &lse && !with_lse) continue;
      if (const std::int64_t touched = buffer->touched_guard_elements(site, &first))
        violations.push_back(fmt::format("out-of-bounds write: {} element(s) of {}'s guard bands written, the first at "
                                         "element {} (the buffer holds {})",
                                         touched, label, first, buffer->count()));
    }
    result.outputs = make_outputs(p);
    result.outputs.has_lse = with_lse;
    o.download(result.outputs.o.data(), site);
    if (with_lse) lse.download(result.outputs.lse.data(), site);

    // Unwritten: a valid element still holding the poison's exact bits.
    std::int64_t unwritten = 0;
    std::string first_unwritten;
    const HostTensor& out = result.outputs.o;
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t i = 0; i < p.len_q(b); ++i) {
          for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
            const std::int64_t at = out.offset(b, h, i, c);
            const bool poisoned =
                p.dtype == DType::f32
                    ? std::memcmp(static_cast<const std::uint32_t*>(out.data()) + at, &GuardedBuffer::kPoison32, 4) == 0
                    : static_cast<const std::uint16_t*>(out.data())[at] == GuardedBuffer::kPoison16;
            if (poisoned && unwritten++ == 0) first_unwritten = fmt::format("O(b={}, h={}, row={}, col={})", b, h, i, c);
          }
          if (with_lse) {
            const float value = result.outputs.lse[(b * p.heads_q + h) * p.seqlen_q + i];
            if (std::memcmp(&value, &GuardedBuffer::kPoison32, 4) == 0 && unwritten++ == 0)
              first_unwritten = fmt::format("LSE(b={}, h={}, row={})", b, h, i);
          }
        }
    if (unwritten)
      violations.push_back(fmt::format("unwritten output: {} valid element(s) still hold the poison, the first {}",
                                       unwritten, first_unwritten));

    // Inputs must come back bit-identical.
    for (const auto& [host, device_buffer, label] :
         {std::tuple{&in.q, &device.q, "Q"}, std::tuple{&in.k, &device.k, "K"}, std::tuple{&in.v, &device.v, "V"}}) {
      std::vector<unsigned char> after(static_cast<std::size_t>(host->bytes()));
      check(cudaMemcpy(after.data(), device_buffer->get(), after.size(), cudaMemcpyDeviceToHost), "cudaMemcpy (input check)",
            site);
      if (!after.empty() && std::memcmp(after.data(), host->data(), after.size()) != 0)
        violations.push_back(fmt::format("input modification: the kernel wrote to {}", label));
    }
    if (!violations.empty()) {
      result.status = Status::error;
      for (const auto& violation : violations) result.message += (result.message.empty() ? "" : "; ") + violation;
    }
  } catch (const Unsupported& refusal) {
    result = RunResult{};  // nothing was written
    result.status = Status::unsupported;
    result.message = refusal.what();
  } catch (const CudaError& error) {
    result.status = error.sticky() ? Status::fault : Status::error;
    result.message = error.what();
  }
  return result;
}

std::optional<Timing> GpuSubject::time(const Problem& p, const Inputs& in, int warmup, int repeats, int input_sets) {
  if (auto reason = unsupported_reason(capabilities(), p)) throw std::invalid_argument(*reason);
  if (auto refusal = device_refusal(capabilities())) throw std::invalid_argument(*refusal);
  const CallSite site{std::string(name()), to_line(p)};
  Stream stream(site);
  std::vector<DeviceInputs> sets;
  std::vector<DeviceBuffer> outputs, lses;
  for (int s = 0; s < std::max(1, input_sets); ++s) {
    sets.push_back(upload(p, in, stream.get(), site));
    outputs.emplace_back(static_cast<std::size_t>(p.o_elements() * storage_bytes(p.dtype)), site);
    lses.emplace_back(static_cast<std::size_t>(p.lse_elements() * 4), site);
  }
  auto args_for = [&](int n) {
    const auto s = static_cast<std::size_t>(n) % sets.size();
    return make_args(p, sets[s], outputs[s].get(), capabilities().lse ? static_cast<float*>(lses[s].get()) : nullptr,
                     stream.get());
  };
  const Event start(site), stop(site);
  int launched = 0;
  const auto timed_launch = [&] {
    const AttentionArgs args = args_for(launched++);
    check(cudaEventRecord(start.get(), stream.get()), "cudaEventRecord", site);
    launch(p, args, site);
    check(cudaEventRecord(stop.get(), stream.get()), "cudaEventRecord", site);
    check(cudaEventSynchronize(stop.get()), "cudaEventSynchronize", site);
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, start.get(), stop.get()), "cudaEventElapsedTime", site);
    return elapsed;
  };
  for (int n = 0; n < warmup; ++n) launch(p, args_for(launched++), site);
  check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize (warm-up)", site);
  // Then warm up until the time settles: the median of 5 launches within 2%
  // (or 2 us, the events' resolution scale) of the previous 5. A GPU just out
  // of a heavy kernel, or idle, runs at other clocks for a while. At most 1 s
  // of wall time.
  if (warmup > 0) {
    const auto median_of_5 = [&] {
      float batch[5];
      for (float& t : batch) t = timed_launch();
      std::sort(batch, batch + 5);
      return batch[2];
    };
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (float previous = median_of_5(); std::chrono::steady_clock::now() < until;) {
      const float current = median_of_5();
      if (std::fabs(current - previous) <= std::max(0.02f * previous, 0.002f)) break;
      previous = current;
    }
  }
  std::vector<float> times;
  for (int n = 0; n < repeats; ++n) times.push_back(timed_launch());
  return summarise(std::move(times));
}

}  // namespace flashcheck::gpu
