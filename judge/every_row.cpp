#include "flashcheck/judge/every_row.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/oracles/kokkos/kokkos_backward.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"
#include "elapsed.hpp"

namespace flashcheck {
namespace {

using judge_detail::elapsed_ms;

// Whether `space` can run the Kokkos references here.
bool runs_here(KokkosSpace space) {
  return space == KokkosSpace::device ? kokkos_device_available() : kokkos_available();
}

// The kind of a verdict decided again on every row: a failure is a deviation
// where the sampled judgement found one or the case reaches a limit the
// subject declares. A pass stays vacuous where the sample was (the judge,
// which knows the compared rows, decides again).
void settle_every_row_kind(CaseResult& result, const std::optional<std::string>& declared_limit) {
  if (!result.verdict.pass && result.verdict_kind != VerdictKind::deviation) {
    result.verdict_kind = declared_limit ? VerdictKind::deviation : VerdictKind::fail;
    if (declared_limit) result.deviation = *declared_limit;
  }
  if (result.verdict.pass && result.verdict_kind != VerdictKind::vacuous) {
    result.verdict_kind = VerdictKind::pass;
    result.deviation.clear();
  }
}

}  // namespace

CrossCheck cross_check(const Problem& p, const AttentionRows& every, const AttentionRows& sampled) {
  CrossCheck check;
  double error_sq = 0, norm_sq = 0;
  std::int64_t at = 0;  // every.rows is sorted, and so is sampled.rows
  for (std::int64_t r = 0; r < sampled.rows.size(); ++r) {
    while (at < every.rows.size() && every.rows.rows[at] < sampled.rows.rows[r]) ++at;
    if (at == every.rows.size() || every.rows.rows[at] != sampled.rows.rows[r]) {
      ++check.nonfinite_mismatches;  // a sampled row the every-row reference lacks: never agree
      continue;
    }
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h) {
        const double want_lse = sampled.lse[sampled.index(b, h, r)], got_lse = every.lse[every.index(b, h, at)];
        if (std::isfinite(want_lse))
          check.lse_relative = std::max(check.lse_relative, std::fabs(got_lse - want_lse) / (1 + std::fabs(want_lse)));
        else if (!(got_lse == want_lse || (std::isnan(got_lse) && std::isnan(want_lse))))
          ++check.nonfinite_mismatches;
        const double* want = sampled.o_row(b, h, r);
        const double* got = every.o_row(b, h, at);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          if (!std::isfinite(want[c]) || !std::isfinite(got[c])) {
            if (!(got[c] == want[c] || (std::isnan(got[c]) && std::isnan(want[c])))) ++check.nonfinite_mismatches;
            continue;
          }
          error_sq += (got[c] - want[c]) * (got[c] - want[c]);
          norm_sq += want[c] * want[c];
        }
      }
  }
  check.o_normwise = norm_sq > 0 ? std::sqrt(error_sq / norm_sq) : std::sqrt(error_sq);
  return check;
}

std::optional<EveryRowReference> every_row_reference(const Problem& problem, const Inputs& inputs,
                                                     const AttentionRows& cpu_sampled) {
  if (!kokkos_device_available()) return std::nullopt;
  EveryRowReference result;
  result.rows = kokkos_reference(problem, inputs, all_rows(problem), Accumulation::f64, {}, KokkosSpace::device);
  result.check = cross_check(problem, result.rows, cpu_sampled);
  return result;
}

bool judge_every_row(CaseResult& result, const Inputs& inputs, const Outputs& subject_outputs,
                     const AttentionRows& sampled_reference, KokkosSpace space,
                     const std::optional<std::string>& declared_limit, AttentionRows* every_reference) {
  const Problem& problem = result.problem;
  const RowSet every = all_rows(problem);
  if (!result.ran() || result.rows == every || !runs_here(space)) return false;

  auto start = std::chrono::steady_clock::now();
  AttentionRows reference = kokkos_reference(problem, inputs, every, Accumulation::f64, {}, space);
  result.oracle_ms += elapsed_ms(start);
  const CrossCheck check = cross_check(problem, reference, sampled_reference);
  const std::int64_t sampled = result.rows.size();
  if (!check.agrees()) {
    result.verdict.pass = false;
    result.verdict_kind = VerdictKind::fail;
    result.verdict.rule = fmt::format(
        "oracles disagree: kokkos_f64 (every row) against cpu_f64 on {} sampled rows: O normwise {:.3g}, LSE {:.3g}, "
        "{} non-finite position(s) differ (bound 1e-12)",
        sampled, check.o_normwise, check.lse_relative, check.nonfinite_mismatches);
    return true;
  }
  start = std::chrono::steady_clock::now();
  AttentionRows baseline = kokkos_baseline(problem, inputs, every, result.baseline_dtype, space);
  if (result.baseline_o_fp8) round_o_to_fp8(baseline, problem.dtype, inputs.v.descale());
  result.baseline_ms += elapsed_ms(start);

  result.rows = every;
  add_accumulation(result.condition, problem, every, inputs.v);
  const DType o_dtype = output_dtype(problem.dtype);  // errors in O's roundings (bf16 for fp8 inputs)
  result.baseline_metrics = compare(problem, baseline, reference, o_dtype);
  const Bounds bounds = rule_bounds(result.baseline_metrics, o_dtype, result.condition);
  result.subject_metrics = compare(problem, gather_rows(problem, subject_outputs, every), reference, o_dtype, bounds);
  result.verdict = decide(result.subject_metrics, result.baseline_metrics, o_dtype, result.condition);
  settle_every_row_kind(result, declared_limit);
  result.verdict.rule += fmt::format(" [every row: kokkos_f64 and the baseline in Kokkos; cpu_f64 agrees on {} sampled rows]",
                                     sampled);
  if (every_reference) *every_reference = std::move(reference);
  return true;
}

