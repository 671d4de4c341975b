#include "properties/subject_properties.hpp"

#include <fmt/format.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include "core/values.hpp"
#include "oracles/judge.hpp"
#include "properties/generators.hpp"

namespace flashcheck {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

JudgeOptions keep_outputs() {
  JudgeOptions options;
  options.keep_outputs = true;
  return options;
}

// Judges a case and keeps its outputs. A refusal discovered at launch (a
// library declining a configuration inside the declared domain) discards the
// case; any other failure to run fails the property.
CaseResult run_case(Subject& subject, const Problem& p, const Inputs& in) {
  CaseResult result = judge(subject, p, in, keep_outputs());
  if (result.status == Status::unsupported) RC_DISCARD("refused at launch: " + result.message);
  if (!result.ran()) RC_FAIL("the subject did not run:\n" + explain(result));
  return result;
}

// Runs a subject without judging it, with the same rules as run_case.
RunResult run_subject(Subject& subject, const Problem& p, const Inputs& in) {
  RunResult run = subject.run(p, in);
  if (run.status == Status::unsupported) RC_DISCARD("refused at launch: " + run.message);
  if (run.status != Status::ok)
    RC_FAIL(fmt::format("the subject returned {}: {}\n  problem: '{}'", to_string(run.status), run.message, to_line(p)));
  return run;
}

// The spec's visibility rule, written once more for the properties (they must
// not trust any implementation's masks).
bool spec_sees(const Problem& p, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) {
  const std::int64_t diagonal = i + lk - lq;
  switch (p.mask) {
    case MaskKind::none: return true;
    case MaskKind::causal_tl: return j <= i;
    case MaskKind::causal_br: return j <= diagonal;
    case MaskKind::window:
      return (p.window_left < 0 || j >= diagonal - p.window_left) &&
             (p.window_right < 0 || j <= diagonal + p.window_right);
  }
  return true;
}

bool sees_any_key(const Problem& p, std::int64_t b, std::int64_t i) {
  for (std::int64_t j = 0; j < p.len_kv(b); ++j)
    if (spec_sees(p, i, j, p.len_q(b), p.len_kv(b))) return true;
  return false;
}

double tensor_norm(const HostTensor& t) {
  double sum = 0;
  for (std::int64_t i = 0; i < t.size(); ++i) {
    const double x = t.load(i);
    if (std::isfinite(x)) sum += x * x;
  }
  return std::sqrt(sum);
}

// Norm over the valid (unpadded) positions of a [batch, heads, seq, dim] tensor,
// and whether there are any.
struct ValidNorm {
  double norm = 0;
  bool any = false;
};

ValidNorm valid_norm(const HostTensor& t, const std::function<std::int64_t(std::int64_t)>& length) {
  ValidNorm result;
  double sum = 0;
  for (std::int64_t b = 0; b < t.batch(); ++b)
    for (std::int64_t h = 0; h < t.heads(); ++h)
      for (std::int64_t s = 0; s < length(b); ++s)
        for (std::int64_t c = 0; c < t.dim(); ++c) {
          result.any = true;
          const double x = t.get(b, h, s, c);
          if (std::isfinite(x)) sum += x * x;
        }
  result.norm = std::sqrt(sum);
  return result;
}

// Asserts that `got` matches `want` (both for the problem `p`) within absolute
// tolerances on O and LSE, with NaN/Inf positions equal; the failure names the
// relation, the problem lines and the first element out of tolerance.
void assert_related(std::string_view relation, const Problem& p, const AttentionRows& got, const AttentionRows& want,
                    double o_tolerance, double lse_tolerance, const std::vector<const Problem*>& shown) {
  const CaseMetrics m = compare(p, got, want, p.dtype, Bounds{o_tolerance, lse_tolerance});
  std::string problems;
  for (const Problem* q : shown) problems += fmt::format("\n  problem: '{}'", to_line(*q));
  auto at = [](const Mismatch& mismatch) {
    return fmt::format("(b={}, h={}, row={}, {}) got {:.9g} want {:.9g}", mismatch.at.b, mismatch.at.h, mismatch.at.row,
                       mismatch.at.column < 0 ? std::string("lse") : fmt::format("col={}", mismatch.at.column),
                       mismatch.got, mismatch.want);
  };
  for (const TensorMetrics* t : {&m.o, &m.lse}) {
    if (t == &m.lse && !m.has_lse) continue;
    const double tolerance = t == &m.o ? o_tolerance : lse_tolerance;
    if (t->census.mismatches)
      RC_FAIL(fmt::format("{}: {} NaN/Inf position(s) differ; first {}{}", relation, t->census.mismatches,
                          at(*t->census.first_mismatch), problems));
    if (t->over_bound)
      RC_FAIL(fmt::format("{}: {} of {} elements differ by more than {:.3e}; first {}; worst {}{}", relation,
                          t->over_bound, t->errors.count, tolerance, at(*t->first_over_bound), at(*t->errors.worst),
                          problems));
  }
}

// Bitwise equality of every element of rows `rows` of (b, h) pairs that `keep` selects.
void assert_bitwise(std::string_view relation, const Problem& p, const Outputs& a, const Outputs& b,
                    const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep, const Problem& shown) {
  std::int64_t compared = 0;
  for (std::int64_t batch = 0; batch < p.batch; ++batch)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(batch); ++i) {
        if (!keep(batch, h, i)) continue;
        ++compared;
        const float lse_a = a.lse[(batch * p.heads_q + h) * p.seqlen_q + i];
        const float lse_b = b.lse[(batch * p.heads_q + h) * p.seqlen_q + i];
        if (a.has_lse && std::memcmp(&lse_a, &lse_b, sizeof(float)) != 0)
          RC_FAIL(fmt::format("{}: LSE of (b={}, h={}, row={}) changed: {:.9g} -> {:.9g}\n  problem: '{}'", relation, batch,
                              h, i, lse_a, lse_b, to_line(shown)));
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double x = a.o.get(batch, h, i, c), y = b.o.get(batch, h, i, c);
          if (std::memcmp(&x, &y, sizeof(double)) != 0 && !(std::isnan(x) && std::isnan(y)))
            RC_FAIL(fmt::format("{}: O(b={}, h={}, row={}, col={}) changed: {:.9g} -> {:.9g}\n  problem: '{}'", relation,
                                batch, h, i, c, x, y, to_line(shown)));
        }
      }
  RC_CLASSIFY(compared == 0, "no row to compare");
}

