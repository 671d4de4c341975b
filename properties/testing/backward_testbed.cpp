#include "flashcheck/testing/backward_testbed.hpp"

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

// ---- drawing ----------------------------------------------------------------

rc::Gen<Problem> BackwardTestbed::problems(DomainLimits limits) const {
  limits.backward = true;
  limits.vacuous_only = false;
  limits.max_work = std::min(limits.max_work, kBackwardMaxWork);
  return gen_problem_in(capabilities(), limits);
}

Problem BackwardTestbed::draw(const rc::Gen<Problem>& problems, const std::function<bool(const Problem&)>& accept) const {
  const Problem p = forward_.draw(problems, accept);
  RC_PRE(p.pass == Pass::bwd);  // the guard, should a caller pass forward problems
  return p;
}

// ---- the base case --------------------------------------------------------------

void BackwardTestbed::initialize(const Problem& problem) {
  initialize(problem, generate_inputs(problem), generate_dout(problem));
}

void BackwardTestbed::initialize(const Problem& problem, const Inputs& inputs, const HostTensor& dout) {
  JudgeOptions options;
  options.keep_outputs = true;
  // Every query and key row: the derived references need them all.
  options.max_rows = std::max<std::int64_t>({problem.seqlen_q, problem.seqlen_kv, 1});
  inputs_ = inputs;
  dout_ = dout;
  base_ = judge_backward(subject(), problem, inputs_, dout_, options);
  if (base_.status == Status::unsupported) RC_DISCARD("refused at launch: " + base_.message);
  if (!base_.ran()) RC_FAIL("the subject's backward did not run:\n" + explain(base_));
  if (!base_.passed()) RC_FAIL("the base case:\n" + explain(base_));
  rows_ = gather_gradients(problem, base_.gradients, all_rows(problem), all_key_rows(problem));
}

GradientTolerance BackwardTestbed::bound() const {
  GradientTolerance t;
  for (const RuleCheck& check : base_.verdict.checks) {
    if (check.metric == "dq.max_abs") t.dq = check.bound;
    if (check.metric == "dk.max_abs") t.dk = check.bound;
    if (check.metric == "dv.max_abs") t.dv = check.bound;
  }
  return t;
}

// ---- running ---------------------------------------------------------------------

Outputs BackwardTestbed::handed(const Problem& problem, const Inputs& inputs) const {
  return backward_outputs(problem, ReferenceCache::instance().reference(problem, inputs, all_rows(problem)));
}

Gradients BackwardTestbed::call(const Problem& problem, const BackwardInputs& handed_inputs) const {
  BackwardResult run = subject().run_backward(problem, handed_inputs);
  if (run.status == Status::unsupported) RC_DISCARD("refused at launch: " + run.message);
  if (run.status != Status::ok)
    RC_FAIL(fmt::format("the subject's backward returned {}: {}\n  problem: '{}'", to_string(run.status), run.message,
                        to_line(problem)));
  return std::move(run.gradients);
}

Gradients BackwardTestbed::call(const Problem& problem, const Inputs& inputs, const HostTensor& dout) const {
  return call(problem, BackwardInputs{inputs, handed(problem, inputs), dout});
}

GradientRows BackwardTestbed::run(const Problem& problem, const Inputs& inputs, const HostTensor& dout) const {
  return gather_gradients(problem, call(problem, inputs, dout), all_rows(problem), all_key_rows(problem));
}

GradientRows BackwardTestbed::baseline(const Problem& problem, const Inputs& inputs, const HostTensor& dout) const {
  return cpu_lowp_gradients(problem, inputs, dout, all_rows(problem), all_key_rows(problem), base_.baseline_dtype);
}

GradientTolerance BackwardTestbed::baseline_bound(const Problem& frame, const GradientRows& baseline,
                                                  const GradientRows& want) const {
  const GradientMetrics metrics = compare_gradients(frame, baseline, want, frame.dtype);
  // The rule's bound with the baseline standing for both sides: k_g x err(baseline) + floor.
  const Verdict verdict = decide_gradients(metrics, metrics, frame.dtype, gradient_condition(frame));
  GradientTolerance t;
  for (const RuleCheck& check : verdict.checks) {
    if (check.metric == "dq.max_abs") t.dq = check.bound;
    if (check.metric == "dk.max_abs") t.dk = check.bound;
    if (check.metric == "dv.max_abs") t.dv = check.bound;
  }
  // A baseline NaN/Inf where the reference is finite (or the other way) has
  // no finite error to bound: the relation is then checked class by class.
  return t;
}

// ---- verifying -------------------------------------------------------------------

