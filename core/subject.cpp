#include "flashcheck/core/subject.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace flashcheck {

bool Capabilities::accepts_head_dim(std::int64_t d) const {
  if (head_dims[0] == 0) return d >= min_head_dim && d <= max_head_dim;
  return std::find(head_dims.begin(), head_dims.end(), d) != head_dims.end() && d != 0;
}

std::optional<std::string> unsupported_reason(const Capabilities& caps, const Problem& p) {
  if (p.pass == Pass::bwd && !caps.backward) return std::string("the backward pass (pass=bwd) is not supported");
  if (p.pass == Pass::bwd && !caps.backward_single_position && p.seqlen_q == 1 && p.seqlen_kv == 1)
    return std::string("a backward of one query and one key (seqlen_q = seqlen_kv = 1) is not supported");
  if (!caps.dtypes.contains(p.dtype)) return fmt::format("dtype {} is not supported", to_string(p.dtype));
  if (!caps.layouts.contains(p.layout)) return fmt::format("layout {} is not supported", to_string(p.layout));
  if (!caps.masks.contains(p.mask)) return fmt::format("mask {} is not supported", to_string(p.mask));
  if (!caps.accepts_head_dim(p.head_dim)) return fmt::format("head_dim {} is not supported", p.head_dim);
  if (caps.head_dim_v_equal && p.head_dim_v != p.head_dim)
    return fmt::format("head_dim_v {} must equal head_dim {}", p.head_dim_v, p.head_dim);
  if (p.head_dim_v > caps.max_head_dim_v) return fmt::format("head_dim_v {} is above {}", p.head_dim_v, caps.max_head_dim_v);
  if (!caps.gqa && p.heads_kv != p.heads_q)
    return fmt::format("GQA/MQA (heads_q={}, heads_kv={}) is not supported", p.heads_q, p.heads_kv);
  if (!caps.varlen && p.padded()) return std::string("per-sequence lengths are not supported");
  if (!caps.softcap && p.softcap > 0) return std::string("a logit softcap (softcap=) is not supported");
  if (!caps.alibi && p.alibi) return std::string("ALiBi (alibi=yes) is not supported");
  if (p.page_size > 0) {
    if (p.pass == Pass::bwd) return std::string("a paged K/V cache (page=) is the forward's; pass=bwd takes contiguous K/V");
    if (caps.min_page_size == 0) return std::string("a paged K/V cache (page=) is not supported");
    if (p.page_size < caps.min_page_size || p.page_size % caps.page_size_multiple != 0)
      return fmt::format("page={} is not supported (pages of at least {} keys, a multiple of {})", p.page_size,
                         caps.min_page_size, caps.page_size_multiple);
    if (caps.page_size_power_of_two && (p.page_size & (p.page_size - 1)) != 0)
      return fmt::format("page={} is not supported (page sizes are powers of two)", p.page_size);
  }
  if (caps.aligned_masks_need_sq_le_skv && (p.mask == MaskKind::causal_br || p.mask == MaskKind::window) &&
      p.seqlen_q > p.seqlen_kv)
    return fmt::format("mask {} needs seqlen_q <= seqlen_kv (here {} > {})", to_string(p.mask), p.seqlen_q, p.seqlen_kv);
  if (p.seqlen_q % caps.seqlen_q_multiple != 0)
    return fmt::format("seqlen_q {} is not a multiple of {}", p.seqlen_q, caps.seqlen_q_multiple);
  if (p.seqlen_kv % caps.seqlen_kv_multiple != 0)
    return fmt::format("seqlen_kv {} is not a multiple of {}", p.seqlen_kv, caps.seqlen_kv_multiple);
  if (!caps.nonfinite_inputs && p.values.family == ValueFamily::nan_inf)
    return std::string("non-finite inputs (values=nan_inf) are not supported");
  if (caps.may_flush_subnormals && p.values.family == ValueFamily::subnormal)
    return std::string("subnormal inputs (values=subnormal) may be flushed to zero by this subject");
  if (caps.compute_dtype && max_finite(*caps.compute_dtype) < max_finite(p.dtype)) {
    // A subject that computes in a narrower type turns inputs beyond its range into Inf, then NaN.
    if (const auto magnitude = stated_input_magnitude(p); magnitude && *magnitude > max_finite(*caps.compute_dtype))
      return fmt::format("values={} reach |x| = {:.3g}, beyond the range of {} that the subject computes in (max {:g})",
                         to_string(p.values), *magnitude, to_string(*caps.compute_dtype),
                         max_finite(*caps.compute_dtype));
  }
  if (!caps.empty_sequences) {
    bool empty = p.seqlen_q == 0 || p.seqlen_kv == 0;
    for (std::int64_t b = 0; b < p.batch; ++b) empty = empty || p.len_q(b) == 0 || p.len_kv(b) == 0;
    if (empty) return std::string("empty sequences are not supported");
  }
  if (p.seqlen_q > caps.max_seqlen_q) return fmt::format("seqlen_q {} is above {}", p.seqlen_q, caps.max_seqlen_q);
  if (p.seqlen_q < caps.min_seqlen_q) return fmt::format("seqlen_q {} is below {}", p.seqlen_q, caps.min_seqlen_q);
  if (p.seqlen_kv > caps.max_seqlen_kv) return fmt::format("seqlen_kv {} is above {}", p.seqlen_kv, caps.max_seqlen_kv);
  return std::nullopt;
}