AttentionRows rows_of(const Problem& p, const Outputs& outputs) { return gather_rows(p, outputs, all_rows(p)); }

// How far a judged case's O and LSE may be from the exact result: its rule
// bound (k x baseline + floor). A relation between two cases' outputs holds
// to within the sum of their bounds, as both are within theirs of exact values
// that satisfy the relation exactly.
struct CaseBound {
  double o = 0, lse = 0;
};

CaseBound bound_of(const CaseResult& r) {
  const Bounds b = rule_bounds(r.baseline_metrics, r.problem.dtype, r.condition);
  return {*b.o, b.lse.value_or(0)};  // the baseline always has LSE
}

/// Two cases' bounds together: the tolerance of a relation between them.
CaseBound operator+(const CaseBound& x, const CaseBound& y) { return {x.o + y.o, x.lse + y.lse}; }

void assert_related(std::string_view relation, const Problem& p, const AttentionRows& got, const AttentionRows& want,
                    const CaseBound& tolerance, const std::vector<const Problem*>& shown) {
  assert_related(relation, p, got, want, tolerance.o, tolerance.lse, shown);
}

// Problems for the exact-arithmetic relations: small integers (exact in every
// dtype, and after the transformations below).
Problem with_small_integers(Problem p) {
  p.values = ValueDist{ValueFamily::sparse_int, {3.0, 0.5}};
  return p;
}

Problem unmasked(Problem p) {
  p.mask = MaskKind::none;
  p.window_left = p.window_right = -1;
  return p;
}

// ---- the properties ---------------------------------------------------------

bool always(const Capabilities&) { return true; }
bool has_unmasked(const Capabilities& caps) { return caps.masks.contains(MaskKind::none); }

void agrees_with_oracle(Subject& subject) {
  const Problem p = *gen_problem_in(subject.capabilities());
  RC_CLASSIFY(true, to_string(p.dtype));
  RC_CLASSIFY(true, to_string(p.mask));
  RC_CLASSIFY(true, "d=" + std::to_string(p.head_dim));
  RC_CLASSIFY(true, to_string(p.values.family));
  const Inputs in = generate_inputs(p);
  const CaseResult r = run_case(subject, p, in);
  if (!r.passed()) RC_FAIL(explain(r));
  // No vacuous pass: inputs that the problem says are non-zero are, and so is
  // the output wherever some row sees a key.
  if (p.values.family != ValueFamily::sparse_int) {
    const auto queries = [&](std::int64_t b) { return p.len_q(b); };
    const auto keys = [&](std::int64_t b) { return p.len_kv(b); };
    for (const ValidNorm& norm : {valid_norm(in.q, queries), valid_norm(in.k, keys), valid_norm(in.v, keys)})
      if (norm.any) RC_ASSERT(norm.norm > 0);
    // A row that sees a key and whose reference is finite has a non-zero output.
    bool some_finite_row = false;
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t slot = 0; slot < r.rows.size(); ++slot) {
          if (r.rows.rows[slot] >= p.len_q(b)) continue;  // padding
          const auto row = r.reference.index(b, h, slot);
          const double* o = r.reference.o_row(b, h, slot);
          some_finite_row = some_finite_row || (std::isfinite(r.reference.lse[row]) &&
                                                std::all_of(o, o + p.head_dim_v, [](double x) { return std::isfinite(x); }));
        }
    if (some_finite_row && p.values.family != ValueFamily::subnormal) {
      RC_ASSERT(r.subject_metrics.o.errors.ref_rms > 0);
      RC_ASSERT(tensor_norm(r.outputs.o) > 0);
    }
  }
}