namespace {

int value_class(double x) { return std::isnan(x) ? 1 : std::isinf(x) ? (x > 0 ? 2 : 3) : 0; }

// One gradient's element check: NaN/Inf classes, then |got - want| <= tolerance.
struct GradientCheck {
  const char* name;
  bool key_rows;  // positions are (b, hk, key) rather than (b, h, row)
  double tolerance;
  std::int64_t count = 0, over = 0, mismatches = 0;
  std::string first, worst;
  double worst_error = -1;

  std::string at(std::int64_t b, std::int64_t h, std::int64_t r, std::int64_t c, double got, double want) const {
    return fmt::format("{}(b={}, {}={}, {}={}, col={}) got {:.9g} want {:.9g}", name, b, key_rows ? "hkv" : "h", h,
                       key_rows ? "key" : "row", r, c, got, want);
  }
  void add(std::int64_t b, std::int64_t h, std::int64_t r, std::int64_t c, double got, double want) {
    if (value_class(got) != value_class(want)) {
      if (mismatches++ == 0) first = at(b, h, r, c, got, want);
      return;
    }
    if (!std::isfinite(want)) return;
    ++count;
    const double error = std::fabs(got - want);
    if (error > worst_error) {
      worst_error = error;
      worst = at(b, h, r, c, got, want);
    }
    if (error > tolerance && over++ == 0 && mismatches == 0)
      first = at(b, h, r, c, got, want) + fmt::format(" (|err| {:.3e}, allowed {:.3e})", error, tolerance);
  }
  void assert_held(std::string_view relation, const std::string& problems) const {
    if (mismatches)
      RC_FAIL(fmt::format("{}: {} NaN/Inf position(s) of {} differ; first {}{}", relation, mismatches, name, first,
                          problems));
    if (over && tolerance < 0)
      RC_FAIL(fmt::format("{}: {} of {} elements of {} differ by more than their derived bounds; first {}; largest "
                          "difference {}{}",
                          relation, over, count, name, first, worst, problems));
    if (over)
      RC_FAIL(fmt::format("{}: {} of {} elements of {} differ by more than {:.3e}; first {}; worst {}{}", relation, over,
                          count, name, tolerance, first, worst, problems));
  }
};

}  // namespace

std::string BackwardTestbed::shown_lines(const std::vector<const Problem*>& shown) const {
  std::string lines;
  for (const Problem* q : shown) lines += fmt::format("\n  problem: '{}'", to_line(*q));
  if (!base_.subject.empty()) lines += fmt::format("\n  base replay: {}", base_.reproducer());
  return lines;
}

void BackwardTestbed::verify(std::string_view relation, const Problem& p, const GradientRows& got,
                             const GradientRows& want, const GradientTolerance& tolerance,
                             const std::vector<const Problem*>& shown) const {
  GradientCheck dq{"dQ", false, tolerance.dq}, dk{"dK", true, tolerance.dk}, dv{"dV", true, tolerance.dv};
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i)
        for (std::int64_t c = 0; c < p.head_dim; ++c) dq.add(b, h, i, c, got.dq_row(b, h, i)[c], want.dq_row(b, h, i)[c]);
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
        for (std::int64_t c = 0; c < p.head_dim; ++c)
          dk.add(b, hk, j, c, got.dk_row(b, hk, j)[c], want.dk_row(b, hk, j)[c]);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c)
          dv.add(b, hk, j, c, got.dv_row(b, hk, j)[c], want.dv_row(b, hk, j)[c]);
      }
  }
  const std::string problems = shown_lines(shown);
  for (const GradientCheck* check : {&dq, &dk, &dv}) check->assert_held(relation, problems);
}

void BackwardTestbed::verify(std::string_view relation, const Problem& p, const GradientRows& got,
                             const GradientRows& want, const GradientRows& tolerance,
                             const std::vector<const Problem*>& shown) const {
  GradientCheck dq{"dQ", false, 0}, dk{"dK", true, 0}, dv{"dV", true, 0};
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i)
        for (std::int64_t c = 0; c < p.head_dim; ++c) {
          dq.tolerance = tolerance.dq_row(b, h, i)[c];
          dq.add(b, h, i, c, got.dq_row(b, h, i)[c], want.dq_row(b, h, i)[c]);
        }
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
        for (std::int64_t c = 0; c < p.head_dim; ++c) {
          dk.tolerance = tolerance.dk_row(b, hk, j)[c];
          dk.add(b, hk, j, c, got.dk_row(b, hk, j)[c], want.dk_row(b, hk, j)[c]);
        }
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          dv.tolerance = tolerance.dv_row(b, hk, j)[c];
          dv.add(b, hk, j, c, got.dv_row(b, hk, j)[c], want.dv_row(b, hk, j)[c]);
        }
      }
  }
  const std::string problems = shown_lines(shown);
  for (GradientCheck* check : {&dq, &dk, &dv}) {
    check->tolerance = -1;  // per element: the message names the first and worst elements
    check->assert_held(relation, problems);
  }
}

