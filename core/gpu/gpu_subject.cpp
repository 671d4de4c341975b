#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "flashcheck/core/gpu/gpu_subject.hpp"
#include "flashcheck/core/paging.hpp"
#include "launch_support.hpp"

namespace flashcheck::gpu {
namespace detail {

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

std::optional<std::string> device_refusal(const Capabilities& caps) {
  std::string why;
  if (!device_available(&why)) return why;
  if (device_compute_capability() < caps.min_compute_capability)
    return fmt::format("needs compute capability {} or newer; this device has {}", caps.min_compute_capability,
                       device_compute_capability());
  return std::nullopt;
}

DeviceBuffer upload(const void* host, std::int64_t bytes, cudaStream_t stream, const CallSite& site, const char* what) {
  DeviceBuffer device(static_cast<std::size_t>(bytes), stream, site);
  if (bytes > 0)
    check(cudaMemcpyAsync(device.get(), host, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice, stream), what,
          site);
  return device;
}

// The per-sequence lengths, for a padded batch or a paged cache (whose readers,
// cuDNN's among them, take lengths with the table).
void upload_lengths(const Problem& p, cudaStream_t stream, const CallSite& site, DeviceLengths& lengths) {
  if (!p.padded() && p.page_size == 0) return;
  lengths.host_q.resize(p.batch);
  lengths.host_kv.resize(p.batch);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    lengths.host_q[b] = static_cast<std::int32_t>(p.len_q(b));
    lengths.host_kv[b] = static_cast<std::int32_t>(p.len_kv(b));
  }
  // On the kernel's stream: a cudaMemcpy from pageable memory may return
  // before its DMA lands, on the legacy stream, which a non-blocking stream's
  // kernel does not wait for.
  lengths.q = upload(lengths.host_q.data(), p.batch * 4, stream, site, "cudaMemcpy (lens)");
  lengths.kv = upload(lengths.host_kv.data(), p.batch * 4, stream, site, "cudaMemcpy (lens)");
}

void fill_geometry(const Problem& p, AttentionArgs& a) {
  strides(p.layout, p.heads_q, p.seqlen_q, p.head_dim, a.q_batch_stride, a.q_head_stride, a.q_seq_stride);
  // Paged K/V are pools of pages of page_size keys: a page takes a batch's place.
  const std::int64_t kv_rows = p.page_size > 0 ? p.page_size : p.seqlen_kv;
  strides(p.layout, p.heads_kv, kv_rows, p.head_dim, a.k_batch_stride, a.k_head_stride, a.k_seq_stride);
  strides(p.layout, p.heads_kv, kv_rows, p.head_dim_v, a.v_batch_stride, a.v_head_stride, a.v_seq_stride);
  strides(p.layout, p.heads_q, p.seqlen_q, p.head_dim_v, a.o_batch_stride, a.o_head_stride, a.o_seq_stride);
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
  a.softcap = static_cast<float>(p.softcap);
}

bool still_poisoned(const HostTensor& tensor, std::int64_t at) {
  if (tensor.dtype() == DType::f32)
    return std::memcmp(static_cast<const std::uint32_t*>(tensor.data()) + at, &GuardedBuffer::kPoison32, 4) == 0;
  return static_cast<const std::uint16_t*>(tensor.data())[at] == GuardedBuffer::kPoison16;
}

void guard_violations(std::initializer_list<ReturnedOutput> outputs, std::vector<std::string>& violations) {
  for (const auto& [buffer, storage, label] : outputs) {
    std::int64_t first = 0;
    if (const std::int64_t touched = buffer->touched_guard_elements(storage, &first))
      violations.push_back(fmt::format("out-of-bounds write: {} element(s) of {}'s guard bands written, the first at "
                                       "element {} (the buffer holds {})",
                                       touched, label, first, buffer->count()));
  }
}

void input_violations(std::initializer_list<HandedInput> inputs, const char* who,
                      std::vector<std::string>& violations) {
  for (const HandedInput& input : inputs)
    if (input.bytes > 0 && std::memcmp(input.after, input.host, static_cast<std::size_t>(input.bytes)) != 0)
      violations.push_back(fmt::format("input modification: the {} wrote to {}", who, input.label));
}

std::string join_violations(const std::vector<std::string>& violations) {
  return fmt::format("{}", fmt::join(violations, "; "));
}

Timing time_launches(const std::function<void(int)>& launch, cudaStream_t stream, int warmup, int repeats,
                     const CallSite& site) {
  const Event start(site), stop(site);
  int launched = 0;
  const auto timed_launch = [&] {
    check(cudaEventRecord(start.get(), stream), "cudaEventRecord", site);
    launch(launched++);
    check(cudaEventRecord(stop.get(), stream), "cudaEventRecord", site);
    check(cudaEventSynchronize(stop.get()), "cudaEventSynchronize", site);
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, start.get(), stop.get()), "cudaEventElapsedTime", site);
    return elapsed;
  };
  for (int n = 0; n < warmup; ++n) launch(launched++);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (warm-up)", site);
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

}  // namespace detail

