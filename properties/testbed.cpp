#include "properties/testbed.hpp"

#include <fmt/format.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "flashcheck/oracles/cpu_lowp.hpp"

namespace flashcheck {

bool Testbed::sufficient(const Problem& problem) const {
  return !unsupported_reason(subject_.capabilities(), problem).has_value();
}

void Testbed::initialize(const Problem& problem, const Inputs& inputs) {
  JudgeOptions options;
  options.keep_outputs = true;
  options.max_rows = std::max<std::int64_t>(problem.seqlen_q, 1);  // every row: derived references need them all
  inputs_ = inputs;
  base_ = judge(subject_, problem, inputs_, options);
  if (base_.status == Status::unsupported) RC_DISCARD("refused at launch: " + base_.message);
  if (!base_.ran()) RC_FAIL("the subject did not run:\n" + explain(base_));
  if (!base_.passed()) RC_FAIL("the base case:\n" + explain(base_));
  outputs_ = gather_rows(problem, base_.outputs, base_.rows);
}

Tolerance Testbed::bound() const {
  const Bounds b = rule_bounds(base_.baseline_metrics, base_.problem.dtype, base_.condition);
  return {*b.o, b.lse.value_or(0)};  // the baseline always has LSE
}

AttentionRows Testbed::run(const Problem& problem, const Inputs& inputs) const {
  const RunResult run = subject_.run(problem, inputs);
  if (run.status == Status::unsupported) RC_DISCARD("refused at launch: " + run.message);
  if (run.status != Status::ok)
    RC_FAIL(fmt::format("the subject returned {}: {}\n  problem: '{}'", to_string(run.status), run.message,
                        to_line(problem)));
  return gather_rows(problem, run.outputs, all_rows(problem));
}

namespace {

// One tensor's element check against a per-element tolerance: NaN/Inf classes
// position by position, then |got - want| on the finite pairs. Leaner than
// compare() (no percentiles, histograms or ULPs), which the base case's
// judgement already computed.
class ElementCheck {
 public:
  explicit ElementCheck(double tolerance) : tolerance_(tolerance) {}
  void add(const Position& at, double got, double want) {
    if (value_class(got) != value_class(want)) {
      if (mismatches_++ == 0) first_mismatch_ = Mismatch{at, got, want, std::numeric_limits<double>::infinity()};
      return;
    }
    if (!std::isfinite(want)) return;  // the same NaN/Inf class: agreement
    ++count_;
    const double error = std::fabs(got - want);
    if (!worst_ || error > worst_->abs_error) worst_ = Mismatch{at, got, want, error};
    if (error > tolerance_ && over_++ == 0) first_over_ = Mismatch{at, got, want, error};
  }
  // Fails the property with the first NaN/Inf mismatch, or the first and worst elements over the tolerance.
  void assert_held(std::string_view relation, const std::string& problems) const {
    if (mismatches_)
      RC_FAIL(fmt::format("{}: {} NaN/Inf position(s) differ; first {}{}", relation, mismatches_, at(first_mismatch_),
                          problems));
    if (over_)
      RC_FAIL(fmt::format("{}: {} of {} elements differ by more than {:.3e}; first {}; worst {}{}", relation, over_,
                          count_, tolerance_, at(first_over_), at(*worst_), problems));
  }

 private:
  static int value_class(double x) { return std::isnan(x) ? 1 : std::isinf(x) ? (x > 0 ? 2 : 3) : 0; }
  static std::string at(const Mismatch& mismatch) {
    return fmt::format("(b={}, h={}, row={}, {}) got {:.9g} want {:.9g}", mismatch.at.b, mismatch.at.h, mismatch.at.row,
                       mismatch.at.column < 0 ? std::string("lse") : fmt::format("col={}", mismatch.at.column),
                       mismatch.got, mismatch.want);
  }
  double tolerance_;
  std::int64_t count_ = 0, over_ = 0, mismatches_ = 0;
  Mismatch first_mismatch_, first_over_;
  std::optional<Mismatch> worst_;
};

}  // namespace

void Testbed::verify(std::string_view relation, const Problem& p, const AttentionRows& got, const AttentionRows& want,
                     const Tolerance& tolerance, const std::vector<const Problem*>& shown) const {
  ElementCheck o(tolerance.o), lse(tolerance.lse);
  const bool with_lse = got.has_lse && want.has_lse;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < want.rows.size(); ++r) {
        const std::int64_t row = want.rows.rows[r];
        if (row >= p.len_q(b)) continue;  // padding
        const double *got_row = got.o_row(b, h, r), *want_row = want.o_row(b, h, r);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) o.add({b, h, row, c}, got_row[c], want_row[c]);
        if (with_lse) lse.add({b, h, row, -1}, got.lse[got.index(b, h, r)], want.lse[want.index(b, h, r)]);
      }
  std::string problems;
  for (const Problem* q : shown) problems += fmt::format("\n  problem: '{}'", to_line(*q));
  problems += fmt::format("\n  base replay: {}", base_.reproducer());
  o.assert_held(relation, problems);
  lse.assert_held(relation, problems);
}

void Testbed::verify_rule(std::string_view what, const AttentionRows& got) const {
  const Problem& p = base_.problem;
  const Bounds bounds = rule_bounds(base_.baseline_metrics, p.dtype, base_.condition);
  CaseResult result = base_;  // the base's baseline, condition and rows; the subject's metrics of `got`
  result.subject_metrics = compare(p, got, base_.reference, p.dtype, bounds);
  result.verdict = decide(result.subject_metrics, base_.baseline_metrics, p.dtype, base_.condition);
  if (!result.verdict.pass) RC_FAIL(fmt::format("{}:\n{}", what, explain(result)));
}