namespace {

// The rows keep_q and keep_kv select (valid rows only), element by element:
// `same(x, y, tolerance)` or the relation fails. Returns how many dQ rows that
// see a key and dK/dV rows that some query sees were compared.
std::int64_t compare_rows(const BackwardTestbed& bed, std::string_view relation, const Problem& p,
                          const GradientRows& got, const GradientRows& want, const GradientRows* tolerance,
                          const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_q,
                          const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_kv) {
  // Bitwise without a tolerance (a NaN equals a NaN); within it otherwise,
  // NaN and Inf in the same places.
  const auto same = [bitwise = tolerance == nullptr](double x, double y, double allowed) {
    if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
    if (bitwise) return std::memcmp(&x, &y, sizeof(double)) == 0;
    if (std::isinf(x) || std::isinf(y)) return x == y;
    return std::fabs(x - y) <= allowed;
  };
  const auto check = [&](const char* name, std::int64_t b, std::int64_t h, std::int64_t r, std::int64_t c, double x,
                         double y, double allowed) {
    if (!same(x, y, allowed))
      RC_FAIL(fmt::format("{}: {}(b={}, h={}, row={}, col={}) changed: {:.9g} -> {:.9g}{}{}", relation, name, b, h, r,
                          c, x, y, tolerance ? fmt::format(" (allowed {:.3e})", allowed) : std::string(),
                          bed.shown_lines({&p})));
  };
  std::int64_t compared = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    std::vector<bool> key_seen(static_cast<std::size_t>(p.len_kv(b)), false);
    for (std::int64_t i = 0; i < p.len_q(b); ++i) {
      const VisibleKeys keys = visible_key_range(p, b, i);
      for (std::int64_t j = keys.first; j <= keys.last; ++j) key_seen[j] = true;
    }
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        if (!keep_q(b, h, i)) continue;
        compared += visible_key_range(p, b, i).count() > 0;
        const double* bound = tolerance ? tolerance->dq_row(b, h, i) : nullptr;
        for (std::int64_t c = 0; c < p.head_dim; ++c)
          check("dQ", b, h, i, c, want.dq_row(b, h, i)[c], got.dq_row(b, h, i)[c], bound ? bound[c] : 0.0);
      }
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
        if (!keep_kv(b, hk, j)) continue;
        compared += key_seen[j];
        const double* dk_bound = tolerance ? tolerance->dk_row(b, hk, j) : nullptr;
        const double* dv_bound = tolerance ? tolerance->dv_row(b, hk, j) : nullptr;
        for (std::int64_t c = 0; c < p.head_dim; ++c)
          check("dK", b, hk, j, c, want.dk_row(b, hk, j)[c], got.dk_row(b, hk, j)[c], dk_bound ? dk_bound[c] : 0.0);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c)
          check("dV", b, hk, j, c, want.dv_row(b, hk, j)[c], got.dv_row(b, hk, j)[c], dv_bound ? dv_bound[c] : 0.0);
      }
  }
  return compared;
}

}  // namespace

std::int64_t BackwardTestbed::verify_bitwise(
    std::string_view relation, const Problem& p, const GradientRows& got, const GradientRows& want,
    const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_q,
    const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_kv) const {
  return compare_rows(*this, relation, p, got, want, nullptr, keep_q, keep_kv);
}

std::int64_t BackwardTestbed::verify_rows_within(
    std::string_view relation, const Problem& p, const GradientRows& got, const GradientRows& want,
    const GradientRows& tolerance, const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_q,
    const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_kv) const {
  return compare_rows(*this, relation, p, got, want, &tolerance, keep_q, keep_kv);
}

// ---- gradient rows moved by a relation ------------------------------------------

GradientRows all_gradient_rows(const Problem& p) { return GradientRows(p, all_rows(p), all_key_rows(p)); }

GradientRows permute_key_rows(const GradientRows& rows, const RowOrder& order) {
  GradientRows out = rows;
  for (std::int64_t b = 0; b < rows.batch; ++b)
    for (std::int64_t hk = 0; hk < rows.heads_kv; ++hk)
      for (std::size_t s = 0; s < order[b][hk].size(); ++s) {
        const auto to = static_cast<std::int64_t>(s), from = order[b][hk][s];
        std::copy_n(rows.dk_row(b, hk, from), rows.dim, out.dk_row(b, hk, to));
        std::copy_n(rows.dv_row(b, hk, from), rows.dim_v, out.dv_row(b, hk, to));
      }
  return out;
}