void key_value_permutation(Subject& subject) {
  const Problem p = unmasked(*gen_problem_in(subject.capabilities(), {.allow_special_values = false}));
  RC_PRE(!unsupported_reason(subject.capabilities(), p));
  const Inputs in = generate_inputs(p);
  Inputs moved = in;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_kv; ++h) {
      std::vector<std::int64_t> order(static_cast<std::size_t>(p.len_kv(b)));
      std::iota(order.begin(), order.end(), 0);
      for (std::size_t n = order.size(); n > 1; --n) std::swap(order[n - 1], order[*rc::gen::inRange<std::size_t>(0, n)]);
      for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
        for (std::int64_t c = 0; c < p.head_dim; ++c) moved.k.set(b, h, j, c, in.k.get(b, h, order[j], c));
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) moved.v.set(b, h, j, c, in.v.get(b, h, order[j], c));
      }
    }
  const CaseResult base = run_case(subject, p, in), permuted = run_case(subject, p, moved);
  assert_related("K/V row permutation", p, rows_of(p, permuted.outputs), rows_of(p, base.outputs),
                 bound_of(base) + bound_of(permuted), {&p});
}

void query_permutation(Subject& subject) {
  const Problem p = unmasked(*gen_problem_in(subject.capabilities(), {.allow_special_values = false}));
  RC_PRE(!unsupported_reason(subject.capabilities(), p));
  const Inputs in = generate_inputs(p);
  Inputs moved = in;
  std::vector<std::vector<std::int64_t>> orders(static_cast<std::size_t>(p.batch));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    auto& order = orders[b];
    order.resize(static_cast<std::size_t>(p.len_q(b)));
    std::iota(order.begin(), order.end(), 0);
    for (std::size_t n = order.size(); n > 1; --n) std::swap(order[n - 1], order[*rc::gen::inRange<std::size_t>(0, n)]);
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i)
        for (std::int64_t c = 0; c < p.head_dim; ++c) moved.q.set(b, h, i, c, in.q.get(b, h, order[i], c));
  }
  const CaseResult base = run_case(subject, p, in), permuted = run_case(subject, p, moved);
  // Row i of the permuted problem is row order[i] of the original.
  const AttentionRows original = rows_of(p, base.outputs);
  AttentionRows expected = original;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        std::copy_n(original.o_row(b, h, orders[b][i]), p.head_dim_v, expected.o_row(b, h, i));
        expected.lse[expected.index(b, h, i)] = original.lse[original.index(b, h, orders[b][i])];
      }
  assert_related("Q row permutation", p, rows_of(p, permuted.outputs), expected, bound_of(base) + bound_of(permuted),
                 {&p});
}

void key_shift_invariance(Subject& subject) {
  const Problem p = with_small_integers(*gen_problem_in(subject.capabilities()));
  const Inputs in = generate_inputs(p);
  // K -> K + 1 w^T moves row i's logits by scale * q_i . w, which softmax
  // ignores; LSE moves by exactly that. |k| <= 3 and |w| <= 250 keep K + w an
  // integer below 256, exact in bf16; shifts reach ~1e3 logits and beyond.
  const double magnitude = *rc::gen::element(1.0, 8.0, 64.0, 250.0);
  std::vector<double> w(static_cast<std::size_t>(p.head_dim));
  for (auto& x : w) x = std::round(magnitude * *rc::gen::inRange(-100, 101) / 100.0);
  Inputs shifted = in;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_kv; ++h)
      for (std::int64_t j = 0; j < p.seqlen_kv; ++j)
        for (std::int64_t c = 0; c < p.head_dim; ++c) shifted.k.set(b, h, j, c, in.k.get(b, h, j, c) + w[c]);
  const CaseResult base = run_case(subject, p, in), moved = run_case(subject, p, shifted);
  AttentionRows expected = rows_of(p, base.outputs);
  double largest_shift = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        double dot = 0;
        for (std::int64_t c = 0; c < p.head_dim; ++c) dot += in.q.get(b, h, i, c) * w[c];
        largest_shift = std::max(largest_shift, std::fabs(p.softmax_scale * dot));
        double& lse = expected.lse[expected.index(b, h, i)];
        if (std::isfinite(lse)) lse += p.softmax_scale * dot;
      }
  RC_CLASSIFY(largest_shift >= 100, "shift >= 100 logits");
  RC_CLASSIFY(largest_shift >= 1000, "shift >= 1000 logits");
  assert_related("K + 1 w^T shift", p, rows_of(p, moved.outputs), expected, bound_of(base) + bound_of(moved), {&p});
}

