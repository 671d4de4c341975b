#include "flashcheck/testing/testbed.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/testing/reference_cache.hpp"

namespace flashcheck::testing {
namespace {

// A length's class relative to the domain's tile.
std::string length_class(std::int64_t length, std::int64_t tile) {
  if (length <= 1) return std::to_string(length);
  if (tile > 1 && length == tile) return "tile";
  if (tile > 1 && length < tile) return "<tile";
  if (length <= 4 * std::max<std::int64_t>(tile, 1)) return "<=4tile";
  return ">4tile";
}

}  // namespace

// ---- drawing ----------------------------------------------------------------

rc::Gen<Problem> Testbed::problems(DomainLimits limits) const {
  limits.vacuous_only = false;
  return gen_problem_in(capabilities(), limits);
}

Problem Testbed::draw(const rc::Gen<Problem>& problems, const std::function<bool(const Problem&)>& accept) const {
  const Capabilities& caps = capabilities();
  const Problem p = *rc::gen::suchThat(problems, [caps, accept](const Problem& q) {
    return visible_rows(q) > 0 && !unsupported_reason(caps, q) && (!accept || accept(q));
  });
  RC_PRE(visible_rows(p) > 0);  // the guard, should a filter above change
  tag(p);
  RC_TAG(visible_rows(p) > 0 ? "compared_rows=some" : "compared_rows=none");
  return p;
}

void Testbed::tag(const Problem& p) const {
  const Capabilities& caps = capabilities();
  RC_TAG(fmt::format("dtype={}", to_string(p.dtype)));
  RC_TAG(fmt::format("mask={}", to_string(p.mask)));
  RC_TAG(fmt::format("d={}", p.head_dim));
  RC_TAG(p.heads_kv == 1 && p.heads_q > 1 ? std::string("gqa=mqa") : fmt::format("gqa={}", p.group_size()));
  RC_TAG(fmt::format("len_q={}", length_class(p.seqlen_q, caps.tile_q)));
  RC_TAG(fmt::format("len_kv={}", length_class(p.seqlen_kv, caps.tile_kv)));
  RC_TAG(fmt::format("padded={}", p.padded() ? "yes" : "no"));
}

bool Testbed::sufficient(const Problem& problem) const {
  return !unsupported_reason(capabilities(), problem).has_value();
}

// ---- the base case --------------------------------------------------------------

void Testbed::initialize(const Problem& problem) { initialize(problem, generate_inputs(problem)); }

void Testbed::initialize(const Problem& problem, const Inputs& inputs) {
  JudgeOptions options;
  options.keep_outputs = true;
  options.max_rows = std::max<std::int64_t>(problem.seqlen_q, 1);  // every row: derived references need them all
  options.references = &ReferenceCache::instance();
  options.metric_depth = MetricDepth::rule;  // a failure prints the verdict's checks, not the distributions
  inputs_ = inputs;
  base_ = judge(subject_, problem, inputs_, options);
  if (base_.status == Status::unsupported) RC_DISCARD("refused at launch: " + base_.message);
  if (!base_.ran()) RC_FAIL("the subject did not run:\n" + explain(base_));
  if (!base_.passed()) RC_FAIL("the base case:\n" + explain(base_));
  outputs_ = gather_rows(problem, base_.outputs, base_.rows);
}

Tolerance Testbed::bound() const {
  const Bounds b = rule_bounds(base_.baseline_metrics, output_dtype(base_.problem.dtype), base_.condition);
  return {*b.o, b.lse.value_or(0)};  // the baseline always has LSE
}

bool Testbed::inputs_nonzero() const {
  const Problem& p = base_.problem;
  const auto queries = [&](std::int64_t b) { return p.len_q(b); };
  const auto keys = [&](std::int64_t b) { return p.len_kv(b); };
  // A paged pool's keys through its table; contiguous inputs as they are (no copy).
  const Inputs logical = inputs_.pages.paged() ? logical_inputs(p, inputs_) : Inputs{};
  const Inputs& in = inputs_.pages.paged() ? logical : inputs_;
  for (const ValidNorm& norm : {valid_norm(in.q, queries), valid_norm(in.k, keys), valid_norm(in.v, keys)})
    if (norm.any && !norm.nonzero()) return false;
  return true;
}

bool Testbed::reference_has_finite_row() const {
  const Problem& p = base_.problem;
  const AttentionRows& reference = base_.reference;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        const double* o = reference.o_row(b, h, i);
        if (std::isfinite(reference.lse[reference.index(b, h, i)]) &&
            std::all_of(o, o + p.head_dim_v, [](double x) { return std::isfinite(x); }))
          return true;
      }
  return false;
}