GradientRows gradient_entry(const GradientRows& rows, std::int64_t b, const Problem& entry) {
  GradientRows out = all_gradient_rows(entry);
  for (std::int64_t h = 0; h < entry.heads_q; ++h)
    for (std::int64_t i = 0; i < entry.seqlen_q; ++i) std::copy_n(rows.dq_row(b, h, i), rows.dim, out.dq_row(0, h, i));
  for (std::int64_t hk = 0; hk < entry.heads_kv; ++hk)
    for (std::int64_t j = 0; j < entry.seqlen_kv; ++j) {
      std::copy_n(rows.dk_row(b, hk, j), rows.dim, out.dk_row(0, hk, j));
      std::copy_n(rows.dv_row(b, hk, j), rows.dim_v, out.dv_row(0, hk, j));
    }
  return out;
}

GradientRows sum_over_groups(const GradientRows& mha, const Problem& gqa) {
  GradientRows out = all_gradient_rows(gqa);
  out.dq = mha.dq;
  const std::int64_t group = gqa.group_size();
  for (std::int64_t b = 0; b < gqa.batch; ++b)
    for (std::int64_t h = 0; h < gqa.heads_q; ++h)
      for (std::int64_t j = 0; j < gqa.seqlen_kv; ++j) {
        for (std::int64_t c = 0; c < gqa.head_dim; ++c) out.dk_row(b, h / group, j)[c] += mha.dk_row(b, h, j)[c];
        for (std::int64_t c = 0; c < gqa.head_dim_v; ++c) out.dv_row(b, h / group, j)[c] += mha.dv_row(b, h, j)[c];
      }
  return out;
}

// ---- the column sums' identities -------------------------------------------------
//
// The identities (exact arithmetic; sums over the query rows i that see a
// key, over the query heads of the K/V head's group, and over the keys j each
// row sees; P_ij = exp(S_ij - LSE_i) sums to 1 over j):
//   Sum_j dV_j = Sum_j Sum_i P_ij dO_i = Sum_i dO_i.
//   Sum_j dK_j = scale Sum_i (Sum_j dS_ij) Q_i, and Sum_j dS_ij =
//   Sum_j P_ij dP_ij - D_i Sum_j P_ij = (dO_i . O_i) - D_i, which is 0 for the
//   exact O (shift invariance: adding one vector to every key moves a row's
//   logits by a constant). A subject is handed O rounded to the dtype, Oh, and
//   computes D~_i = dO_i . Oh_i, so its exact arithmetic gives
//   Sum_j dK_j = scale Sum_i (dO_i . (O_i - Oh_i)) Q_i, computed here in f64
//   from the oracle's O: the target, not 0.
//
// The bound on |computed - target|, per column c, from the roundings a
// subject may make (u = u(f32), u_w = u(working dtype), u_o = u(output dtype),
// g_n = n u / (1 - n u), every sum accumulated in f32 in any order, N the
// terms of one dK/dV element: the group's query rows):
//  - P_ij has relative error pi_ij = expm1(e_ij), where e_ij bounds the error
//    of its exponent: the logit's f32 dot product and scaling,
//    g_(d+2) a_ij + 2u (|S_ij| + |LSE_i|) with a_ij = scale Sum_c |Q_ic K_jc|,
//    plus lambda_i, the error of the row's normaliser, which is either the
//    handed LSE (|LSEh_i - LSE_i|) or the subject's own (the largest logit
//    error of the row plus g_(n_i+2) for its sum of n_i exponentials), both
//    counted; plus 4u for exp and a division, plus u_w for P rounded to the
//    working dtype before the products (as FlashAttention's kernels do).
//  - dV_jc = Sum_i P_ij dO_ic: |error| <= Sum_i P_ij |dO_ic| (pi_ij + (1 + pi_ij) g_(N+1)).
//  - dS_ij = P_ij (dP_ij - D~_i): dP_ij (dv products) carries g_dv Sum |dO V_j|
//    plus u_w |dP_ij|, D~_i carries g_dv Sum |dO Oh_i|; the subtraction, the
//    product and a rounding of dS to the working dtype delta = 3u + 2u_w; so
//    |dS^ - dS| <= P_ij ((pi + delta + pi delta) |x| + (1 + pi)(1 + delta) |e|)
//    with x = dP_ij - D~_i and e the two sums' errors.
//  - dK_jc = scale Sum_i dS_ij Q_ic: the accumulation adds g_(N+2) scale
//    Sum_i |dS^_ij| |Q_ic|.
//  - Underflow, the absolute part of each rounding (fl(x op y) = (x op y)(1 +
//    d) + eta): an f32 result below the normal range is off by less than its
//    smallest normal, eta = 2^-126 (flushed to zero, as a kernel built with
//    -ftz or ex2.approx.ftz does, or rounded to a subnormal), and a value
//    rounded to the working dtype by eta_w = max(eta, s_w / 2) (f16's
//    subnormals start at 2^-14). P_ij's floor eta_w reaches dS through
//    |x| + |e|, dS's own roundings add 3 eta + eta_w, and each product and
//    addition of the accumulations 2 eta: per term, dV_jc gains
//    eta_w |dO_ic| + 2 eta, and dK_jc (dQ_ic alike, with K) scale |Q_ic|
//    (eta_w ((|x| + |e|)(1 + delta) + 1) + 3 eta) + 2 eta. Without it, a dK
//    made of P_ij that f32's exp leaves subnormal (one query row, a softmax
//    scale of 11, 1023 keys: dK near 1e-41) was off by 46 subnormal spacings
//    between two correct subjects, and the bound allowed 5.
//  - Every element is rounded once to the output dtype: u_o |g^_jc| + s_o / 2
//    (s_o the dtype's smallest subnormal).
//  - The sums here, in f64, add 4 lk u(f64) Sum_j |g^_jc|, and the f64
//    oracle's O and LSE carry ~1e-16 relative, counted as 64 u(f64) of the
//    magnitudes. The bound is the sum of these over j.
// Wherever a subject's arithmetic is f32 (or the working dtype) with its sums
// in f32, these are worst cases, not typical errors: the property fails only
// on a subject whose sums do not add up to the identity.