namespace {

// Accumulates ||a - b||^2 and ||b||^2 over finite pairs, and counts the
// positions where one is non-finite and the other differs.
struct Difference {
  double error_sq = 0, norm_sq = 0;
  std::int64_t elements = 0, nonfinite_mismatches = 0;
  void add(const double* got, const double* want, std::int64_t count) {
    for (std::int64_t c = 0; c < count; ++c) {
      if (!std::isfinite(want[c]) || !std::isfinite(got[c])) {
        if (!(got[c] == want[c] || (std::isnan(got[c]) && std::isnan(want[c])))) ++nonfinite_mismatches;
        continue;
      }
      error_sq += (got[c] - want[c]) * (got[c] - want[c]);
      norm_sq += want[c] * want[c];
      ++elements;
    }
  }
};

}  // namespace

GradientCrossCheck cross_check_gradients(const Problem& p, const GradientRows& every, const GradientRows& sampled,
                                         const GradientCondition& condition) {
  Difference dq, dk, dv;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < sampled.q_rows.size(); ++r)
        dq.add(every.dq_row(b, h, sampled.q_rows.rows[r]), sampled.dq_row(b, h, r), p.head_dim);
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t r = 0; r < sampled.kv_rows.size(); ++r) {
        dk.add(every.dk_row(b, hk, sampled.kv_rows.rows[r]), sampled.dk_row(b, hk, r), p.head_dim);
        dv.add(every.dv_row(b, hk, sampled.kv_rows.rows[r]), sampled.dv_row(b, hk, r), p.head_dim_v);
      }
  }
  GradientCrossCheck check;
  check.nonfinite_mismatches = dq.nonfinite_mismatches + dk.nonfinite_mismatches + dv.nonfinite_mismatches;
  const struct {
    const char* name;
    const Difference& difference;
    double terms;
  } gradients[] = {{"dq", dq, condition.dq_terms_max + condition.dq_logit_terms_max},
                   {"dk", dk, condition.dk_terms_max + condition.dk_logit_terms_max},
                   {"dv", dv, condition.dv_terms_max + condition.dv_logit_terms_max}};
  for (const auto& g : gradients) {
    const double norm = std::sqrt(g.difference.norm_sq), error = std::sqrt(g.difference.error_sq);
    const double allowed = 1e-12 * (norm + std::sqrt(static_cast<double>(g.difference.elements)) * g.terms);
    const double ratio = allowed > 0 ? error / allowed : (error > 0 ? INFINITY : 0.0);
    if (&g == &gradients[0] || ratio > check.worst_ratio) {
      check.worst_ratio = ratio;
      check.worst = g.name;
      check.worst_normwise = norm > 0 ? error / norm : error;
    }
  }
  return check;
}

bool judge_every_row_gradients(CaseResult& result, const Inputs& inputs, const HostTensor& dout,
                               const Gradients& subject_gradients, const GradientRows& sampled_reference,
                               const AttentionRows& exact_forward, const Outputs& handed_forward, KokkosSpace space,
                               const std::optional<std::string>& declared_limit, GradientRows* every_reference) {
  const Problem& problem = result.problem;
  if (!result.ran() || result.on_every_row() || !runs_here(space)) return false;
  const RowSet every = all_rows(problem), every_kv = all_key_rows(problem);

  auto start = std::chrono::steady_clock::now();
  GradientRows reference = kokkos_gradients(problem, inputs, dout, every, every_kv, {}, space, /*with_condition=*/true);
  result.oracle_ms += elapsed_ms(start);
  GradientCondition condition = gradient_condition(problem, reference, exact_forward, handed_forward, inputs, dout);
  condition.operand_roundoff = result.gradient_condition.operand_roundoff;  // the subject's, set by judge_backward
  const GradientCrossCheck check = cross_check_gradients(problem, reference, sampled_reference, condition);
  const std::int64_t sampled_q = result.rows.size(), sampled_kv = result.kv_rows.size();
  if (!check.agrees()) {
    result.verdict.pass = false;
    result.verdict_kind = VerdictKind::fail;
    result.verdict.rule = fmt::format(
        "oracles disagree: kokkos_f64 gradients (every row) against cpu_f64 on {} sampled query rows and {} key rows: "
        "{} normwise {:.3g} ({:.3g} x the allowed difference), {} non-finite position(s) differ",
        sampled_q, sampled_kv, check.worst, check.worst_normwise, check.worst_ratio, check.nonfinite_mismatches);
    return true;
  }
  start = std::chrono::steady_clock::now();
  const GradientRows baseline =
      kokkos_gradient_baseline(problem, inputs, dout, every, every_kv, result.baseline_dtype, space);
  result.baseline_ms += elapsed_ms(start);

  result.rows = every;
  result.kv_rows = every_kv;
  result.gradient_condition = condition;
  result.baseline_gradients = compare_gradients(problem, baseline, reference, problem.dtype);
  result.subject_gradients =
      compare_gradients(problem, gather_gradients(problem, subject_gradients, every, every_kv), reference, problem.dtype);
  result.verdict = decide_gradients(result.subject_gradients, result.baseline_gradients, problem.dtype, condition);
  settle_every_row_kind(result, declared_limit);
  result.verdict.rule += fmt::format(
      " [every row: kokkos_f64 gradients and the baseline in Kokkos; cpu_f64 agrees on {} query rows and {} key rows]",
      sampled_q, sampled_kv);
  if (every_reference) *every_reference = std::move(reference);
  return true;
}

}  // namespace flashcheck
