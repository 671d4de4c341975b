#include "flashcheck/judge/judge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <tuple>

#include "flashcheck/core/record.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/oracles/cpu_f64_backward.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/judge/every_row.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"
#include "elapsed.hpp"

namespace flashcheck {

using judge_detail::elapsed_ms;

namespace {
// A case's result before it runs: who and what, and Status::unsupported
// where the problem is outside the subject's domain.
CaseResult begin_case(Subject& subject, const Problem& problem) {
  CaseResult result;
  result.problem = problem;
  result.subject = std::string(subject.name());
  result.subject_version = subject.version_info();
  result.baseline_dtype = subject.capabilities().compute_dtype.value_or(problem.dtype);
  if (auto reason = unsupported_reason(subject.capabilities(), problem)) {
    result.status = Status::unsupported;
    result.message = *reason;
  }
  return result;
}

}  // namespace

LogitCondition logit_condition(const Problem& p, const AttentionRows& reference) {
  LogitCondition condition;
  condition.head_dim = p.head_dim;
  if (reference.o_condition.empty()) return condition;
  double o_sum = 0, lse_sum = 0;
  std::int64_t o_count = 0, lse_count = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < reference.rows.size(); ++r) {
        if (reference.rows.rows[r] >= p.len_q(b)) continue;
        const auto row = reference.index(b, h, r);
        const double lse = reference.lse_condition[row];
        if (std::isfinite(lse)) {
          condition.lse_max = std::max(condition.lse_max, lse);
          lse_sum += lse * lse;
          ++lse_count;
        }
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double o = reference.o_condition[row * p.head_dim_v + c];
          if (!std::isfinite(o)) continue;
          condition.o_max = std::max(condition.o_max, o);
          o_sum += o * o;
          ++o_count;
        }
      }
  if (o_count) condition.o_rms = std::sqrt(o_sum / o_count);
  if (lse_count) condition.lse_rms = std::sqrt(lse_sum / lse_count);
  return condition;
}

std::string replay_command(std::string_view subject, const Problem& problem) {
  // Mutants and fixtures live only in flashcheck-testing.
  const auto in = [subject](const std::vector<Subject*>& list) {
    return std::any_of(list.begin(), list.end(), [subject](const Subject* s) { return s->name() == subject; });
  };
  Registry& registry = Registry::instance();
  const bool testing_only = in(registry.mutants()) || in(registry.fixtures());
  return fmt::format("{} run --subject {} --problem '{}'", testing_only ? "flashcheck-testing" : "flashcheck", subject,
                     to_line(problem));
}

std::string_view to_string(VerdictKind kind) {
  switch (kind) {
    case VerdictKind::pass: return "pass";
    case VerdictKind::fail: return "fail";
    case VerdictKind::vacuous: return "vacuous";
    case VerdictKind::deviation: return "deviation";
  }
  return "?";
}

namespace {

// Why a case that failed on its sampled rows is not judged again on every
// row. The rule's floors scale with the largest terms among the rows it
// compares: with every row, one row's large terms (a dominant key's, P = 1)
// set a floor under which another row's whole error can hide, as a flushed
// subnormal dK did (docs/perf.md, 2026-11-28). Every row is judged to find
// more, never to clear what the sample found.
constexpr std::string_view kSampleFailureStands =
    "not run: the case failed on its sampled rows, and that failure stands (every row is judged to find more, "
    "never to clear a failure: a floor set by other rows' larger terms can hide what the sample saw)";

// Why a case asked to be judged on every row was not: no Kokkos for `space` here.
std::string kokkos_cannot_run(KokkosSpace space) {
  return fmt::format("the Kokkos reference cannot run on {} here: {}", space == KokkosSpace::device ? "a GPU" : "the host",
                     kokkos_description());
}

}  // namespace

std::string_view to_string(EveryRow every_row) {
  switch (every_row) {
    case EveryRow::off: return "off";
    case EveryRow::device: return "device";
    case EveryRow::host: return "host";
  }
  return "?";
}