std::optional<double> stated_input_magnitude(const Problem& p) {
  const auto& prm = p.values.params;
  const double scale = p.softmax_scale != 0 ? std::abs(p.softmax_scale) : 1.0;
  switch (p.values.family) {
    case ValueFamily::near_overflow: return prm.size() > 1 ? std::optional(std::abs(prm[1]) * max_finite(p.dtype)) : std::nullopt;
    case ValueFamily::uniform: return prm.size() > 1 ? std::optional(std::max(std::abs(prm[0]), std::abs(prm[1]))) : std::nullopt;
    case ValueFamily::offset:  // k_c = offset / (n scale), n = min(d, 16) (core/values.cpp)
      return prm.empty() ? std::nullopt
                         : std::optional(std::abs(prm[0]) / (static_cast<double>(std::min<std::int64_t>(p.head_dim, 16)) * scale));
    case ValueFamily::dominant: return prm.empty() ? std::nullopt : std::optional(std::abs(prm[0]) / scale);
    case ValueFamily::late_max: return prm.size() > 1 ? std::optional(std::abs(prm[1]) / scale) : std::nullopt;
    default: return std::nullopt;
  }
}

std::optional<std::string> declared_deviation(const Capabilities& caps, const Problem& p, double max_abs_v) {
  const bool fp8_limit = caps.fp8_accumulator_keys > 0 && is_fp8(p.dtype);
  if (caps.accumulator_max <= 0 && !fp8_limit) return std::nullopt;
  std::int64_t keys = 0;  // the most keys one row sees
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 0; i < p.len_q(b); ++i) keys = std::max(keys, visible_key_range(p, b, i).count());
  if (fp8_limit && keys > caps.fp8_accumulator_keys)
    return fmt::format("declared limit: O accumulates in the fp8 tensor cores' accumulator, exact to {} keys a row; "
                       "a row here sees {}",
                       caps.fp8_accumulator_keys, keys);
  if (caps.accumulator_max <= 0) return std::nullopt;
  const double reach = max_abs_v * static_cast<double>(keys);
  if (!(reach > caps.accumulator_max)) return std::nullopt;
  return fmt::format("declared limit: the unnormalised softmax accumulator holds |x| <= {:.3g}, and max |V| {:.3g} "
                     "times {} visible keys reaches {:.3g}",
                     caps.accumulator_max, max_abs_v, keys, reach);
}

std::optional<RunResult> refuse_outside(const Capabilities& caps, const Problem& problem) {
  auto reason = unsupported_reason(caps, problem);
  if (!reason) return std::nullopt;
  RunResult result;
  result.status = Status::unsupported;
  result.message = std::move(*reason);
  return result;
}

std::optional<BackwardResult> refuse_backward_outside(const Capabilities& caps, const Problem& problem) {
  auto reason = unsupported_reason(caps, problem);
  if (!reason) return std::nullopt;
  BackwardResult result;
  result.status = Status::unsupported;
  result.message = std::move(*reason);
  return result;
}

