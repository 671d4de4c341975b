#include "flashcheck/core/tolerance.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>
#include <cmath>
#include <limits>

namespace flashcheck {

double noise_floor(DType dtype, double scale) {
  return kFloorRoundings * std::max(unit_roundoff(dtype) * scale, min_subnormal(dtype) / 2);
}

double logit_noise(const LogitCondition& condition, double value) {
  const double steps = std::ceil(static_cast<double>(condition.head_dim) / kProductStepK);
  return kLogitRoundings *
         (unit_roundoff(DType::f32) * std::sqrt(static_cast<double>(condition.head_dim)) + 2 * condition.input_unit +
          steps * condition.product_unit) *
         value;
}

double lse_logit_noise(const LogitCondition& condition, double value) {
  const auto d = static_cast<double>(condition.head_dim);
  return logit_noise(condition, value) +
         kLogitRoundings * (d - std::ceil(d / kProductStepK)) * condition.product_unit * value;
}

double accumulation_noise(double scale) { return kAccumulationRoundings * unit_roundoff(DType::f32) * scale; }

namespace {

RuleCheck check(std::string metric, double subject, double baseline, double floor) {
  RuleCheck c;
  c.metric = std::move(metric);
  c.subject = subject;
  c.baseline = baseline;
  c.floor = floor;
  c.bound = kBaselineFactor * baseline + floor;
  c.ratio = c.bound > 0 ? subject / c.bound : (subject > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  c.pass = subject <= c.bound;
  return c;
}

// LSE is an f32 quantity in every subject.
constexpr DType kLseDtype = DType::f32;

}  // namespace

Bounds rule_bounds(const CaseMetrics& baseline, DType out_dtype, const LogitCondition& condition) {
  Bounds bounds;
  const auto& o = baseline.o.errors;
  bounds.o = kBaselineFactor * o.max_abs + noise_floor(out_dtype, o.ref_max_abs) + logit_noise(condition, condition.o_max) +
             accumulation_noise(condition.accumulation_o);
  if (baseline.has_lse) {
    const auto& lse = baseline.lse.errors;
    bounds.lse =
        kBaselineFactor * lse.max_abs + noise_floor(kLseDtype, lse.ref_max_abs) + lse_logit_noise(condition, condition.lse_max) +
        accumulation_noise(condition.accumulation_lse);
  }
  return bounds;
}

Verdict decide(const CaseMetrics& subject, const CaseMetrics& baseline, DType out_dtype,
               const LogitCondition& condition) {
  Verdict verdict;
  const auto& so = subject.o.errors;
  const auto& bo = baseline.o.errors;
  verdict.checks.push_back(check("o.max_abs", so.max_abs, bo.max_abs,
                                 noise_floor(out_dtype, bo.ref_max_abs) + logit_noise(condition, condition.o_max) +
                                     accumulation_noise(condition.accumulation_o)));
  verdict.checks.push_back(
      check("o.rmse", so.rmse, bo.rmse,
            noise_floor(out_dtype, bo.ref_rms) + logit_noise(condition, condition.o_rms) +
                accumulation_noise(condition.accumulation_o)));
  if (subject.has_lse && baseline.has_lse) {
    const auto& sl = subject.lse.errors;
    const auto& bl = baseline.lse.errors;
    verdict.checks.push_back(check("lse.max_abs", sl.max_abs, bl.max_abs,
                                   noise_floor(kLseDtype, bl.ref_max_abs) + lse_logit_noise(condition, condition.lse_max) +
                                       accumulation_noise(condition.accumulation_lse)));
    verdict.checks.push_back(check("lse.rmse", sl.rmse, bl.rmse,
                                   noise_floor(kLseDtype, bl.ref_rms) + lse_logit_noise(condition, condition.lse_rms) +
                                       accumulation_noise(condition.accumulation_lse)));
  }
  // The bias check, on O: |mean signed error| (subject, baseline), gated by the
  // subject's t statistic (tolerance.hpp).
  const double bias_floor =
      kBiasFloorRoundings * std::max(unit_roundoff(out_dtype) * bo.ref_rms, min_subnormal(out_dtype)) +
      logit_noise(condition, condition.o_rms) + accumulation_noise(condition.accumulation_o) + so.tie_slack;
  const auto bias_check = [&](const char* metric, double subject_mean, double baseline_mean, double t,
                              std::int64_t count) {
    RuleCheck bias = check(metric, std::fabs(subject_mean), std::fabs(baseline_mean), bias_floor);
    const bool significant = count >= kBiasMinCount && std::fabs(t) > kBiasT;
    const double t_ratio = count >= kBiasMinCount ? std::fabs(t) / kBiasT : 0.0;
    bias.ratio = std::min(bias.ratio, t_ratio);
    bias.pass = bias.pass || !significant;
    verdict.checks.push_back(bias);
  };
  // The subject's bias is measured from the one a correctly rounded output has
  // on these references (ErrorStats::rounding_mean), which is not its doing;
  // the baseline's as before (its own rounding, of values its arithmetic
  // spreads, is part of what plain attention in this precision does).
  bias_check("o.bias", so.mean_signed - so.rounding_mean, bo.mean_signed, so.bias_t, so.count);
  // ErrorStats::mean_magnitude (the error along sign(ref)) is recorded, not
  // judged: as a rule it failed a correct case (tolerance.hpp).
  verdict.census_pass = subject.o.census.mismatches == 0 && (!subject.has_lse || subject.lse.census.mismatches == 0);

  const RuleCheck* decisive = nullptr;
  for (const auto& c : verdict.checks) {
    verdict.worst_ratio = std::max(verdict.worst_ratio, c.ratio);
    if (!c.pass && !decisive) decisive = &c;
  }
  if (!verdict.census_pass) {
    verdict.pass = false;
    const auto& census = subject.o.census.mismatches ? subject.o.census : subject.lse.census;
    const auto& at = census.first_mismatch->at;
    verdict.rule = fmt::format("NaN/Inf census: {} position(s) differ from the oracle; first at (b={}, h={}, row={}, {}): got {}, want {}",
                               census.mismatches, at.b, at.h, at.row,
                               at.column < 0 ? std::string("lse") : fmt::format("col={}", at.column),
                               census.first_mismatch->got, census.first_mismatch->want);
    return verdict;
  }
  if (decisive && decisive->metric == "o.bias") {
    verdict.pass = false;
    verdict.rule = fmt::format(
        "o.bias: mean signed error {:.3e} beyond correct rounding's {:.3e} (t = {:.1f}, |t| > {}) > {} x baseline's "
        "{:.3e} + floor {:.3e} = {:.3e} (ratio {:.2f}): a systematic bias the baseline's rounding does not explain",
        so.mean_signed - so.rounding_mean, so.rounding_mean, so.bias_t, kBiasT, kBaselineFactor, bo.mean_signed,
        decisive->floor, decisive->bound, decisive->subject / decisive->bound);
    return verdict;
  }
  if (decisive) {
    verdict.pass = false;
    verdict.rule = fmt::format("{} {:.3e} > {} x baseline {:.3e} + floor {:.3e} = {:.3e} (ratio {:.2f})", decisive->metric,
                               decisive->subject, kBaselineFactor, decisive->baseline, decisive->floor, decisive->bound,
                               decisive->ratio);
    return verdict;
  }
  const RuleCheck* closest = &verdict.checks.front();
  for (const auto& c : verdict.checks)
    if (c.ratio > closest->ratio) closest = &c;
  verdict.rule = fmt::format("every check within k={} x baseline + floor; closest {} {:.3e} <= {:.3e} (ratio {:.2f})",
                             kBaselineFactor, closest->metric, closest->subject, closest->bound, closest->ratio);
  return verdict;
}

GradientCondition gradient_condition(const Problem& p) {
  GradientCondition c;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    // How many query rows (over the GQA group) see each key.
    std::vector<double> seen_by(static_cast<std::size_t>(p.len_kv(b)), 0.0);
    for (std::int64_t i = 0; i < p.len_q(b); ++i) {
      const VisibleKeys keys = visible_key_range(p, b, i);
      c.dq_terms = std::max(c.dq_terms, static_cast<double>(keys.count()));
      for (std::int64_t j = keys.first; j <= keys.last; ++j) seen_by[j] += static_cast<double>(p.group_size());
    }
    for (double n : seen_by) c.dkv_terms = std::max(c.dkv_terms, n);
  }
  return c;
}

GradientCondition gradient_condition(const Problem& problem, const GradientRows& reference) {
  GradientCondition c = gradient_condition(problem);
  c.dq_terms_max = reference.dq_terms_max;
  c.dk_terms_max = reference.dk_terms_max;
  c.dv_terms_max = reference.dv_terms_max;
  c.dq_logit_terms_max = reference.dq_logit_terms_max;
  c.dk_logit_terms_max = reference.dk_logit_terms_max;
  c.dv_logit_terms_max = reference.dv_logit_terms_max;
  return c;
}


GradientCondition gradient_condition(const Problem& p, const GradientRows& reference, const AttentionRows& exact,
                                     const Outputs& handed, const Inputs& inputs, const HostTensor& dout) {
  GradientCondition c = gradient_condition(p, reference);
  double delta = 0;  // max_i |dO_i . (O_handed,i - O_i)|
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < exact.rows.size(); ++r) {
        const std::int64_t i = exact.rows.rows[r];
        if (i >= p.len_q(b)) continue;
        const double* o = exact.o_row(b, h, r);
        double sum = 0;
        for (std::int64_t col = 0; col < p.head_dim_v; ++col)
          sum += dout.get(b, h, i, col) * (handed.o.get(b, h, i, col) - o[col]);
        if (std::isfinite(sum)) delta = std::max(delta, std::abs(sum));
      }
  c.dq_delta = p.softmax_scale * max_abs_finite(inputs.k) * delta;
  c.dk_delta = p.softmax_scale * max_abs_finite(inputs.q) * delta * reference.key_weight_max;
  return c;
}