namespace {

// Compared rows (times the query heads) that see at least one key.
std::int64_t visible_compared_rows(const Problem& p, const RowSet& rows) {
  std::int64_t visible = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (const std::int64_t row : rows.rows)
      visible += row < p.len_q(b) && visible_key_range(p, b, row).count() > 0;
  return visible * p.heads_q;
}

// Whether a case that held compared something: a compared row that sees a key,
// and an element of O (a finite pair or a NaN/Inf position of the census: a
// row whose every value is NaN in both still checks NaN propagation).
bool compared_something(const CaseResult& result) {
  const Census& census = result.subject_metrics.o.census;
  const std::int64_t nonfinite = census.want_nan + census.want_pos_inf + census.want_neg_inf + census.got_nan +
                                 census.got_pos_inf + census.got_neg_inf;
  return result.rows_visible > 0 && (result.subject_metrics.o.errors.count > 0 || nonfinite > 0);
}

}  // namespace

void add_accumulation(LogitCondition& condition, const Problem& p, const RowSet& rows, const HostTensor& v) {
  std::int64_t keys = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (const std::int64_t row : rows.rows)
      if (row < p.len_q(b)) keys = std::max(keys, visible_key_range(p, b, row).count());
  condition.accumulation_lse = std::sqrt(static_cast<double>(keys));
  condition.accumulation_o = condition.accumulation_lse * max_abs_finite(v);
}

std::string CaseResult::reproducer() const { return replay_command(subject, problem); }

namespace {
// The verdict of a case the rule decided: a pass that compared nothing is
// vacuous; a failure inside a limit the subject declares is a deviation.
void set_verdict_kind(CaseResult& result, bool compared, const std::optional<std::string>& limit) {
  if (result.verdict.pass) {
    result.verdict_kind = compared ? VerdictKind::pass : VerdictKind::vacuous;
  } else if (limit) {
    result.verdict_kind = VerdictKind::deviation;
    result.deviation = *limit;
  } else {
    result.verdict_kind = VerdictKind::fail;
  }
}

// Whether a backward case compared something: a compared query row that sees
// a key, and an element of a gradient (finite or a NaN/Inf position).
bool compared_gradients(const CaseResult& result) {
  std::int64_t elements = 0;
  for (const TensorMetrics* t : {&result.subject_gradients.dq, &result.subject_gradients.dk, &result.subject_gradients.dv}) {
    const Census& c = t->census;
    elements += t->errors.count + c.want_nan + c.want_pos_inf + c.want_neg_inf + c.got_nan + c.got_pos_inf + c.got_neg_inf;
  }
  return result.rows_visible > 0 && elements > 0;
}

// The worst ratio err(subject) / err(peer) over the three gradients.
double worst_gradient_ratio(const GradientMetrics& subject, const GradientMetrics& peer, bool rmse) {
  double worst = 0;
  const std::pair<const TensorMetrics*, const TensorMetrics*> pairs[] = {
      {&subject.dq, &peer.dq}, {&subject.dk, &peer.dk}, {&subject.dv, &peer.dv}};
  for (const auto& [s, p] : pairs) {
    const double a = rmse ? s->errors.rmse : s->errors.max_abs, b = rmse ? p->errors.rmse : p->errors.max_abs;
    worst = std::max(worst, b > 0 ? a / b : (a > 0 ? INFINITY : 1.0));
  }
  return worst;
}
}  // namespace

CaseResult judge(Subject& subject, const Problem& problem, const JudgeOptions& options) {
  validate(problem);
  if (CaseResult refused = begin_case(subject, problem); refused.status == Status::unsupported) return refused;
  const auto start = std::chrono::steady_clock::now();
  const Inputs inputs = generate_inputs(problem);
  const double inputs_ms = elapsed_ms(start);
  CaseResult result = judge(subject, problem, inputs, options);
  result.inputs_ms = inputs_ms;
  return result;
}