std::string describe(const Capabilities& caps) {
  std::vector<std::string_view> dtypes, masks, layouts;
  for (DType t : kDTypes)
    if (caps.dtypes.contains(t)) dtypes.push_back(to_string(t));
  for (MaskKind m : {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window})
    if (caps.masks.contains(m)) masks.push_back(to_string(m));
  for (Layout l : {Layout::bhsd, Layout::bshd})
    if (caps.layouts.contains(l)) layouts.push_back(to_string(l));
  std::string head_dims;
  if (caps.head_dims[0] == 0) {
    head_dims = fmt::format("{}..{}", caps.min_head_dim, caps.max_head_dim);
  } else {
    std::vector<int> listed;
    for (auto d : caps.head_dims)
      if (d != 0) listed.push_back(d);
    head_dims = fmt::format("{}", fmt::join(listed, ","));
  }
  std::string text = fmt::format("dtypes={} d={} dv{} masks={} layouts={} gqa={} varlen={} lse={}",
                                 fmt::join(dtypes, ","), head_dims,
                                 caps.head_dim_v_equal ? std::string("=d") : fmt::format("<={}", caps.max_head_dim_v),
                                 fmt::join(masks, ","), fmt::join(layouts, ","), caps.gqa ? "yes" : "no",
                                 caps.varlen ? "yes" : "no", caps.lse ? "yes" : "no");
  if (caps.seqlen_q_multiple > 1 || caps.seqlen_kv_multiple > 1)
    text += fmt::format(" seqlen_multiple={}/{}", caps.seqlen_q_multiple, caps.seqlen_kv_multiple);
  if (caps.max_seqlen_q < std::numeric_limits<std::int32_t>::max()) text += fmt::format(" sq<={}", caps.max_seqlen_q);
  if (caps.min_seqlen_q > 0) text += fmt::format(" sq>={}", caps.min_seqlen_q);
  if (caps.max_seqlen_kv < std::numeric_limits<std::int32_t>::max()) text += fmt::format(" skv<={}", caps.max_seqlen_kv);
  if (caps.compute_dtype) text += fmt::format(" computes_in={}", to_string(*caps.compute_dtype));
  text += caps.needs_gpu ? fmt::format(" device=gpu(sm_{}+)", caps.min_compute_capability) : " device=cpu";
  if (!caps.nonfinite_inputs) text += " finite_inputs_only";
  if (caps.may_flush_subnormals) text += " may_flush_subnormals";
  if (!caps.empty_sequences) text += " no_empty_sequences";
  if (caps.split_kv) text += " split_kv";
  if (caps.softcap) text += " softcap";
  if (caps.alibi) text += " alibi";
  if (caps.min_page_size > 0)
    text += fmt::format(" page>={}{}", caps.min_page_size, caps.page_size_power_of_two ? "(2^n)" : "");
  if (caps.backward) {
    std::vector<std::string> traits;
    if (caps.backward_deterministic) traits.emplace_back("deterministic");
    if (caps.backward_operands_in_dtype) traits.emplace_back("operands_in_dtype");
    text += traits.empty() ? " backward" : fmt::format(" backward({})", fmt::join(traits, ","));
  }
  if (!caps.forward_from.empty()) text += fmt::format(" forward_from={}", caps.forward_from);
  if (caps.accumulator_max > 0) text += fmt::format(" accumulator_max={:.3g}", caps.accumulator_max);
  if (caps.fp8_output) text += " fp8_output";
  if (caps.fp8_accumulator_keys > 0) text += fmt::format(" fp8_accumulator_keys={}", caps.fp8_accumulator_keys);
  if (caps.product_accumulation_unit > 0)
    text += fmt::format(" product_unit=2^{}", static_cast<int>(std::lround(std::log2(caps.product_accumulation_unit))));
  if (!caps.known_deviations.empty()) text += fmt::format(" deviations=\"{}\"", caps.known_deviations);
  return text;
}

BackwardResult Subject::run_backward(const Problem& problem, const BackwardInputs& /*inputs*/) {
  BackwardResult result;
  result.status = Status::unsupported;
  result.message = unsupported_reason(capabilities(), problem).value_or("the backward pass is not implemented");
  return result;
}

Timing summarise(std::vector<float> samples_ms) {
  Timing timing;
  timing.samples_ms = samples_ms;
  std::sort(samples_ms.begin(), samples_ms.end());
  timing.median_ms = samples_ms[samples_ms.size() / 2];
  timing.min_ms = samples_ms.front();
  timing.max_ms = samples_ms.back();
  return timing;
}

std::string_view to_string(Status status) {
  switch (status) {
    case Status::ok: return "ok";
    case Status::unsupported: return "unsupported";
    case Status::unavailable: return "unavailable";
    case Status::fault: return "fault";
    case Status::error: return "error";
  }
  return "?";
}

Registry& Registry::instance() {
  static Registry registry;
  return registry;
}

void Registry::add(Factory factory, Kind kind) {
  list(kind).factories.push_back(std::move(factory));
}

const std::vector<Subject*>& Registry::materialise(Kind kind) {
  List& l = list(kind);
  while (l.owned.size() < l.factories.size()) {
    l.owned.push_back(l.factories[l.owned.size()]());
    l.view.push_back(l.owned.back().get());
  }
  return l.view;
}

void Registry::mark_unobservable(std::string_view mutant, std::string_view why) {
  unobservable_.emplace_back(std::string(mutant), std::string(why));
}

std::string Registry::unobservable(std::string_view mutant) const {
  for (const auto& [name, why] : unobservable_)
    if (name == mutant) return why;
  return {};
}

Subject* Registry::find(std::string_view name) {
  for (Subject* subject : subjects())
    if (subject->name() == name) return subject;
  for (Subject* mutant : mutants())
    if (mutant->name() == name) return mutant;
  for (Subject* fixture : fixtures())
    if (fixture->name() == name) return fixture;
  for (Subject* smoke : smoke_tests())
    if (smoke->name() == name) return smoke;
  return nullptr;
}

}  // namespace flashcheck