namespace {

using detail::device_refusal;

struct DeviceInputs {
  DeviceBuffer q, k, v;
  float q_descale = 1, k_descale = 1, v_descale = 1;  // fp8: each tensor's factor (HostTensor::descale)
  DeviceBuffer page_table;  // empty for contiguous K/V
  int pages_per_sequence = 0, pool_pages = 0;
  detail::DeviceLengths lengths;
};

// Into `device` (which must not move until the stream is synchronised: the
// lengths' host copies are the sources of asynchronous copies).
void upload(const Problem& p, const Inputs& in, cudaStream_t stream, const CallSite& site, DeviceInputs& device) {
  device.q = detail::upload(in.q.data(), in.q.bytes(), stream, site, "cudaMemcpy (Q)");
  device.k = detail::upload(in.k.data(), in.k.bytes(), stream, site, "cudaMemcpy (K)");
  device.v = detail::upload(in.v.data(), in.v.bytes(), stream, site, "cudaMemcpy (V)");
  device.q_descale = static_cast<float>(in.q.descale());  // powers of two: exact in f32
  device.k_descale = static_cast<float>(in.k.descale());
  device.v_descale = static_cast<float>(in.v.descale());
  if (p.page_size > 0) {
    if (const std::string why = page_table_mismatch(p, in.pages); !why.empty())
      throw std::invalid_argument("the inputs' page table does not fit the problem: " + why);
    device.page_table = detail::upload(in.pages.entries.data(),
                                       static_cast<std::int64_t>(in.pages.entries.size() * sizeof(std::int32_t)),
                                       stream, site, "cudaMemcpy (page table)");
    device.pages_per_sequence = static_cast<int>(in.pages.per_sequence);
    device.pool_pages = static_cast<int>(in.pages.pages);
  }
  detail::upload_lengths(p, stream, site, device.lengths);
}

AttentionArgs make_args(const Problem& p, const DeviceInputs& in, void* o, float* lse, cudaStream_t stream) {
  AttentionArgs a;
  a.q_descale = in.q_descale;
  a.k_descale = in.k_descale;
  a.v_descale = in.v_descale;
  a.q = in.q.get();
  a.k = in.k.get();
  a.v = in.v.get();
  a.o = o;
  a.lse = lse;
  detail::fill_geometry(p, a);
  a.lens_q = static_cast<const std::int32_t*>(in.lengths.q.get());
  a.lens_kv = static_cast<const std::int32_t*>(in.lengths.kv.get());
  if (p.page_size > 0) {
    a.page_table = static_cast<const std::int32_t*>(in.page_table.get());
    a.page_size = static_cast<int>(p.page_size);
    a.pages_per_sequence = in.pages_per_sequence;
    a.pages = in.pool_pages;
  }
  a.stream = stream;
  return a;
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
  if (p.page_size > 0) {
    if (const std::string why = page_table_mismatch(p, in.pages); !why.empty()) {
      result.status = Status::error;
      result.message = "the inputs' page table does not fit the problem: " + why;
      return result;
    }
  }
  const CallSite site{std::string(name()), to_line(p)};
  try {
    Stream stream(site);
    DeviceInputs device;
    upload(p, in, stream.get(), site, device);
    const bool with_lse = capabilities().lse;
    GuardedBuffer o(p.o_elements(), storage_bytes(output_dtype(p.dtype)), stream.get(), site);
    GuardedBuffer lse(with_lse ? p.lse_elements() : 0, 4, stream.get(), site);
    o.poison(stream.get(), site);
    if (with_lse) lse.poison(stream.get(), site);
    const AttentionArgs args =
        make_args(p, device, o.data(), with_lse ? static_cast<float*>(lse.data()) : nullptr, stream.get());
    const Event start(site), stop(site);
    check(cudaEventRecord(start.get(), stream.get()), "cudaEventRecord", site);
    launch(p, args, site);
    check(cudaEventRecord(stop.get(), stream.get()), "cudaEventRecord", site);
    // The outputs with their guard bands, and the inputs as the kernel left
    // them, come back behind the kernel: one synchronisation for the case.
    Downloads back(stream.get(), site);
    const std::size_t o_back = o.add_to(back), lse_back = lse.add_to(back);
    const std::size_t q_back = back.add(device.q.get(), device.q.bytes()),
                      k_back = back.add(device.k.get(), device.k.bytes()),
                      v_back = back.add(device.v.get(), device.v.bytes()),
                      pages_back = back.add(device.page_table.get(), device.page_table.bytes());
    back.wait("cudaStreamSynchronize (after the kernel and its downloads)");
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, start.get(), stop.get()), "cudaEventElapsedTime", site);
    result.time_ms = elapsed;