void value_affine_map(Subject& subject) {
  const Problem p = with_small_integers(*gen_problem_in(subject.capabilities()));
  const Inputs in = generate_inputs(p);
  // V -> aV + b with small dyadic a, b keeps V exact; the weights sum to one,
  // so O -> aO + b on every row that sees a key, and LSE is unchanged.
  const double a = *rc::gen::element(2.0, -1.0, 0.5, -2.0);
  const double shift = *rc::gen::element(0.0, 1.0, -3.0, 0.5);
  Inputs mapped = in;
  for (std::int64_t n = 0; n < mapped.v.size(); ++n) mapped.v.store(n, a * in.v.load(n) + shift);
  const CaseResult base = run_case(subject, p, in), moved = run_case(subject, p, mapped);
  AttentionRows expected = rows_of(p, base.outputs);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        if (!sees_any_key(p, b, i)) continue;  // fully masked: stays 0
        double* o = expected.o_row(b, h, i);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) o[c] = a * o[c] + shift;
      }
  const CaseBound b1 = bound_of(base), b2 = bound_of(moved);
  assert_related("V -> aV + b", p, rows_of(p, moved.outputs), expected, std::fabs(a) * b1.o + b2.o,
                 b1.lse + b2.lse, {&p});
}

void convex_hull(Subject& subject) {
  const Problem p = *gen_problem_in(subject.capabilities(), {.allow_special_values = false});
  const Inputs in = generate_inputs(p);
  const RunResult run = run_subject(subject, p, in);
  // Each O[i, c] is a convex combination of V[j, c] over the keys row i sees,
  // with no tolerance rule: only rounding can carry it past the hull's edge:
  // the weights rounded to the working dtype before P V (as kernels do: their
  // sum then differs from 1 by up to n units of that dtype) and the f32
  // accumulation, i.e. at most (n + 2)(u_f32 + u_work) max|V|.
  // A row that sees no key is exactly 0.
  const double units = unit_roundoff(DType::f32) +
                       unit_roundoff(subject.capabilities().compute_dtype.value_or(p.dtype));
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        const std::int64_t lq = p.len_q(b), lk = p.len_kv(b), hk = h / p.group_size();
        std::int64_t seen = 0;
        for (std::int64_t j = 0; j < lk; ++j) seen += spec_sees(p, i, j, lq, lk);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double o = run.outputs.o.get(b, h, i, c);
          if (seen == 0) {
            if (o != 0.0)
              RC_FAIL(fmt::format("fully masked row (b={}, h={}, row={}) has O={} (want 0)\n  problem: '{}'", b, h, i, o,
                                  to_line(p)));
            continue;
          }
          // The hull of V as the subject sees it: rounded to the dtype it computes
          // in, and, where it declares it may flush subnormals, with them as 0 too.
          const Capabilities& caps = subject.capabilities();
          const DType work = caps.compute_dtype.value_or(p.dtype);
          double lo = kInfinity, hi = -kInfinity;
          for (std::int64_t j = 0; j < lk; ++j)
            if (spec_sees(p, i, j, lq, lk)) {
              const double x = round_to(work, in.v.get(b, hk, j, c));
              // A subject that may flush subnormals sees either x or 0.
              const double flushed = caps.may_flush_subnormals && std::fabs(x) < min_normal(work) ? 0.0 : x;
              lo = std::min({lo, x, flushed});
              hi = std::max({hi, x, flushed});
            }
          const double slack = static_cast<double>(seen + 2) * units * std::max(std::fabs(lo), std::fabs(hi));
          if (!(o >= lo - slack && o <= hi + slack))
            RC_FAIL(fmt::format("O(b={}, h={}, row={}, col={}) = {:.9g} is outside the hull [{:.9g}, {:.9g}] of the {} "
                                "values it sees\n  problem: '{}'",
                                b, h, i, c, o, lo, hi, seen, to_line(p)));
        }
      }
}

bool has_causal(const Capabilities& caps) {
  return caps.masks.contains(MaskKind::causal_tl) || caps.masks.contains(MaskKind::causal_br) ||
         caps.masks.contains(MaskKind::window);
}

void causal_prefix(Subject& subject) {
  Problem p = *gen_problem_in(subject.capabilities(), {.allow_special_values = false});
  RC_PRE(p.mask != MaskKind::none);
  RC_PRE(p.seqlen_kv > 0);
  const Inputs in = generate_inputs(p);
  // Change every key and value from position `cut` on; a row that sees only
  // keys before `cut` must not change by a single bit. The changed values stay
  // finite (a value the map would overflow is negated instead): Inf is outside
  // some domains, and a kernel may weigh a masked key's value by 0.
  const std::int64_t cut = *rc::gen::inRange<std::int64_t>(0, p.seqlen_kv);
  const auto finite = [&](double mapped, double x) { return std::isfinite(round_to(p.dtype, mapped)) ? mapped : -x; };
  Inputs changed = in;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_kv; ++h)
      for (std::int64_t j = cut; j < p.seqlen_kv; ++j) {
        for (std::int64_t c = 0; c < p.head_dim; ++c) {
          const double x = in.k.get(b, h, j, c);
          changed.k.set(b, h, j, c, finite(-3 * x + 1, x));
        }
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double x = in.v.get(b, h, j, c);
          changed.v.set(b, h, j, c, finite(7 * x - 2, x));
        }
      }
  const RunResult before = run_subject(subject, p, in), after = run_subject(subject, p, changed);
  std::int64_t unaffected_rows = 0;
  auto unaffected = [&](std::int64_t b, std::int64_t, std::int64_t i) {
    for (std::int64_t j = cut; j < p.len_kv(b); ++j)
      if (spec_sees(p, i, j, p.len_q(b), p.len_kv(b))) return false;
    ++unaffected_rows;
    return true;
  };
  assert_bitwise("keys past a row's last visible key", p, before.outputs, after.outputs, unaffected, p);
  RC_CLASSIFY(unaffected_rows > 0, "some rows unaffected");
}