CaseResult judge(Subject& subject, const Problem& problem, const Inputs& inputs, const JudgeOptions& options) {
  validate(problem);
  if (problem.pass == Pass::bwd) return judge_backward(subject, problem, inputs, generate_dout(problem), options);
  CaseResult result = begin_case(subject, problem);
  if (result.status == Status::unsupported) return result;
  const Capabilities& caps = subject.capabilities();

  auto start = std::chrono::steady_clock::now();
  RunResult run = subject.run(problem, inputs);
  result.subject_ms = elapsed_ms(start);
  result.subject_reported_ms = run.time_ms;
  result.status = run.status;
  result.message = run.message;
  if (run.status != Status::ok) return result;

  result.rows = problem.seqlen_q <= options.max_rows ? all_rows(problem)
                                                     : sample_rows(problem, options.max_rows, options.row_seed);
  start = std::chrono::steady_clock::now();
  const AttentionRows reference = options.references
                                       ? options.references->reference(problem, inputs, result.rows)
                                       : cpu_f64_reference(problem, inputs, result.rows, /*with_condition=*/true);
  result.oracle_ms = elapsed_ms(start);

  start = std::chrono::steady_clock::now();
  AttentionRows baseline =
      options.references ? options.references->baseline(problem, inputs, result.rows, result.baseline_dtype)
                         : cpu_lowp_rows(problem, inputs, result.rows, result.baseline_dtype);
  result.baseline_o_fp8 = baseline_o_in_fp8(caps, problem);
  if (result.baseline_o_fp8) round_o_to_fp8(baseline, problem.dtype, inputs.v.descale());
  result.baseline_ms = elapsed_ms(start);

  // O's dtype: the errors are measured in its roundings (bf16 for fp8 inputs).
  const DType o_dtype = output_dtype(problem.dtype);
  result.baseline_metrics = compare(problem, baseline, reference, o_dtype, {}, options.metric_depth);
  result.condition = logit_condition(problem, reference);
  add_accumulation(result.condition, problem, result.rows, inputs.v);
  if (result.baseline_dtype != problem.dtype) result.condition.input_unit = unit_roundoff(result.baseline_dtype);
  result.condition.product_unit = caps.product_accumulation_unit;
  const Bounds bounds = rule_bounds(result.baseline_metrics, o_dtype, result.condition);
  const AttentionRows got = gather_rows(problem, run.outputs, result.rows);
  result.subject_metrics = compare(problem, got, reference, o_dtype, bounds, options.metric_depth);
  result.verdict = decide(result.subject_metrics, result.baseline_metrics, o_dtype, result.condition);
  // The verdict: a pass that compared nothing is vacuous; a failure inside a
  // limit the subject declares is a deviation.
  result.rows_visible = visible_compared_rows(problem, result.rows);
  const std::optional<std::string> limit = declared_deviation(caps, problem, max_abs_finite(inputs.v));
  set_verdict_kind(result, compared_something(result), limit);
  // The peer baseline on the same inputs, for half-precision problems.
  Subject* peer = problem.dtype != DType::f32 ? peer_for(options.peers, problem) : nullptr;
  if (peer && peer != &subject) {
    const RunResult peer_run = peer->run(problem, inputs);
    if (peer_run.status == Status::ok) {
      PeerResult p;
      p.name = std::string(peer->name());
      p.version = peer->version_info();
      p.metrics = compare(problem, gather_rows(problem, peer_run.outputs, result.rows), reference, o_dtype, {},
                          options.metric_depth);
      auto ratio = [](double a, double b) { return b > 0 ? a / b : (a > 0 ? INFINITY : 1.0); };
      p.o_max_ratio = ratio(result.subject_metrics.o.errors.max_abs, p.metrics.o.errors.max_abs);
      p.o_rmse_ratio = ratio(result.subject_metrics.o.errors.rmse, p.metrics.o.errors.rmse);
      result.peer = std::move(p);
    }
  }
  // Every row, where the rows were sampled and the options ask: the verdict
  // then rests on every row (cpu_f64's sample cross-checks the reference).
  // The peer's ratios above stay those of the sampled rows. A failure on the
  // sampled rows stands (kSampleFailureStands).
  std::optional<AttentionRows> every_reference;
  if (options.every_row != EveryRow::off && !result.on_every_row()) {
    const KokkosSpace space = options.every_row == EveryRow::host ? KokkosSpace::host : KokkosSpace::device;
    if (!result.verdict.pass) {
      result.every_row_unavailable = std::string(kSampleFailureStands);
    } else {
      every_reference.emplace();
      if (judge_every_row(result, inputs, run.outputs, reference, space, limit, &*every_reference)) {
        if (!result.on_every_row()) every_reference.reset();  // the oracles disagreed: the rows stay the sample
        result.rows_visible = visible_compared_rows(problem, result.rows);
        // A sample that compared nothing can be vacuous where every row is not.
        if (result.verdict.pass)
          result.verdict_kind = compared_something(result) ? VerdictKind::pass : VerdictKind::vacuous;
      } else {
        every_reference.reset();
        result.every_row_unavailable = kokkos_cannot_run(space);
      }
    }
  }
  if (options.keep_outputs) {
    result.outputs = std::move(run.outputs);
    result.reference = every_reference ? std::move(*every_reference) : reference;
  }
  return result;
}