    std::vector<std::string> violations;
    if (with_lse)
      detail::guard_violations({{&o, back.bytes(o_back), "O"}, {&lse, back.bytes(lse_back), "LSE"}}, violations);
    else detail::guard_violations({{&o, back.bytes(o_back), "O"}}, violations);
    result.outputs = make_outputs(p);
    result.outputs.has_lse = with_lse;
    o.copy_body(back.bytes(o_back), result.outputs.o.data());
    if (with_lse) lse.copy_body(back.bytes(lse_back), result.outputs.lse.data());

    // Unwritten: a valid element still holding the poison's exact bits.
    std::int64_t unwritten = 0;
    std::string first_unwritten;
    const HostTensor& out = result.outputs.o;
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t i = 0; i < p.len_q(b); ++i) {
          for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
            if (detail::still_poisoned(out, out.offset(b, h, i, c)) && unwritten++ == 0) first_unwritten = fmt::format("O(b={}, h={}, row={}, col={})", b, h, i, c);
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
    detail::input_violations({{in.q.data(), in.q.bytes(), back.bytes(q_back), "Q"},
                              {in.k.data(), in.k.bytes(), back.bytes(k_back), "K"},
                              {in.v.data(), in.v.bytes(), back.bytes(v_back), "V"},
                              {in.pages.entries.data(),
                               static_cast<std::int64_t>(in.pages.entries.size() * sizeof(std::int32_t)),
                               back.bytes(pages_back), "the page table"}},
                             "kernel", violations);
    if (!violations.empty()) {
      result.status = Status::error;
      result.message = detail::join_violations(violations);
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
  const TimingScope timing(*this);
  const CallSite site{std::string(name()), to_line(p)};
  Stream stream(site);
  const std::size_t count = static_cast<std::size_t>(std::max(1, input_sets));
  std::vector<DeviceInputs> sets(count);  // not resized below: the lengths' host copies stay put
  std::vector<DeviceBuffer> outputs, lses;
  for (std::size_t s = 0; s < count; ++s) {
    upload(p, in, stream.get(), site, sets[s]);
    outputs.emplace_back(static_cast<std::size_t>(p.o_elements() * storage_bytes(output_dtype(p.dtype))), stream.get(),
                         site);
    lses.emplace_back(static_cast<std::size_t>(p.lse_elements() * 4), stream.get(), site);
  }
  return detail::time_launches(
      [&](int n) {
        const auto s = static_cast<std::size_t>(n) % count;
        launch(p,
               make_args(p, sets[s], outputs[s].get(),
                         capabilities().lse ? static_cast<float*>(lses[s].get()) : nullptr, stream.get()),
               site);
      },
      stream.get(), warmup, repeats, site);
}

void GpuSubject::launch_backward(const Problem&, const BackwardArgs&, const CallSite&) {
  throw Unsupported(fmt::format("{} has no backward", name()));
}

}  // namespace flashcheck::gpu