void batch_and_head_independence(Subject& subject) {
  const Problem p = *gen_problem_in(subject.capabilities(), {.allow_special_values = false});
  RC_PRE(p.batch * p.heads_kv >= 2);
  const Inputs in = generate_inputs(p);
  // Change one (batch, K/V head)'s K, V and the queries of its head group:
  // every other (batch, head) must not change by a single bit.
  const std::int64_t target_b = *rc::gen::inRange<std::int64_t>(0, p.batch);
  const std::int64_t target_hk = *rc::gen::inRange<std::int64_t>(0, p.heads_kv);
  Inputs changed = in;
  for (std::int64_t j = 0; j < p.seqlen_kv; ++j) {
    for (std::int64_t c = 0; c < p.head_dim; ++c) changed.k.set(target_b, target_hk, j, c, 2 * in.k.get(target_b, target_hk, j, c) - 1);
    for (std::int64_t c = 0; c < p.head_dim_v; ++c) changed.v.set(target_b, target_hk, j, c, -in.v.get(target_b, target_hk, j, c) + 3);
  }
  for (std::int64_t h = target_hk * p.group_size(); h < (target_hk + 1) * p.group_size(); ++h)
    for (std::int64_t i = 0; i < p.seqlen_q; ++i)
      for (std::int64_t c = 0; c < p.head_dim; ++c) changed.q.set(target_b, h, i, c, 0.5 * in.q.get(target_b, h, i, c) + 1);
  const RunResult before = run_subject(subject, p, in), after = run_subject(subject, p, changed);
  assert_bitwise("another (batch, head)'s inputs", p, before.outputs, after.outputs,
                 [&](std::int64_t b, std::int64_t h, std::int64_t) { return b != target_b || h / p.group_size() != target_hk; },
                 p);
}

bool has_gqa(const Capabilities& caps) { return caps.gqa; }

void gqa_equals_repeated_mha(Subject& subject) {
  Problem gqa = *gen_problem_in(subject.capabilities());
  if (gqa.heads_kv == gqa.heads_q) {  // make it grouped: MQA, or a ratio of 2
    if (gqa.heads_q >= 2) gqa.heads_kv = 1;
    else gqa.heads_q = 2;
  }
  RC_PRE(!unsupported_reason(subject.capabilities(), gqa));
  RC_CLASSIFY(gqa.heads_kv == 1, "MQA");
  const Inputs in = generate_inputs(gqa);
  Problem mha = gqa;
  mha.heads_kv = gqa.heads_q;
  RC_PRE(!unsupported_reason(subject.capabilities(), mha));
  Inputs repeated{in.q, HostTensor(mha.dtype, mha.layout, mha.batch, mha.heads_kv, mha.seqlen_kv, mha.head_dim),
                  HostTensor(mha.dtype, mha.layout, mha.batch, mha.heads_kv, mha.seqlen_kv, mha.head_dim_v)};
  for (std::int64_t b = 0; b < mha.batch; ++b)
    for (std::int64_t h = 0; h < mha.heads_kv; ++h)
      for (std::int64_t j = 0; j < mha.seqlen_kv; ++j) {
        for (std::int64_t c = 0; c < mha.head_dim; ++c) repeated.k.set(b, h, j, c, in.k.get(b, h / gqa.group_size(), j, c));
        for (std::int64_t c = 0; c < mha.head_dim_v; ++c) repeated.v.set(b, h, j, c, in.v.get(b, h / gqa.group_size(), j, c));
      }
  const CaseResult grouped = run_case(subject, gqa, in), full = run_case(subject, mha, repeated);
  assert_related("GQA == MHA with repeated K/V", gqa, rows_of(gqa, grouped.outputs), rows_of(mha, full.outputs),
                 bound_of(grouped) + bound_of(full), {&gqa, &mha});
}

bool has_varlen(const Capabilities& caps) { return caps.varlen; }

// The single-sequence problem holding batch entry b of a padded problem.
Problem trimmed(const Problem& p, std::int64_t b) {
  Problem t = p;
  t.batch = 1;
  t.lens_q.clear();
  t.lens_kv.clear();
  t.seqlen_q = p.len_q(b);
  t.seqlen_kv = p.len_kv(b);
  return t;
}