namespace {

// The first element where two tensors differ bitwise (NaNs of the same bits
// equal), as (b, h, row, column), or nothing.
std::optional<Position> first_bitwise_difference(const HostTensor& a, const HostTensor& b) {
  const std::int64_t width = storage_bytes(a.dtype());
  const auto* x = static_cast<const unsigned char*>(a.data());
  const auto* y = static_cast<const unsigned char*>(b.data());
  for (std::int64_t n = 0; n < a.size(); ++n)
    if (std::memcmp(x + n * width, y + n * width, width) != 0) {
      for (std::int64_t bb = 0; bb < a.batch(); ++bb)
        for (std::int64_t h = 0; h < a.heads(); ++h)
          for (std::int64_t s = 0; s < a.seqlen(); ++s)
            for (std::int64_t c = 0; c < a.dim(); ++c)
              if (!(a.get(bb, h, s, c) == b.get(bb, h, s, c)) &&
                  !(std::isnan(a.get(bb, h, s, c)) && std::isnan(b.get(bb, h, s, c))))
                return Position{bb, h, s, c};
      return Position{};  // the bits differ, the values not (NaN payloads, -0 and +0)
    }
  return std::nullopt;
}

double largest_difference(const HostTensor& a, const HostTensor& b) {
  double largest = 0;
  for (std::int64_t n = 0; n < a.size(); ++n) {
    const double d = std::abs(a.load(n) - b.load(n));
    if (std::isfinite(d)) largest = std::max(largest, d);
  }
  return largest;
}

// The backward's reruns (JudgeOptions::backward_reruns): a subject declared
// deterministic must repeat its first run bit for bit; any other has each
// rerun judged by the rule as the first run was, and its spread recorded.
void rerun_backward(Subject& subject, const Problem& problem, const BackwardInputs& handed, const Gradients& first,
                    const GradientRows& reference, int reruns, CaseResult& result) {
  const bool deterministic = subject.capabilities().backward_deterministic;
  for (int k = 1; k <= reruns && result.verdict.pass; ++k) {
    const BackwardResult again = subject.run_backward(problem, handed);
    ++result.reruns;
    if (again.status != Status::ok) {  // the case did not run: as if the first run had not
      result.status = again.status;
      result.message = fmt::format("rerun {} of the backward: {}", k, again.message);
      return;
    }
    const std::tuple<const char*, const HostTensor*, const HostTensor*> pairs[] = {
        {"dQ", &first.dq, &again.gradients.dq}, {"dK", &first.dk, &again.gradients.dk}, {"dV", &first.dv, &again.gradients.dv}};
    for (const auto& [name, a, b] : pairs) {
      result.rerun_spread = std::max(result.rerun_spread, largest_difference(*a, *b));
      if (!deterministic) continue;
      if (const auto at = first_bitwise_difference(*a, *b)) {
        result.verdict.pass = false;
        result.verdict.rule = fmt::format(
            "determinism: the subject declares a deterministic backward, and rerun {} differs bitwise from the first "
            "run in {} at (b={}, h={}, row={}, col={})", k, name, at->b, at->h, at->row, at->column);
        if (at->b >= 0)
          result.verdict.rule += fmt::format(": {:.9g} then {:.9g}", a->get(at->b, at->h, at->row, at->column),
                                             b->get(at->b, at->h, at->row, at->column));
        return;
      }
    }
    if (!deterministic) {
      const GradientMetrics metrics = compare_gradients(
          problem, gather_gradients(problem, again.gradients, result.rows, result.kv_rows), reference, problem.dtype);
      const Verdict verdict =
          decide_gradients(metrics, result.baseline_gradients, problem.dtype, result.gradient_condition);
      if (!verdict.pass) {
        result.verdict = verdict;
        result.verdict.rule = fmt::format("rerun {} of a non-deterministic backward: {}", k, verdict.rule);
        result.subject_gradients = metrics;
        return;
      }
    }
  }
}

}  // namespace