namespace {

double gamma(double n, double u) { return n * u / (1 - n * u); }

// The underflow floors of the derivation above: eta for an f32 result, eta_w
// for one rounded to the working dtype.
struct Underflow {
  explicit Underflow(DType working, bool gradual = false)
      : eta(gradual ? min_subnormal(DType::f32) / 2 : min_normal(DType::f32)),
        eta_w(std::max(eta, min_subnormal(working) / 2)) {}
  double eta, eta_w;
  /// dS_ij's absolute floor, with |x| + |e| its factor dP - D and that's error and delta dS's relative rounding.
  double ds(double x_plus_e, double delta) const { return eta_w * (x_plus_e * (1 + delta) + 1) + 3 * eta; }
};

// One (batch, query head, query row): what the pair loops need.
struct RowTerms {
  // Per visible key (offset from keys.first): the logit (softcap and ALiBi
  // applied), its absolute condition (a softcap's three roundings of |s| and
  // ALiBi's three of |bias| added, divided by d + 2 so that gamma_{d+2} a
  // counts each once more), and the softcap's chain factor 1 - tanh^2 (1
  // without).
  std::vector<double> s, a, chain;
  double lse = 0, lse_handed = 0, d_handed = 0, d_exact = 0, d_abs = 0;
  // The scale of the f64 oracle's own error in D_i: sum_c |dO_c| sum_j P_j |V_jc|,
  // the magnitude of the terms its O sums (not |O|: where the terms cancel, O
  // is near 0 and its rounding is not; measured, an O that is 0 exactly in one
  // key order came out 1e-17 in another, moving a dK that is 0 to 3e-17).
  double d_oracle = 0;
};

// Calls visit(b, hk, h, i, keys, terms) for every (b, query head, query row)
// that sees a key.
template <typename Visit>
void for_each_row(const Problem& p, const Inputs& in, const HostTensor& dout, const AttentionRows& exact,
                  const Outputs& handed, Visit visit) {
  const double scale = p.softmax_scale;
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  std::vector<double> q(static_cast<std::size_t>(d)), k(static_cast<std::size_t>(d)), v;
  RowTerms t;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group_size();
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        const VisibleKeys keys = visible_key_range(p, b, i);
        if (keys.count() == 0) continue;
        t.lse = exact.lse[exact.index(b, h, i)];
        t.lse_handed = handed.lse[(b * p.heads_q + h) * p.seqlen_q + i];
        t.d_handed = t.d_exact = t.d_abs = 0;
        for (std::int64_t c = 0; c < dv; ++c) {
          const double g = dout.get(b, h, i, c), oh = handed.o.get(b, h, i, c);
          t.d_handed += g * oh;
          t.d_exact += g * exact.o_row(b, h, i)[c];
          t.d_abs += std::fabs(g * oh);
        }
        in.q.read_row(b, h, i, q.data());
        v.resize(static_cast<std::size_t>(dv));
        t.d_oracle = 0;
        t.s.assign(static_cast<std::size_t>(keys.count()), 0.0);
        t.a.assign(static_cast<std::size_t>(keys.count()), 0.0);
        t.chain.assign(static_cast<std::size_t>(keys.count()), 1.0);
        for (std::int64_t j = keys.first; j <= keys.last; ++j) {
          in.k.read_row(b, hk, j, k.data());
          double dot = 0, abs_dot = 0;
          for (std::int64_t c = 0; c < d; ++c) {
            dot += q[c] * k[c];
            abs_dot += std::fabs(q[c] * k[c]);
          }
          double logit = scale * dot, extra = 0;
          if (p.softcap > 0) {
            const double capped = std::tanh(logit / p.softcap);
            extra += 4 * std::fabs(logit);
            logit = p.softcap * capped;
            t.chain[j - keys.first] = 1 - capped * capped;
          }
          if (p.alibi) {
            const double bias = alibi_slope(p.heads_q, h) * std::fabs(static_cast<double>(i + p.len_kv(b) - p.len_q(b) - j));
            logit -= bias;
            extra += 3 * bias;
          }
          t.s[j - keys.first] = logit;
          t.a[j - keys.first] = scale * abs_dot + extra / static_cast<double>(d + 2);
          const double prob = std::exp(t.s[j - keys.first] - t.lse);
          in.v.read_row(b, hk, j, v.data());
          for (std::int64_t c = 0; c < dv; ++c) t.d_oracle += prob * std::fabs(dout.get(b, h, i, c) * v[c]);
        }
        visit(b, hk, h, i, keys, t);
      }
    }
}

}  // namespace

