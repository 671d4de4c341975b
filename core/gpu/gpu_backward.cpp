// GpuSubject's backward: run_backward and time_backward around a subject's
// launch_backward (the header of flashcheck/core/gpu/gpu_subject.hpp says
// what is checked).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flashcheck/core/gpu/gpu_subject.hpp"
#include "launch_support.hpp"

namespace flashcheck::gpu {
namespace {

// One backward call's device tensors: the six inputs, the lengths and the workspaces.
struct DeviceBackward {
  DeviceBuffer q, k, v, o, dout, lse, delta, dq_accum;
  detail::DeviceLengths lengths;
};

// Into `device` (which must not move until the stream is synchronised).
void upload(const Problem& p, const BackwardInputs& in, const std::vector<float>& lse, bool dq_accumulator,
            cudaStream_t stream, const CallSite& site, DeviceBackward& device) {
  const HostTensor &q = in.inputs.q, &k = in.inputs.k, &v = in.inputs.v, &o = in.forward.o, &dout = in.dout;
  device.q = detail::upload(q.data(), q.bytes(), stream, site, "cudaMemcpy (Q)");
  device.k = detail::upload(k.data(), k.bytes(), stream, site, "cudaMemcpy (K)");
  device.v = detail::upload(v.data(), v.bytes(), stream, site, "cudaMemcpy (V)");
  device.o = detail::upload(o.data(), o.bytes(), stream, site, "cudaMemcpy (O)");
  device.dout = detail::upload(dout.data(), dout.bytes(), stream, site, "cudaMemcpy (dO)");
  device.lse = detail::upload(lse.data(), static_cast<std::int64_t>(lse.size() * sizeof(float)), stream, site,
                              "cudaMemcpy (LSE)");
  detail::upload_lengths(p, stream, site, device.lengths);
  device.delta = DeviceBuffer(static_cast<std::size_t>(p.lse_elements() * 4), stream, site);
  device.dq_accum = DeviceBuffer(dq_accumulator ? static_cast<std::size_t>(p.q_elements() * 4) : 0, stream, site);
}

BackwardArgs make_args(const Problem& p, const DeviceBackward& in, void* dq, void* dk, void* dv, cudaStream_t stream) {
  BackwardArgs args;
  AttentionArgs& a = args.attention;
  a.q = in.q.get();
  a.k = in.k.get();
  a.v = in.v.get();
  a.o = in.o.get();
  a.lse = static_cast<float*>(in.lse.get());
  detail::fill_geometry(p, a);
  a.lens_q = static_cast<const std::int32_t*>(in.lengths.q.get());
  a.lens_kv = static_cast<const std::int32_t*>(in.lengths.kv.get());
  a.stream = stream;
  args.dout = in.dout.get();
  args.dq = dq;
  args.dk = dk;
  args.dv = dv;
  args.delta = static_cast<float*>(in.delta.get());
  args.dq_accum = static_cast<float*>(in.dq_accum.get());
  return args;
}

// Zeroes the dQ accumulator (where there is one), then launches.
void zero_and_launch(const std::function<void(const BackwardArgs&)>& launch, const BackwardArgs& args,
                     const DeviceBackward& device, const CallSite& site) {
  if (device.dq_accum.bytes() > 0)
    check(cudaMemsetAsync(device.dq_accum.get(), 0, device.dq_accum.bytes(), args.attention.stream),
          "cudaMemsetAsync (dQ accumulator)", site);
  launch(args);
}

}  // namespace

BackwardResult GpuSubject::run_backward(const Problem& p, const BackwardInputs& in) {
  if (auto refusal = refuse_backward_outside(capabilities(), p)) return *refusal;
  BackwardResult result;
  if (auto refusal = detail::device_refusal(capabilities())) {
    result.status = context_poisoned() ? Status::fault : Status::unavailable;
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
  const BackwardNeeds needs = backward_needs();
  try {
    Stream stream(site);
    const cudaStream_t s = stream.get();
    const std::vector<float> lse = backward_lse(in.forward.lse);
    DeviceBackward device;
    upload(p, in, lse, needs.dq_accumulator, s, site, device);
    const int element_bytes = storage_bytes(p.dtype);
    GuardedBuffer dq(p.q_elements(), element_bytes, s, site), dk(p.k_elements(), element_bytes, s, site),
        dv(p.v_elements(), element_bytes, s, site);
    for (GuardedBuffer* buffer : {&dq, &dk, &dv}) buffer->poison(s, site);
    const BackwardArgs args = make_args(p, device, dq.data(), dk.data(), dv.data(), s);

    const Event start(site), stop(site);
    check(cudaEventRecord(start.get(), s), "cudaEventRecord", site);
    zero_and_launch([&](const BackwardArgs& a) { launch_backward(p, a, site); }, args, device, site);
    check(cudaEventRecord(stop.get(), s), "cudaEventRecord", site);
    // The gradients with their guard bands, and the inputs as the backward
    // left them, come back behind it: one synchronisation for the case.
    Downloads back(s, site);
    const std::size_t dq_back = dq.add_to(back), dk_back = dk.add_to(back), dv_back = dv.add_to(back);
    std::vector<std::size_t> inputs_back;
    for (const DeviceBuffer* input : {&device.q, &device.k, &device.v, &device.o, &device.dout, &device.lse})
      inputs_back.push_back(back.add(input->get(), input->bytes()));
    back.wait("cudaStreamSynchronize (after the backward and its downloads)");
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, start.get(), stop.get()), "cudaEventElapsedTime", site);
    result.time_ms = elapsed;

    std::vector<std::string> violations;
    detail::guard_violations({{&dq, back.bytes(dq_back), "dQ"}, {&dk, back.bytes(dk_back), "dK"},
                              {&dv, back.bytes(dv_back), "dV"}},
                             violations);
    result.gradients = make_gradients(p);
    dq.copy_body(back.bytes(dq_back), result.gradients.dq.data());
    dk.copy_body(back.bytes(dk_back), result.gradients.dk.data());
    dv.copy_body(back.bytes(dv_back), result.gradients.dv.data());

    // Unwritten: an element still holding the poison's exact bits; padding
    // rows too where the subject writes them, else they are set to 0 here.
    std::int64_t unwritten = 0;
    std::string first_unwritten;
    const auto sweep = [&](HostTensor& gradient, const char* label, bool query_rows) {
      for (std::int64_t b = 0; b < p.batch; ++b) {
        const std::int64_t valid = query_rows ? p.len_q(b) : p.len_kv(b);
        for (std::int64_t h = 0; h < gradient.heads(); ++h)
          for (std::int64_t row = 0; row < gradient.seqlen(); ++row)
            for (std::int64_t c = 0; c < gradient.dim(); ++c) {
              if (row >= valid && !needs.writes_padding_rows) {
                gradient.set(b, h, row, c, 0.0);
              } else if (detail::still_poisoned(gradient, gradient.offset(b, h, row, c)) && unwritten++ == 0) {
                first_unwritten = fmt::format("{}(b={}, h={}, row={}, col={})", label, b, h, row, c);
              }
            }
      }
    };
    sweep(result.gradients.dq, "dQ", true);
    sweep(result.gradients.dk, "dK", false);
    sweep(result.gradients.dv, "dV", false);
    if (unwritten)
      violations.push_back(
          fmt::format("unwritten output: {} element(s) of dQ, dK, dV still hold the poison, the first {}", unwritten,
                      first_unwritten));

    // Inputs must come back bit-identical.
    const HostTensor &q = in.inputs.q, &k = in.inputs.k, &v = in.inputs.v, &o = in.forward.o, &dout = in.dout;
    detail::input_violations({{q.data(), q.bytes(), back.bytes(inputs_back[0]), "Q"},
                              {k.data(), k.bytes(), back.bytes(inputs_back[1]), "K"},
                              {v.data(), v.bytes(), back.bytes(inputs_back[2]), "V"},
                              {o.data(), o.bytes(), back.bytes(inputs_back[3]), "O"},
                              {dout.data(), dout.bytes(), back.bytes(inputs_back[4]), "dO"},
                              {lse.data(), static_cast<std::int64_t>(lse.size() * sizeof(float)),
                               back.bytes(inputs_back[5]), "LSE"}},
                             "backward", violations);
    if (!violations.empty()) {
      result.status = Status::error;
      result.message = detail::join_violations(violations);
    }
  } catch (const Unsupported& refusal) {
    result = BackwardResult{};  // nothing was written
    result.status = Status::unsupported;
    result.message = refusal.what();
  } catch (const CudaError& error) {
    result.status = error.sticky() ? Status::fault : Status::error;
    result.message = error.what();
  }
  return result;
}