BackwardInputs hand_over(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                         AttentionRows* exact_forward) {
  BackwardInputs handed;
  handed.inputs = inputs;
  handed.dout = dout;
  AttentionRows forward = cpu_f64_reference(problem, inputs, all_rows(problem));
  handed.forward = backward_outputs(problem, forward);
  if (exact_forward) *exact_forward = std::move(forward);
  return handed;
}

CaseResult judge_backward(Subject& subject, const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                          const JudgeOptions& options) {
  validate(problem);
  if (problem.pass != Pass::bwd) throw BadInput("pass", "judge_backward judges pass=bwd problems only");
  CaseResult result = begin_case(subject, problem);
  if (result.status == Status::unsupported) return result;
  const Capabilities& caps = subject.capabilities();

  // What the subject is handed (core/backward.hpp): the oracle's forward on
  // every row, rounded. Its time counts as the oracle's.
  auto start = std::chrono::steady_clock::now();
  AttentionRows exact_forward;
  const BackwardInputs handed = hand_over(problem, inputs, dout, &exact_forward);
  double forward_ms = elapsed_ms(start);

  start = std::chrono::steady_clock::now();
  BackwardResult run = subject.run_backward(problem, handed);
  result.subject_ms = elapsed_ms(start);
  result.subject_reported_ms = run.time_ms;
  result.status = run.status;
  result.message = run.message;
  if (run.status != Status::ok) return result;

  result.rows = problem.seqlen_q <= options.max_rows ? all_rows(problem)
                                                     : sample_rows(problem, options.max_rows, options.row_seed);
  result.kv_rows = problem.seqlen_kv <= options.max_rows ? all_key_rows(problem)
                                                         : sample_key_rows(problem, options.max_rows, options.row_seed);
  start = std::chrono::steady_clock::now();
  GradientRows reference = cpu_f64_gradients(problem, inputs, dout, result.rows, result.kv_rows);
  result.oracle_ms = forward_ms + elapsed_ms(start);
  start = std::chrono::steady_clock::now();
  const GradientRows baseline =
      cpu_lowp_gradients(problem, inputs, dout, result.rows, result.kv_rows, result.baseline_dtype);
  result.baseline_ms = elapsed_ms(start);

  result.baseline_gradients = compare_gradients(problem, baseline, reference, problem.dtype);
  result.subject_gradients =
      compare_gradients(problem, gather_gradients(problem, run.gradients, result.rows, result.kv_rows), reference,
                        problem.dtype);
  result.gradient_condition = gradient_condition(problem, reference, exact_forward, handed.forward, inputs, dout);
  if (caps.backward_operands_in_dtype)
    result.gradient_condition.operand_roundoff = unit_roundoff(caps.compute_dtype.value_or(problem.dtype));
  result.verdict = decide_gradients(result.subject_gradients, result.baseline_gradients, problem.dtype,
                                    result.gradient_condition);
  result.rows_visible = visible_compared_rows(problem, result.rows);
  rerun_backward(subject, problem, handed, run.gradients, reference, options.backward_reruns, result);
  if (!result.ran()) return result;
  const std::optional<std::string> limit = declared_deviation(caps, problem, max_abs_finite(inputs.v));
  set_verdict_kind(result, compared_gradients(result), limit);

  // Every row, where the rows were sampled and the options ask: the verdict
  // then rests on every query and key row (cpu_f64's sample cross-checks the
  // Kokkos reference), and the peer below is compared on them. A failure on
  // the sampled rows, the first run's or a rerun's, stands (kSampleFailureStands).
  if (options.every_row != EveryRow::off && !result.on_every_row()) {
    const KokkosSpace space = options.every_row == EveryRow::host ? KokkosSpace::host : KokkosSpace::device;
    GradientRows every_reference;
    if (!result.verdict.pass) {
      result.every_row_unavailable = std::string(kSampleFailureStands);
    } else if (judge_every_row_gradients(result, inputs, dout, run.gradients, reference, exact_forward, handed.forward,
                                         space, limit, &every_reference)) {
      if (result.on_every_row()) reference = std::move(every_reference);  // else the oracles disagreed
      result.rows_visible = visible_compared_rows(problem, result.rows);
      if (result.verdict.pass)
        result.verdict_kind = compared_gradients(result) ? VerdictKind::pass : VerdictKind::vacuous;
    } else {
      result.every_row_unavailable = kokkos_cannot_run(space);
    }
  }

  // The peer's backward on the same inputs, for half-precision problems.
  Subject* peer = problem.dtype != DType::f32 ? peer_for(options.peers, problem) : nullptr;
  if (peer && peer != &subject && peer->capabilities().backward) {
    const BackwardResult peer_run = peer->run_backward(problem, handed);
    if (peer_run.status == Status::ok) {
      PeerResult p;
      p.name = std::string(peer->name());
      p.version = peer->version_info();
      p.gradients = compare_gradients(
          problem, gather_gradients(problem, peer_run.gradients, result.rows, result.kv_rows), reference, problem.dtype);
      p.gradient_max_ratio = worst_gradient_ratio(result.subject_gradients, *p.gradients, false);
      p.gradient_rmse_ratio = worst_gradient_ratio(result.subject_gradients, *p.gradients, true);
      result.peer = std::move(p);
    }
  }
  if (options.keep_outputs) {
    result.gradients = std::move(run.gradients);
    result.gradient_reference = reference;
  }
  return result;
}