void padded_equals_trimmed(Subject& subject) {
  Problem p = *gen_problem_in(subject.capabilities());
  if (!p.padded()) {  // pad it: a second sequence shorter than the first
    p.batch = 2;
    p.lens_q = {p.seqlen_q, *rc::gen::inRange<std::int64_t>(0, p.seqlen_q + 1)};
    p.lens_kv = {p.seqlen_kv, *rc::gen::inRange<std::int64_t>(0, p.seqlen_kv + 1)};
  }
  RC_PRE(!unsupported_reason(subject.capabilities(), p));
  const Inputs in = generate_inputs(p);
  const CaseResult padded = run_case(subject, p, in);
  const AttentionRows padded_rows = rows_of(p, padded.outputs);
  const CaseBound padded_bound = bound_of(padded);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Problem t = trimmed(p, b);
    if (unsupported_reason(subject.capabilities(), t)) continue;  // e.g. a length the domain's multiples exclude
    Inputs cut{HostTensor(t.dtype, t.layout, 1, t.heads_q, t.seqlen_q, t.head_dim),
               HostTensor(t.dtype, t.layout, 1, t.heads_kv, t.seqlen_kv, t.head_dim),
               HostTensor(t.dtype, t.layout, 1, t.heads_kv, t.seqlen_kv, t.head_dim_v)};
    for (std::int64_t h = 0; h < t.heads_q; ++h)
      for (std::int64_t i = 0; i < t.seqlen_q; ++i)
        for (std::int64_t c = 0; c < t.head_dim; ++c) cut.q.set(0, h, i, c, in.q.get(b, h, i, c));
    for (std::int64_t h = 0; h < t.heads_kv; ++h)
      for (std::int64_t j = 0; j < t.seqlen_kv; ++j) {
        for (std::int64_t c = 0; c < t.head_dim; ++c) cut.k.set(0, h, j, c, in.k.get(b, h, j, c));
        for (std::int64_t c = 0; c < t.head_dim_v; ++c) cut.v.set(0, h, j, c, in.v.get(b, h, j, c));
      }
    const CaseResult alone = run_case(subject, t, cut);
    AttentionRows expected(t, all_rows(t));
    for (std::int64_t h = 0; h < t.heads_q; ++h)
      for (std::int64_t i = 0; i < t.seqlen_q; ++i) {
        std::copy_n(padded_rows.o_row(b, h, i), t.head_dim_v, expected.o_row(0, h, i));
        expected.lse[expected.index(0, h, i)] = padded_rows.lse[padded_rows.index(b, h, i)];
      }
    assert_related("padded == trimmed", t, rows_of(t, alone.outputs), expected, padded_bound + bound_of(alone),
                   {&p, &t});
  }
}

bool has_lse_and_unmasked(const Capabilities& caps) { return caps.lse && caps.masks.contains(MaskKind::none); }

// The sub-problem of keys [first, first + count).
Problem key_slice(const Problem& p, std::int64_t count) {
  Problem s = p;
  s.seqlen_kv = count;
  return s;
}

Inputs slice_keys(const Problem& p, const Inputs& in, std::int64_t first, std::int64_t count) {
  Inputs out{in.q, HostTensor(p.dtype, p.layout, p.batch, p.heads_kv, count, p.head_dim),
             HostTensor(p.dtype, p.layout, p.batch, p.heads_kv, count, p.head_dim_v)};
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_kv; ++h)
      for (std::int64_t j = 0; j < count; ++j) {
        for (std::int64_t c = 0; c < p.head_dim; ++c) out.k.set(b, h, j, c, in.k.get(b, h, first + j, c));
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) out.v.set(b, h, j, c, in.v.get(b, h, first + j, c));
      }
  return out;
}