Verdict decide_gradients(const GradientMetrics& subject, const GradientMetrics& baseline, DType out_dtype,
                         const GradientCondition& condition) {
  Verdict verdict;
  // scale: max|g_ref| (max check) or its RMS (rmse check); magnitude: T_g;
  // logit: X_g; delta: the handed O's rounding through D.
  const auto floor = [&](double scale, double terms, double magnitude, double logit, double delta) {
    return noise_floor(out_dtype, scale) + delta + accumulation_noise(std::sqrt(std::max(terms, 1.0)) * std::max(scale, magnitude)) +
           kLogitRoundings * unit_roundoff(DType::f32) * logit + condition.operand_roundoff * (magnitude + delta);
  };
  const struct {
    const char* name;
    const TensorMetrics& got;
    const TensorMetrics& base;
    double terms, magnitude, logit, delta;
  } gradients[] = {
      {"dq", subject.dq, baseline.dq, condition.dq_terms, condition.dq_terms_max, condition.dq_logit_terms_max, condition.dq_delta},
      {"dk", subject.dk, baseline.dk, condition.dkv_terms, condition.dk_terms_max, condition.dk_logit_terms_max, condition.dk_delta},
      {"dv", subject.dv, baseline.dv, condition.dkv_terms, condition.dv_terms_max, condition.dv_logit_terms_max, 0.0}};
  for (const auto& g : gradients) {
    const ErrorStats& s = g.got.errors;
    const ErrorStats& b = g.base.errors;
    RuleCheck max_abs = check(fmt::format("{}.max_abs", g.name), s.max_abs, b.max_abs,
                              floor(b.ref_max_abs, g.terms, g.magnitude, g.logit, g.delta));
    RuleCheck rmse = check(fmt::format("{}.rmse", g.name), s.rmse, b.rmse,
                           floor(b.ref_rms, g.terms, g.magnitude, g.logit, g.delta));
    for (RuleCheck* c : {&max_abs, &rmse}) {  // the backward's factor
      c->bound = kGradientBaselineFactor * c->baseline + c->floor;
      c->ratio = c->bound > 0 ? c->subject / c->bound : (c->subject > 0 ? INFINITY : 0.0);
      c->pass = c->subject <= c->bound;
      verdict.checks.push_back(*c);
    }
  }
  for (const auto& g : gradients)
    if (g.got.census.mismatches && verdict.census_pass) {
      verdict.census_pass = false;
      const auto& at = g.got.census.first_mismatch->at;
      verdict.rule = fmt::format("NaN/Inf census: {} position(s) of {} differ from the oracle; first at (b={}, h={}, "
                                 "row={}, col={}): got {}, want {}",
                                 g.got.census.mismatches, g.name, at.b, at.h, at.row, at.column,
                                 g.got.census.first_mismatch->got, g.got.census.first_mismatch->want);
    }
  const RuleCheck* decisive = nullptr;
  const RuleCheck* closest = &verdict.checks.front();
  for (const auto& c : verdict.checks) {
    verdict.worst_ratio = std::max(verdict.worst_ratio, c.ratio);
    if (!c.pass && !decisive) decisive = &c;
    if (c.ratio > closest->ratio) closest = &c;
  }
  verdict.pass = verdict.census_pass && !decisive;
  if (!verdict.census_pass) return verdict;
  if (decisive) {
    verdict.rule = fmt::format("{} {:.3e} > {} x baseline {:.3e} + floor {:.3e} = {:.3e} (ratio {:.2f})",
                               decisive->metric, decisive->subject, kGradientBaselineFactor, decisive->baseline,
                               decisive->floor, decisive->bound, decisive->ratio);
    return verdict;
  }
  verdict.rule = fmt::format("every gradient check within k_g={} x baseline + floor; closest {} {:.3e} <= {:.3e} "
                             "(ratio {:.2f})",
                             kGradientBaselineFactor, closest->metric, closest->subject, closest->bound, closest->ratio);
  return verdict;
}

}  // namespace flashcheck