namespace {

std::string where(const Position& at) {
  return at.column < 0 ? fmt::format("(b={}, h={}, row={}, lse)", at.b, at.h, at.row)
                       : fmt::format("(b={}, h={}, row={}, col={})", at.b, at.h, at.row, at.column);
}

}  // namespace

std::string explain(const CaseResult& r) {
  std::string text = fmt::format("subject {} on '{}'\n", r.subject, to_line(r.problem));
  if (!r.ran()) return text + fmt::format("  status {}: {}\n  replay: {}\n", to_string(r.status), r.message, r.reproducer());
  text += fmt::format("  verdict: {} -- {}\n", r.verdict_kind == VerdictKind::fail ? "FAIL" : to_string(r.verdict_kind), r.verdict.rule);
  if (r.verdict_kind == VerdictKind::vacuous) text += "  nothing was compared: no compared row sees a key (empty or fully masked)\n";
  if (r.verdict_kind == VerdictKind::deviation) text += fmt::format("  {}\n", r.deviation);
  if (r.backward()) {
    // dQ's positions are (batch, query head, query row, column); dK's and
    // dV's (batch, K/V head, key row, column).
    const auto at = [](const Position& p, bool key) {
      return fmt::format("(b={}, {}={}, {}={}, col={})", p.b, key ? "hkv" : "h", p.h, key ? "key" : "row", p.row, p.column);
    };
    const std::tuple<const char*, const TensorMetrics*, bool> gradients[] = {
        {"dQ", &r.subject_gradients.dq, false}, {"dK", &r.subject_gradients.dk, true}, {"dV", &r.subject_gradients.dv, true}};
    for (const auto& [name, tensor, key] : gradients) {
      if (tensor->census.first_mismatch)
        text += fmt::format("  {} NaN/Inf census: {} position(s) differ; first {} got {} want {}\n", name,
                            tensor->census.mismatches, at(tensor->census.first_mismatch->at, key),
                            tensor->census.first_mismatch->got, tensor->census.first_mismatch->want);
      if (tensor->errors.worst)
        text += fmt::format("  {} worst: {} got {:.6g} want {:.6g} (|err| {:.3e}; baseline max |err| {:.3e})\n", name,
                            at(tensor->errors.worst->at, key), tensor->errors.worst->got, tensor->errors.worst->want,
                            tensor->errors.worst->abs_error,
                            tensor == &r.subject_gradients.dq   ? r.baseline_gradients.dq.errors.max_abs
                            : tensor == &r.subject_gradients.dk ? r.baseline_gradients.dk.errors.max_abs
                                                                : r.baseline_gradients.dv.errors.max_abs);
    }
    return text + fmt::format("  replay: {}\n", r.reproducer());
  }
  for (const TensorMetrics* tensor : {&r.subject_metrics.o, &r.subject_metrics.lse}) {
    if (tensor == &r.subject_metrics.lse && !r.subject_metrics.has_lse) continue;
    const char* name = tensor == &r.subject_metrics.o ? "O" : "LSE";
    if (tensor->census.first_mismatch)
      text += fmt::format("  {} NaN/Inf census: {} position(s) differ; first {} got {} want {}\n", name,
                          tensor->census.mismatches, where(tensor->census.first_mismatch->at),
                          tensor->census.first_mismatch->got, tensor->census.first_mismatch->want);
    if (tensor->first_over_bound)
      text += fmt::format("  {} first over bound: {} got {:.6g} want {:.6g}; {} of {} over bound ({:.3f}%)\n", name,
                          where(tensor->first_over_bound->at), tensor->first_over_bound->got,
                          tensor->first_over_bound->want, tensor->over_bound, tensor->errors.count,
                          100.0 * static_cast<double>(tensor->over_bound) /
                              static_cast<double>(std::max<std::int64_t>(tensor->errors.count, 1)));
    if (tensor->errors.worst)
      text += fmt::format("  {} worst: {} got {:.6g} want {:.6g} (|err| {:.3e})\n", name, where(tensor->errors.worst->at),
                          tensor->errors.worst->got, tensor->errors.worst->want, tensor->errors.worst->abs_error);
  }
  return text + fmt::format("  replay: {}\n", r.reproducer());
}