void lse_merge_of_key_halves(Subject& subject) {
  Problem p = unmasked(*gen_problem_in(subject.capabilities(), {.allow_special_values = false}));
  p.lens_q.clear();
  p.lens_kv.clear();
  const std::int64_t multiple = subject.capabilities().seqlen_kv_multiple;
  RC_PRE(p.seqlen_kv >= 2 * multiple);
  RC_PRE(!unsupported_reason(subject.capabilities(), p));
  const std::int64_t cut = multiple * *rc::gen::inRange<std::int64_t>(1, p.seqlen_kv / multiple);
  const Problem first = key_slice(p, cut), second = key_slice(p, p.seqlen_kv - cut);
  RC_PRE(!unsupported_reason(subject.capabilities(), first) && !unsupported_reason(subject.capabilities(), second));
  const Inputs in = generate_inputs(p);
  const CaseResult whole = run_case(subject, p, in);
  const CaseResult a = run_case(subject, first, slice_keys(p, in, 0, cut));
  const CaseResult b = run_case(subject, second, slice_keys(p, in, cut, p.seqlen_kv - cut));
  // Merge the halves through their LSE, in f64:
  //   L = log(e^La + e^Lb),  O = e^(La - L) Oa + e^(Lb - L) Ob.
  const AttentionRows ra = rows_of(first, a.outputs), rb = rows_of(second, b.outputs);
  AttentionRows merged(p, all_rows(p));
  for (std::int64_t bb = 0; bb < p.batch; ++bb)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        const double la = ra.lse[ra.index(bb, h, i)], lb = rb.lse[rb.index(bb, h, i)];
        const double top = std::max(la, lb);
        const double lse = top + std::log(std::exp(la - top) + std::exp(lb - top));
        merged.lse[merged.index(bb, h, i)] = lse;
        for (std::int64_t c = 0; c < p.head_dim_v; ++c)
          merged.o_row(bb, h, i)[c] = std::exp(la - lse) * ra.o_row(bb, h, i)[c] + std::exp(lb - lse) * rb.o_row(bb, h, i)[c];
      }
  // Tolerance: each half's O error enters with its weight (<= 1), and each
  // half's LSE error moves the weights: dO/dLa = wa wb (Oa - Ob), likewise for Lb.
  const CaseBound bw = bound_of(whole), ba = bound_of(a), bb = bound_of(b);
  double weight_sensitivity = 0;  // max over elements of wa wb |Oa - Ob|
  for (std::int64_t bb_ = 0; bb_ < p.batch; ++bb_)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        const double lse = merged.lse[merged.index(bb_, h, i)];
        const double wa = std::exp(ra.lse[ra.index(bb_, h, i)] - lse), wb = std::exp(rb.lse[rb.index(bb_, h, i)] - lse);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c)
          weight_sensitivity = std::max(
              weight_sensitivity, wa * wb * std::fabs(ra.o_row(bb_, h, i)[c] - rb.o_row(bb_, h, i)[c]));
      }
  assert_related("LSE merge of two key halves == whole", p, merged, rows_of(p, whole.outputs),
                 bw.o + ba.o + bb.o + weight_sensitivity * (ba.lse + bb.lse), bw.lse + ba.lse + bb.lse,
                 {&p, &first, &second});
}

bool has_both_causal(const Capabilities& caps) {
  return caps.masks.contains(MaskKind::causal_tl) && caps.masks.contains(MaskKind::causal_br);
}

void bottom_right_equals_offset_top_left(Subject& subject) {
  // The top-left problem has Lk queries: keep Lk moderate so it stays in budget.
  Problem br = *gen_problem_in(subject.capabilities(),
                               {.max_seqlen = std::min<std::int64_t>(160, subject.capabilities().max_seqlen_q)});
  br.mask = MaskKind::causal_br;
  br.window_left = br.window_right = -1;
  br.lens_q.clear();
  br.lens_kv.clear();
  RC_PRE(br.seqlen_q <= br.seqlen_kv && br.seqlen_q > 0);
  // Bottom-right causal with Lq <= Lk is top-left causal on Lk queries whose
  // last Lq rows are the original queries: row i of the first is row
  // i + (Lk - Lq) of the second.
  Problem tl = br;
  tl.mask = MaskKind::causal_tl;
  tl.seqlen_q = br.seqlen_kv;
  RC_PRE(!unsupported_reason(subject.capabilities(), br) && !unsupported_reason(subject.capabilities(), tl));
  const Inputs in = generate_inputs(br);
  Problem filler = tl;
  filler.data_seed ^= 0x5eed;
  Inputs extended = generate_inputs(filler);
  extended.k = in.k;
  extended.v = in.v;
  const std::int64_t offset = br.seqlen_kv - br.seqlen_q;
  for (std::int64_t b = 0; b < br.batch; ++b)
    for (std::int64_t h = 0; h < br.heads_q; ++h)
      for (std::int64_t i = 0; i < br.seqlen_q; ++i)
        for (std::int64_t c = 0; c < br.head_dim; ++c) extended.q.set(b, h, i + offset, c, in.q.get(b, h, i, c));
  const CaseResult bottom = run_case(subject, br, in), top = run_case(subject, tl, extended);
  const AttentionRows top_rows = rows_of(tl, top.outputs);
  AttentionRows expected(br, all_rows(br));
  for (std::int64_t b = 0; b < br.batch; ++b)
    for (std::int64_t h = 0; h < br.heads_q; ++h)
      for (std::int64_t i = 0; i < br.seqlen_q; ++i) {
        std::copy_n(top_rows.o_row(b, h, i + offset), br.head_dim_v, expected.o_row(b, h, i));
        expected.lse[expected.index(b, h, i)] = top_rows.lse[top_rows.index(b, h, i + offset)];
      }
  assert_related("causal_br == causal_tl on the offset problem", br, rows_of(br, bottom.outputs), expected,
                 bound_of(bottom) + bound_of(top), {&br, &tl});
}

bool has_split_kv(const Capabilities& caps) { return caps.split_kv; }