GradientSums gradient_sums(const Problem& p, const Inputs& in, const HostTensor& dout, const AttentionRows& exact,
                           const Outputs& handed, const Gradients& got, DType working) {
  constexpr double u64 = 0x1p-53;
  const double u = unit_roundoff(DType::f32), uw = unit_roundoff(working), uo = unit_roundoff(p.dtype);
  const double so = min_subnormal(p.dtype);
  const Underflow floors(working);
  const double scale = p.softmax_scale;
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  GradientSums sums;
  // Per (b, hk): targets and bounds per column, then the subject's sums.
  const auto at = [&](std::int64_t b, std::int64_t hk) { return static_cast<std::size_t>(b * p.heads_kv + hk); };
  std::vector<std::vector<double>> target_k(static_cast<std::size_t>(p.batch * p.heads_kv), std::vector<double>(d)),
      bound_k = target_k, target_v(static_cast<std::size_t>(p.batch * p.heads_kv), std::vector<double>(dv)),
      bound_v = target_v;
  std::vector<double> v(static_cast<std::size_t>(dv));
  for_each_row(p, in, dout, exact, handed, [&](std::int64_t b, std::int64_t hk, std::int64_t h, std::int64_t i,
                                               const VisibleKeys& keys, const RowTerms& t) {
    const double n_terms = static_cast<double>(p.group_size() * p.len_q(b));  // N: terms of one dK/dV element
    double logit_error_max = 0;
    for (std::size_t n = 0; n < t.s.size(); ++n)
      logit_error_max = std::max(logit_error_max, gamma(d + 2, u) * t.a[n] + 2 * u * (std::fabs(t.s[n]) + std::fabs(t.lse)));
    const double lambda = std::fabs(t.lse_handed - t.lse) + logit_error_max + gamma(keys.count() + 2, u) +
                          64 * u64 * (std::fabs(t.lse) + 1);
    const double delta = 3 * u + 2 * uw, sum_gamma = gamma(n_terms + 2, u);
    const double e_d = gamma(dv, u) * t.d_abs;
    std::vector<double>& tkc = target_k[at(b, hk)];
    std::vector<double>& bkc = bound_k[at(b, hk)];
    std::vector<double>& tvc = target_v[at(b, hk)];
    std::vector<double>& bvc = bound_v[at(b, hk)];
    // The target's terms, and the f64 oracle's own error in D (64 u64 of its magnitude).
    const double d_diff = t.d_exact - t.d_handed;
    for (std::int64_t c = 0; c < d; ++c) {
      const double qc = in.q.get(b, h, i, c);
      tkc[c] += scale * d_diff * qc;
      bkc[c] += scale * std::fabs(qc) * 64 * u64 * 2 * t.d_oracle;
    }
    for (std::int64_t c = 0; c < dv; ++c) tvc[c] += dout.get(b, h, i, c);
    for (std::int64_t j = keys.first; j <= keys.last; ++j) {
      const std::size_t n = static_cast<std::size_t>(j - keys.first);
      const double prob = std::exp(t.s[n] - t.lse);
      const double e = gamma(d + 2, u) * t.a[n] + 2 * u * (std::fabs(t.s[n]) + std::fabs(t.lse)) + lambda + 4 * u + uw;
      const double pi = std::expm1(e);
      in.v.read_row(b, hk, j, v.data());
      double dp = 0, dp_abs = 0;
      for (std::int64_t c = 0; c < dv; ++c) {
        const double g = dout.get(b, h, i, c);
        dp += g * v[c];
        dp_abs += std::fabs(g * v[c]);
        bvc[c] += prob * std::fabs(g) * (pi + (1 + pi) * gamma(n_terms + 1, u)) + floors.eta_w * std::fabs(g) +
                  2 * floors.eta;
      }
      const double x = std::fabs(dp - t.d_handed);
      const double err = gamma(dv, u) * dp_abs + uw * std::fabs(dp) + e_d;
      const double ds_error = prob * ((pi + delta + pi * delta) * x + (1 + pi) * (1 + delta) * err);
      const double ds_size = prob * (1 + pi) * (1 + delta) * (x + err);
      const double ds_floor = floors.ds(x + err, delta);
      for (std::int64_t c = 0; c < d; ++c) {
        const double qc = std::fabs(in.q.get(b, h, i, c));
        bkc[c] += scale * qc * (ds_error + sum_gamma * ds_size + ds_floor) + 2 * floors.eta;
      }
      sums.largest_p_error = std::max(sums.largest_p_error, pi);
    }
  });
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const std::int64_t lk = p.len_kv(b);
      for (std::int64_t c = 0; c < d; ++c) {
        double sum = 0, abs_sum = 0;
        for (std::int64_t j = 0; j < lk; ++j) {
          const double g = got.dk.get(b, hk, j, c);
          sum += g;
          abs_sum += std::fabs(g);
        }
        const double bound = bound_k[at(b, hk)][c] + uo * abs_sum + lk * so / 2 + 4 * lk * u64 * abs_sum;
        sums.dk.push_back({b, hk, c, sum, target_k[at(b, hk)][c], bound});
      }
      for (std::int64_t c = 0; c < dv; ++c) {
        double sum = 0, abs_sum = 0;
        for (std::int64_t j = 0; j < lk; ++j) {
          const double g = got.dv.get(b, hk, j, c);
          sum += g;
          abs_sum += std::fabs(g);
        }
        const double bound = bound_v[at(b, hk)][c] + uo * abs_sum + lk * so / 2 + 4 * lk * u64 * abs_sum;
        sums.dv.push_back({b, hk, c, sum, target_v[at(b, hk)][c], bound});
      }
    }
  return sums;
}