CaseRecord to_record(const CaseResult& r) {
  CaseRecord record;
  record.time = record_time_now();
  record.subject = r.subject;
  record.problem = to_line(r.problem);
  record.geometry_seed = r.problem.geometry_seed;
  record.data_seed = r.problem.data_seed;
  record.dtype = r.problem.dtype;
  record.status = r.status;
  record.reproducer = r.reproducer();
  record.timing = CaseTiming{r.inputs_ms, r.subject_ms, r.oracle_ms, r.baseline_ms, std::nullopt};
  if (std::isfinite(r.subject_reported_ms)) record.timing->subject_reported_ms = r.subject_reported_ms;
  record.message = r.message;
  record.subject_version = r.subject_version;
  if (!r.ran()) {
    record.verdict = r.status == Status::unsupported   ? CaseVerdict::unsupported
                     : r.status == Status::unavailable ? CaseVerdict::unavailable
                     : r.status == Status::fault       ? CaseVerdict::fault
                                                       : CaseVerdict::error;
    return record;
  }
  switch (r.verdict_kind) {
    case VerdictKind::pass: record.verdict = CaseVerdict::pass; break;
    case VerdictKind::fail: record.verdict = CaseVerdict::fail; break;
    case VerdictKind::vacuous: record.verdict = CaseVerdict::vacuous; break;
    case VerdictKind::deviation: record.verdict = CaseVerdict::deviation; break;
  }
  Judgement& judged = record.judged.emplace();
  judged.rule = r.verdict.rule;
  judged.rows_checked = r.rows.size();
  judged.rows_visible = r.rows_visible;
  judged.rows_basis = r.on_every_row() ? RowsBasis::every : RowsBasis::sampled;
  judged.every_row_unavailable = r.every_row_unavailable;
  if (r.verdict_kind == VerdictKind::deviation) judged.deviation = r.deviation;
  judged.tolerance = r.verdict;
  if (r.backward()) {
    judged.kv_rows_checked = r.kv_rows.size();
    judged.gradients = r.subject_gradients;
    judged.baseline = {"cpu_lowp", r.baseline_dtype, {}, r.baseline_gradients};
    judged.gradient_condition = r.gradient_condition;
    judged.reruns = r.reruns;
    judged.rerun_spread = r.rerun_spread;
    if (r.peer)
      judged.peer = PeerRecord{r.peer->name, r.peer->version, {}, 0, 0, r.peer->gradients, r.peer->gradient_max_ratio,
                               r.peer->gradient_rmse_ratio};
    return record;
  }
  judged.metrics = r.subject_metrics;
  judged.baseline = {"cpu_lowp", r.baseline_dtype, r.baseline_metrics, std::nullopt};
  if (r.peer) judged.peer = PeerRecord{r.peer->name, r.peer->version, r.peer->metrics, r.peer->o_max_ratio, r.peer->o_rmse_ratio};
  judged.logit_condition = r.condition;
  return record;
}

}  // namespace flashcheck