void split_counts_agree(Subject& subject) {
  const Problem p = *gen_problem_in(subject.capabilities());
  RC_CLASSIFY(p.seqlen_kv < 7, "fewer keys than splits");
  RC_CLASSIFY(p.mask != MaskKind::none, "masked");
  const Inputs in = generate_inputs(p);
  // Back to the heuristic however the property ends (RC_FAIL throws).
  struct Restore {
    Subject& subject;
    ~Restore() { subject.set_split_count(0); }
  } restore{subject};
  // Each split count must pass on its own (a split that writes a wrong slot, or
  // leaves one unwritten, fails here) and agree with every other.
  const std::vector<int> counts = {1, 2, 3, 7};
  std::vector<CaseResult> results;
  for (int splits : counts) {
    RC_ASSERT(subject.set_split_count(splits));
    CaseResult r = run_case(subject, p, in);
    if (!r.passed()) RC_FAIL(fmt::format("with {} splits:\n{}", splits, explain(r)));
    results.push_back(std::move(r));
  }
  for (std::size_t x = 0; x < results.size(); ++x)
    for (std::size_t y = x + 1; y < results.size(); ++y) {
      assert_related(fmt::format("{} splits == {} splits", counts[x], counts[y]), p, rows_of(p, results[x].outputs),
                     rows_of(p, results[y].outputs), bound_of(results[x]) + bound_of(results[y]), {&p});
    }
}

void unsupported_is_refused(Subject& subject) {
  const Problem p = *gen_problem_outside(subject.capabilities());
  const RunResult run = subject.run(p, generate_inputs(p));
  if (run.status != Status::unsupported)
    RC_FAIL(fmt::format("a problem outside the domain returned {} instead of unsupported\n  problem: '{}'",
                        to_string(run.status), to_line(p)));
  RC_ASSERT(!run.message.empty());
  RC_ASSERT(run.outputs.o.size() == 0);  // nothing was written
  RC_ASSERT(run.outputs.lse.empty());
}

void deterministic(Subject& subject) {
  const Problem p = *gen_problem_in(subject.capabilities());
  const Inputs in = generate_inputs(p);
  const RunResult first = run_subject(subject, p, in), second = run_subject(subject, p, in);
  if (!(first.outputs.o == second.outputs.o))
    RC_FAIL(fmt::format("two runs gave different O bits\n  problem: '{}'", to_line(p)));
  RC_ASSERT(first.outputs.lse.size() == second.outputs.lse.size());
  if (!first.outputs.lse.empty() &&
      std::memcmp(first.outputs.lse.data(), second.outputs.lse.data(), first.outputs.lse.size() * sizeof(float)) != 0)
    RC_FAIL(fmt::format("two runs gave different LSE bits\n  problem: '{}'", to_line(p)));
}

}  // namespace

const std::vector<SubjectProperty>& subject_properties() {
  static const std::vector<SubjectProperty> properties = {
      {"AgreesWithTheOracle", "within k x baseline + floor of cpu_f64, NaN/Inf positions equal, no vacuous pass",
       always, agrees_with_oracle},
      {"KeyValuePermutation", "permuting K and V rows together leaves O and LSE unchanged (unmasked)", has_unmasked,
       key_value_permutation},
      {"QueryPermutation", "permuting Q rows permutes O and LSE rows (unmasked)", has_unmasked, query_permutation},
      {"KeyShiftInvariance", "K -> K + 1 w^T leaves O unchanged and moves LSE by scale q.w", always,
       key_shift_invariance},
      {"ValueAffineMap", "V -> aV + b maps O to aO + b and leaves LSE unchanged", always, value_affine_map},
      {"ConvexHull", "each output lies in the hull of the values its row sees; fully masked rows are 0", always,
       convex_hull},
      {"CausalPrefix", "changing keys past a row's last visible key leaves the row's bits unchanged", has_causal,
       causal_prefix},
      {"BatchAndHeadIndependence", "changing one (batch, head group) leaves every other's bits unchanged", always,
       batch_and_head_independence},
      {"GqaEqualsRepeatedMha", "GQA/MQA equals MHA with K/V repeated per query head", has_gqa, gqa_equals_repeated_mha},
      {"PaddedEqualsTrimmed", "each sequence of a padded batch equals that sequence alone", has_varlen,
       padded_equals_trimmed},
      {"LseMergeOfKeyHalves", "two halves of the keys merged through LSE equal the whole", has_lse_and_unmasked,
       lse_merge_of_key_halves},
      {"BottomRightEqualsOffsetTopLeft", "causal_br equals causal_tl on the problem with Lk - Lq queries prepended",
       has_both_causal, bottom_right_equals_offset_top_left},
      {"SplitCountsAgree", "1, 2, 3 and 7 key splits each agree with the oracle and with each other", has_split_kv,
       split_counts_agree},
      {"UnsupportedIsRefused", "a problem just outside the domain returns unsupported and writes nothing", always,
       unsupported_is_refused},
      {"Deterministic", "the same call twice gives bitwise identical O and LSE", always, deterministic},
  };
  return properties;
}

}  // namespace flashcheck