GradientRows gradient_error_bounds(const Problem& p, const Inputs& in, const HostTensor& dout,
                                   const AttentionRows& exact, const Outputs& handed, const Gradients& got,
                                   DType working, bool gradual_underflow) {
  constexpr double u64 = 0x1p-53;
  const double u = unit_roundoff(DType::f32), uw = unit_roundoff(working), uo = unit_roundoff(p.dtype);
  const double so = min_subnormal(p.dtype);
  const Underflow floors(working, gradual_underflow);
  const double scale = p.softmax_scale;
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  GradientRows bounds = all_gradient_rows(p);
  std::vector<double> v(static_cast<std::size_t>(dv)), k(static_cast<std::size_t>(d));
  for_each_row(p, in, dout, exact, handed, [&](std::int64_t b, std::int64_t hk, std::int64_t h, std::int64_t i,
                                               const VisibleKeys& keys, const RowTerms& t) {
    const double n_kv = static_cast<double>(p.group_size() * p.len_q(b));  // terms of one dK/dV element
    const double n_q = static_cast<double>(keys.count());                  // terms of one dQ element
    double logit_error_max = 0;
    for (std::size_t n = 0; n < t.s.size(); ++n)
      logit_error_max = std::max(logit_error_max, gamma(d + 2, u) * t.a[n] + 2 * u * (std::fabs(t.s[n]) + std::fabs(t.lse)));
    const double lambda = std::fabs(t.lse_handed - t.lse) + logit_error_max + gamma(keys.count() + 2, u) +
                          64 * u64 * (std::fabs(t.lse) + 1);
    const double delta = 3 * u + 2 * uw;
    // D~_i - D_i: the handed O's rounding (exact here), and the f64 oracle's own error.
    const double d_drift = std::fabs(t.d_exact - t.d_handed) + 64 * u64 * 2 * t.d_oracle;
    const double e_d = gamma(dv, u) * t.d_abs;
    double* dq = bounds.dq_row(b, h, i);
    for (std::int64_t j = keys.first; j <= keys.last; ++j) {
      const std::size_t n = static_cast<std::size_t>(j - keys.first);
      const double prob = std::exp(t.s[n] - t.lse);
      const double e = gamma(d + 2, u) * t.a[n] + 2 * u * (std::fabs(t.s[n]) + std::fabs(t.lse)) + lambda + 4 * u + uw;
      const double pi = std::expm1(e);
      in.v.read_row(b, hk, j, v.data());
      in.k.read_row(b, hk, j, k.data());
      double dp = 0, dp_abs = 0;
      double* dvb = bounds.dv_row(b, hk, j);
      for (std::int64_t c = 0; c < dv; ++c) {
        const double g = dout.get(b, h, i, c);
        dp += g * v[c];
        dp_abs += std::fabs(g * v[c]);
        dvb[c] += prob * std::fabs(g) * (pi + (1 + pi) * gamma(n_kv + 1, u)) + floors.eta_w * std::fabs(g) +
                  2 * floors.eta;
      }
      const double x = std::fabs(dp - t.d_handed);
      const double err = gamma(dv, u) * dp_abs + uw * std::fabs(dp) + e_d;
      // dS's error against the exact dS (with the exact D), and its size. A
      // softcap's chain factor g <= 1 scales both; its own error is three
      // roundings and the logit's error through tanh (|d g / d s| <= 1 / C).
      double ds_error = prob * ((pi + delta + pi * delta) * x + (1 + pi) * (1 + delta) * (err + d_drift));
      const double ds_size = prob * (1 + pi) * (1 + delta) * (x + err);
      if (p.softcap > 0)
        ds_error += ds_size * (3 * u + (gamma(d + 2, u) * t.a[n] + 2 * u * std::fabs(t.s[n])) / p.softcap);
      const double ds_floor = floors.ds(x + err, delta);
      double* dkb = bounds.dk_row(b, hk, j);
      for (std::int64_t c = 0; c < d; ++c) {
        dkb[c] += scale * std::fabs(in.q.get(b, h, i, c)) * (ds_error + gamma(n_kv + 2, u) * ds_size + ds_floor) +
                  2 * floors.eta;
        dq[c] += scale * std::fabs(k[c]) * (ds_error + gamma(n_q + 2, u) * ds_size + ds_floor) + 2 * floors.eta;
      }
    }
  });
  // Each element's rounding to the output dtype.
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i)
        for (std::int64_t c = 0; c < d; ++c) bounds.dq_row(b, h, i)[c] += uo * std::fabs(got.dq.get(b, h, i, c)) + so / 2;
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
        for (std::int64_t c = 0; c < d; ++c) bounds.dk_row(b, hk, j)[c] += uo * std::fabs(got.dk.get(b, hk, j, c)) + so / 2;
        for (std::int64_t c = 0; c < dv; ++c) bounds.dv_row(b, hk, j)[c] += uo * std::fabs(got.dv.get(b, hk, j, c)) + so / 2;
      }
  }
  return bounds;
}