Tolerance Testbed::baseline_bound(const Problem& p, const Inputs& inputs, const AttentionRows& want,
                                  const AttentionRows& condition) const {
  const AttentionRows baseline = cpu_lowp_rows(p, inputs, want.rows, base_.baseline_dtype);
  LogitCondition logits = logit_condition(p, condition);
  logits.input_unit = base_.condition.input_unit;
  add_accumulation(logits, p, want.rows, inputs.v);
  const Bounds b = rule_bounds(compare(p, baseline, want, p.dtype), p.dtype, logits);
  return {*b.o, b.lse.value_or(0)};
}

// ---- tensor transforms ------------------------------------------------------

RowOrder draw_row_order(const std::vector<std::int64_t>& lengths, std::int64_t heads) {
  RowOrder order(lengths.size(), std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(heads)));
  for (std::size_t b = 0; b < lengths.size(); ++b)
    for (auto& rows : order[b]) {
      rows.resize(static_cast<std::size_t>(lengths[b]));
      std::iota(rows.begin(), rows.end(), 0);
      // Fisher-Yates, each swap drawn by RapidCheck.
      for (std::size_t n = rows.size(); n > 1; --n) std::swap(rows[n - 1], rows[*rc::gen::inRange<std::size_t>(0, n)]);
    }
  return order;
}

HostTensor permute_rows(const HostTensor& t, const RowOrder& order) {
  HostTensor out = t;
  std::vector<double> row(static_cast<std::size_t>(t.dim()));
  for (std::int64_t b = 0; b < t.batch(); ++b)
    for (std::int64_t h = 0; h < t.heads(); ++h)
      for (std::size_t s = 0; s < order[b][h].size(); ++s) {
        t.read_row(b, h, order[b][h][s], row.data());
        for (std::int64_t c = 0; c < t.dim(); ++c) out.set(b, h, static_cast<std::int64_t>(s), c, row[c]);
      }
  return out;
}

AttentionRows permute_rows(const AttentionRows& rows, const RowOrder& order) {
  AttentionRows out = rows;
  for (std::int64_t b = 0; b < rows.batch; ++b)
    for (std::int64_t h = 0; h < rows.heads; ++h)
      for (std::size_t s = 0; s < order[b][h].size(); ++s) {
        const auto to = static_cast<std::int64_t>(s), from = order[b][h][s];
        std::copy_n(rows.o_row(b, h, from), rows.dim_v, out.o_row(b, h, to));
        out.lse[out.index(b, h, to)] = rows.lse[rows.index(b, h, from)];
      }
  return out;
}

namespace {

// Copies rows [first, first + out.seqlen()) of (b_from, h_from) of `t` to (b_to, h_to) of `out`.
void copy_rows(const HostTensor& t, std::int64_t b_from, std::int64_t h_from, std::int64_t first, HostTensor& out,
               std::int64_t b_to, std::int64_t h_to) {
  std::vector<double> row(static_cast<std::size_t>(t.dim()));
  for (std::int64_t s = 0; s < out.seqlen(); ++s) {
    t.read_row(b_from, h_from, first + s, row.data());
    for (std::int64_t c = 0; c < t.dim(); ++c) out.set(b_to, h_to, s, c, row[c]);
  }
}

}  // namespace

HostTensor slice_rows(const HostTensor& t, std::int64_t first, std::int64_t count) {
  HostTensor out(t.dtype(), t.layout(), t.batch(), t.heads(), count, t.dim());
  for (std::int64_t b = 0; b < t.batch(); ++b)
    for (std::int64_t h = 0; h < t.heads(); ++h) copy_rows(t, b, h, first, out, b, h);
  return out;
}

HostTensor repeat_heads(const HostTensor& t, std::int64_t times) {
  HostTensor out(t.dtype(), t.layout(), t.batch(), t.heads() * times, t.seqlen(), t.dim());
  for (std::int64_t b = 0; b < t.batch(); ++b)
    for (std::int64_t h = 0; h < out.heads(); ++h) copy_rows(t, b, h / times, 0, out, b, h);
  return out;
}

HostTensor batch_entry(const HostTensor& t, std::int64_t b, std::int64_t length) {
  HostTensor out(t.dtype(), t.layout(), 1, t.heads(), length, t.dim());
  for (std::int64_t h = 0; h < t.heads(); ++h) copy_rows(t, b, h, 0, out, 0, h);
  return out;
}

AttentionRows row_window(const AttentionRows& rows, std::int64_t first, const Problem& entry) {
  AttentionRows out(entry, all_rows(entry));
  for (std::int64_t b = 0; b < out.batch; ++b)
    for (std::int64_t h = 0; h < out.heads; ++h)
      for (std::int64_t s = 0; s < entry.seqlen_q; ++s) {
        std::copy_n(rows.o_row(b, h, first + s), rows.dim_v, out.o_row(b, h, s));
        out.lse[out.index(b, h, s)] = rows.lse[rows.index(b, h, first + s)];
      }
  return out;
}

AttentionRows batch_entry(const AttentionRows& rows, std::int64_t b, const Problem& entry) {
  AttentionRows out(entry, all_rows(entry));
  for (std::int64_t h = 0; h < out.heads; ++h)
    for (std::int64_t s = 0; s < entry.seqlen_q; ++s) {
      std::copy_n(rows.o_row(b, h, s), rows.dim_v, out.o_row(0, h, s));
      out.lse[out.index(0, h, s)] = rows.lse[rows.index(b, h, s)];
    }
  return out;
}

}  // namespace flashcheck