bool Testbed::outputs_nonzero() const {
  const HostTensor& o = base_.outputs.o;
  bool nonzero = false;
  for (std::int64_t n = 0; n < o.size() && !nonzero; ++n) {
    const double x = o.load(n);
    nonzero = std::isfinite(x) && x != 0;
  }
  return nonzero && base_.subject_metrics.o.errors.ref_rms > 0;
}

// ---- running ---------------------------------------------------------------------

Outputs Testbed::call(const Problem& problem, const Inputs& inputs) const {
  RunResult run = subject_.run(problem, inputs);
  if (run.status == Status::unsupported) RC_DISCARD("refused at launch: " + run.message);
  if (run.status != Status::ok)
    RC_FAIL(fmt::format("the subject returned {}: {}\n  problem: '{}'", to_string(run.status), run.message,
                        to_line(problem)));
  return std::move(run.outputs);
}

AttentionRows Testbed::run(const Problem& problem, const Inputs& inputs) const {
  return gather_rows(problem, call(problem, inputs), all_rows(problem));
}

// ---- verifying -------------------------------------------------------------------

namespace {

std::string element_at(const Mismatch& mismatch) {
  return fmt::format("(b={}, h={}, row={}, {}) got {:.9g} want {:.9g}", mismatch.at.b, mismatch.at.h, mismatch.at.row,
                     mismatch.at.column < 0 ? std::string("lse") : fmt::format("col={}", mismatch.at.column),
                     mismatch.got, mismatch.want);
}

// One tensor's element check: NaN/Inf classes position by position, then, on
// the finite pairs, whether `got` is outside its bound (the caller says, with
// how far, which ranks the worst element). Leaner than compare() at any
// depth: no moments, RMS or bias statistics.
class ElementCheck {
 public:
  explicit ElementCheck(std::string outside) : outside_(std::move(outside)) {}
  void add(const Position& at, double got, double want, bool outside, double distance) {
    if (value_class(got) != value_class(want)) {
      if (mismatches_++ == 0) first_mismatch_ = Mismatch{at, got, want, std::numeric_limits<double>::infinity()};
      return;
    }
    if (!std::isfinite(want)) return;  // the same NaN/Inf class: agreement
    ++count_;
    if (!worst_ || distance > worst_->abs_error) worst_ = Mismatch{at, got, want, distance};
    if (outside && over_++ == 0) first_over_ = Mismatch{at, got, want, distance};
  }
  // Fails the property with the first NaN/Inf mismatch, or the first and worst elements out of bounds.
  void assert_held(std::string_view relation, const std::string& problems) const {
    if (mismatches_)
      RC_FAIL(fmt::format("{}: {} NaN/Inf position(s) differ; first {}{}", relation, mismatches_,
                          element_at(first_mismatch_), problems));
    if (over_)
      RC_FAIL(fmt::format("{}: {} of {} elements {}; first {}; worst {}{}", relation, over_, count_,
                          outside_, element_at(first_over_), element_at(*worst_), problems));
  }

 private:
  static int value_class(double x) { return std::isnan(x) ? 1 : std::isinf(x) ? (x > 0 ? 2 : 3) : 0; }
  std::string outside_;  // what an element out of bounds does: "differ by more than 1e-3"
  std::int64_t count_ = 0, over_ = 0, mismatches_ = 0;
  Mismatch first_mismatch_, first_over_;
  std::optional<Mismatch> worst_;
};

}  // namespace

std::string Testbed::shown_lines(const std::vector<const Problem*>& shown) const {
  std::string lines;
  for (const Problem* q : shown) lines += fmt::format("\n  problem: '{}'", to_line(*q));
  if (!base_.subject.empty()) lines += fmt::format("\n  base replay: {}", base_.reproducer());
  return lines;
}