double smallest_backward_term(const Problem& p, const Inputs& in, const HostTensor& dout, const AttentionRows& exact,
                              const Outputs& handed) {
  double smallest = std::numeric_limits<double>::infinity();
  const auto keep = [&](double x) {
    if (x != 0) smallest = std::min(smallest, std::fabs(x));
  };
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  std::vector<double> v(static_cast<std::size_t>(dv)), k(static_cast<std::size_t>(d));
  for_each_row(p, in, dout, exact, handed, [&](std::int64_t b, std::int64_t hk, std::int64_t h, std::int64_t i,
                                               const VisibleKeys& keys, const RowTerms& t) {
    for (std::int64_t c = 0; c < dv; ++c) keep(dout.get(b, h, i, c) * handed.o.get(b, h, i, c));
    for (std::int64_t j = keys.first; j <= keys.last; ++j) {
      const double prob = std::exp(t.s[j - keys.first] - t.lse);
      in.v.read_row(b, hk, j, v.data());
      in.k.read_row(b, hk, j, k.data());
      double dp = 0;
      for (std::int64_t c = 0; c < dv; ++c) {
        const double g = dout.get(b, h, i, c);
        keep(g * v[c]);
        keep(prob * g);
        dp += g * v[c];
      }
      const double unchained = prob * (dp - t.d_handed);
      keep(unchained);
      keep(t.chain[j - keys.first]);
      const double ds = unchained * t.chain[j - keys.first] * p.softmax_scale;
      keep(prob);
      for (std::int64_t c = 0; c < d; ++c) {
        keep(ds * in.q.get(b, h, i, c));
        keep(ds * k[c]);
      }
    }
  });
  return smallest;
}

}  // namespace flashcheck::testing