std::optional<Timing> GpuSubject::time_backward(const Problem& p, const BackwardInputs& in, int warmup, int repeats,
                                                int input_sets) {
  if (auto reason = unsupported_reason(capabilities(), p)) throw std::invalid_argument(*reason);
  if (auto refusal = detail::device_refusal(capabilities())) throw std::invalid_argument(*refusal);
  const CallSite site{std::string(name()), to_line(p)};
  const BackwardNeeds needs = backward_needs();
  Stream stream(site);
  const std::vector<float> lse = backward_lse(in.forward.lse);
  const std::size_t count = static_cast<std::size_t>(std::max(1, input_sets));
  std::vector<DeviceBackward> sets(count);  // not resized below: the lengths' host copies stay put
  std::vector<DeviceBuffer> gradients;
  const int element_bytes = storage_bytes(p.dtype);
  for (std::size_t s = 0; s < count; ++s) {
    upload(p, in, lse, needs.dq_accumulator, stream.get(), site, sets[s]);
    gradients.emplace_back(static_cast<std::size_t>(p.q_elements() * element_bytes), stream.get(), site);
    gradients.emplace_back(static_cast<std::size_t>(p.k_elements() * element_bytes), stream.get(), site);
    gradients.emplace_back(static_cast<std::size_t>(p.v_elements() * element_bytes), stream.get(), site);
  }
  return detail::time_launches(
      [&](int n) {
        const auto s = static_cast<std::size_t>(n) % count;
        zero_and_launch([&](const BackwardArgs& a) { launch_backward(p, a, site); },
                        make_args(p, sets[s], gradients[3 * s].get(), gradients[3 * s + 1].get(),
                                  gradients[3 * s + 2].get(), stream.get()),
                        sets[s], site);
      },
      stream.get(), warmup, repeats, site);
}

}  // namespace flashcheck::gpu