void Testbed::verify(std::string_view relation, const Problem& p, const AttentionRows& got, const AttentionRows& want,
                     const Tolerance& tolerance, const std::vector<const Problem*>& shown) const {
  ElementCheck o(fmt::format("differ by more than {:.3e}", tolerance.o)),
      lse(fmt::format("differ by more than {:.3e}", tolerance.lse));
  const bool with_lse = got.has_lse && want.has_lse;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < want.rows.size(); ++r) {
        const std::int64_t row = want.rows.rows[r];
        if (row >= p.len_q(b)) continue;  // padding
        const double *got_row = got.o_row(b, h, r), *want_row = want.o_row(b, h, r);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double error = std::fabs(got_row[c] - want_row[c]);
          o.add({b, h, row, c}, got_row[c], want_row[c], error > tolerance.o, error);
        }
        if (!with_lse) continue;
        const double got_lse = got.lse[got.index(b, h, r)], want_lse = want.lse[want.index(b, h, r)];
        const double error = std::fabs(got_lse - want_lse);
        lse.add({b, h, row, -1}, got_lse, want_lse, error > tolerance.lse, error);
      }
  const std::string problems = shown_lines(shown);
  o.assert_held(relation, problems);
  lse.assert_held(relation, problems);
}

void Testbed::verify_inside(std::string_view relation, const Problem& p, const AttentionRows& got,
                            const Interval& interval) const {
  ElementCheck o("lie outside their interval");
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i)
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double lo = interval.lo.o_row(b, h, i)[c], hi = interval.hi.o_row(b, h, i)[c];
          const double x = got.o_row(b, h, i)[c];
          // `want` is the interval's middle: finite, so that a NaN or Inf output fails the class check.
          o.add({b, h, i, c}, x, lo / 2 + hi / 2, !(x >= lo && x <= hi), x < lo ? lo - x : x > hi ? x - hi : 0.0);
        }
  o.assert_held(relation, shown_lines({&p}));
}

std::int64_t Testbed::verify_bitwise(std::string_view relation, const Problem& p, const AttentionRows& got,
                                     const AttentionRows& want,
                                     const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep) const {
  const auto same_bits = [](double x, double y) { return std::memcmp(&x, &y, sizeof(double)) == 0; };
  std::int64_t compared = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        if (!keep(b, h, i)) continue;
        compared += visible_key_range(p, b, i).count() > 0;
        const double lse_got = got.lse[got.index(b, h, i)], lse_want = want.lse[want.index(b, h, i)];
        if (got.has_lse && !same_bits(lse_got, lse_want))
          RC_FAIL(fmt::format("{}: LSE of (b={}, h={}, row={}) changed: {:.9g} -> {:.9g}{}", relation, b, h, i, lse_want,
                              lse_got, shown_lines({&p})));
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double x = want.o_row(b, h, i)[c], y = got.o_row(b, h, i)[c];
          if (!same_bits(x, y) && !(std::isnan(x) && std::isnan(y)))
            RC_FAIL(fmt::format("{}: O(b={}, h={}, row={}, col={}) changed: {:.9g} -> {:.9g}{}", relation, b, h, i, c, x,
                                y, shown_lines({&p})));
        }
      }
  return compared;
}

void Testbed::verify_rule(std::string_view what, const AttentionRows& got) const {
  const Problem& p = base_.problem;
  const DType o_dtype = output_dtype(p.dtype);
  const Bounds bounds = rule_bounds(base_.baseline_metrics, o_dtype, base_.condition);
  CaseResult result = base_;  // the base's baseline, condition and rows; the subject's metrics of `got`
  result.subject_metrics = compare(p, got, base_.reference, o_dtype, bounds, MetricDepth::rule);
  result.verdict = decide(result.subject_metrics, base_.baseline_metrics, o_dtype, base_.condition);
  if (!result.verdict.pass) RC_FAIL(fmt::format("{}:\n{}", what, explain(result)));
}

Tolerance Testbed::baseline_bound(const Problem& p, const Inputs& inputs, const AttentionRows& want) const {
  // Not cached: transformed inputs recur only while a failure shrinks, and
  // their entries would push out the base cases that other properties share.
  AttentionRows baseline = cpu_lowp_rows(p, inputs, want.rows, base_.baseline_dtype);
  if (baseline_o_in_fp8(capabilities(), p)) round_o_to_fp8(baseline, p.dtype, inputs.v.descale());
  LogitCondition logits = logit_condition(p, want);
  logits.input_unit = base_.condition.input_unit;
  logits.product_unit = base_.condition.product_unit;
  add_accumulation(logits, p, want.rows, inputs.v);
  const DType o_dtype = output_dtype(p.dtype);
  const Bounds b = rule_bounds(compare(p, baseline, want, o_dtype, {}, MetricDepth::extremes), o_dtype, logits);
  return {*b.o, b.lse.value_or(0)};
}

}  // namespace flashcheck::testing
