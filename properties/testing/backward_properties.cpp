// The backward pass's properties (issue 22 item 4), for every subject whose
// Capabilities::backward is true: each the relation it states, on the
// BackwardTestbed (backward_testbed.hpp), with its bound derived beside it.
// RapidCheck's public API only, as subject_properties.cpp.
#include <fmt/format.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "flashcheck/core/values.hpp"
#include "flashcheck/testing/backward_testbed.hpp"
#include "flashcheck/testing/property_suite.hpp"
#include "flashcheck/testing/reference_cache.hpp"
#include "problem_moves.hpp"

namespace flashcheck::testing {
namespace {

bool has_backward(const Capabilities& caps) { return caps.backward; }
bool backward_unmasked(const Capabilities& caps) { return caps.backward && caps.masks.contains(MaskKind::none); }
bool backward_gqa(const Capabilities& caps) { return caps.backward && caps.gqa; }
bool backward_varlen(const Capabilities& caps) { return caps.backward && caps.varlen; }
bool backward_causal(const Capabilities& caps) {
  return caps.backward && (caps.masks.contains(MaskKind::causal_tl) || caps.masks.contains(MaskKind::causal_br) ||
                           caps.masks.contains(MaskKind::window));
}

DType working_dtype(const Capabilities& caps, const Problem& p) { return caps.compute_dtype.value_or(p.dtype); }

// x + y_factor y, element by element (two runs' bounds, one of them scaled).
GradientRows plus(GradientRows x, const GradientRows& y, double y_factor = 1) {
  for (auto [to, from] : {std::pair{&x.dq, &y.dq}, {&x.dk, &y.dk}, {&x.dv, &y.dv}})
    for (std::size_t n = 0; n < to->size(); ++n) (*to)[n] += y_factor * (*from)[n];
  return x;
}

// The f64 forward of (p, inputs) on every row, and what a subject is handed from it.
struct Forward {
  AttentionRows exact;
  Outputs handed;
};
Forward forward_of(const Problem& p, const Inputs& inputs) {
  Forward f;
  f.exact = ReferenceCache::instance().reference(p, inputs, all_rows(p));
  f.handed = backward_outputs(p, f.exact);
  return f;
}

// Problems whose gradients stay finite in the dtype, for the identities:
// no NaN/Inf inputs, and no near_overflow values, whose gradients (sums of
// up to every query row's terms of |V| near the dtype's maximum) overflow
// f16 by design, where the identity has no finite value to check.
// `softcap` and `alibi`: the score modifications the identity holds under
// (DomainLimits::softcap, ::alibi).
rc::Gen<Problem> finite_gradient_problems(const BackwardTestbed& bed, bool softcap, bool alibi) {
  return rc::gen::suchThat(bed.problems({.allow_special_values = false, .softcap = softcap, .alibi = alibi}),
                           [](const Problem& q) { return q.values.family != ValueFamily::near_overflow; });
}

std::string p_error_class(double p_error) {
  return p_error < 1e-5 ? "p_error=<1e-5" : p_error < 1e-2 ? "p_error=<1e-2" : "p_error=>=1e-2";
}

// ---- the properties ---------------------------------------------------------

// End to end: the backward judge on random pass=bwd problems of the domain
// (every query and key row): dQ, dK and dV within k_g x baseline + floor of
// the f64 gradient oracle, NaN/Inf positions equal. NaN/Inf inputs are drawn
// where the domain takes them. No vacuous pass: where the oracle's gradients
// are not all zero, neither are the subject's.
void backward_agrees_with_oracle(Subject& subject) {
  BackwardTestbed bed(subject);
  const Problem p = bed.draw(bed.problems({.softcap = true, .alibi = true}));
  RC_TAG("values=" + std::string(to_string(p.values.family)));
  RC_TAG("dout=" + std::string(to_string(p.dout.family)));
  bed.initialize(p);
  const GradientMetrics& reference = bed.base().subject_gradients;
  for (const TensorMetrics* g : {&reference.dq, &reference.dk, &reference.dv})
    RC_ASSERT(g->errors.count + g->census.want_nan + g->census.want_pos_inf + g->census.want_neg_inf > 0);
  const auto nonzero = [](const HostTensor& t) {
    for (std::int64_t n = 0; n < t.size(); ++n)
      if (t.load(n) != 0) return true;
    return false;
  };
  // Where the rule could tell all zeros from the reference: its largest
  // element is over the max check's bound (an ill-conditioned case, whose
  // bound is larger than the gradient, and a gradient below the dtype's
  // normal range may be 0, correctly) and a normal number of the dtype.
  const double smallest_normal = p.dtype == DType::f16 ? 0x1p-14 : 0x1p-126;
  const auto distinguishable = [&](const char* check, const TensorMetrics& g) {
    for (const RuleCheck& c : bed.base().verdict.checks)
      if (c.metric == check) return g.errors.ref_max_abs > c.bound && g.errors.ref_max_abs >= smallest_normal;
    return false;
  };
  if (distinguishable("dv.max_abs", reference.dv)) RC_ASSERT(nonzero(bed.gradients().dv));
  if (distinguishable("dq.max_abs", reference.dq)) RC_ASSERT(nonzero(bed.gradients().dq));
}

// Sum_j dK_j = scale Sum_i (dO_i . (O_i - Oh_i)) Q_i per (batch, K/V head),
// which is 0 for the exact O (shift invariance of the softmax: Sum_j dS_ij =
// 0); the derivation and the bound are at gradient_sums (backward_testbed.cpp).
// The subject alone runs (no gradient oracle): the identity is checked on its
// own arithmetic.
void backward_key_sum(Subject& subject) {
  BackwardTestbed bed(subject);
  const Problem p = bed.draw(finite_gradient_problems(bed, /*softcap=*/false, /*alibi=*/true));
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const Forward f = forward_of(p, in);
  const Gradients got = bed.call(p, BackwardInputs{in, f.handed, dout});
  const GradientSums sums = gradient_sums(p, in, dout, f.exact, f.handed, got, working_dtype(bed.capabilities(), p));
  RC_TAG(p_error_class(sums.largest_p_error));
  for (const ColumnSum& s : sums.dk)
    if (!(std::fabs(s.got - s.want) <= s.bound))
      RC_FAIL(fmt::format("Sum_j dK_j: (b={}, hkv={}, col={}) sums to {:.9g}, the identity gives {:.9g}: off by "
                          "{:.3e}, over the derived bound {:.3e}\n  problem: '{}'\n  replay: {}",
                          s.b, s.hk, s.column, s.got, s.want, std::fabs(s.got - s.want), s.bound, to_line(p),
                          replay_command(subject.name(), p)));
}

// Sum_j dV_j = Sum_i dO_i over the rows that see a key (rows of P sum to 1),
// per (batch, K/V head) over the group's query heads; bound at gradient_sums.
void backward_value_sum(Subject& subject) {
  BackwardTestbed bed(subject);
  const Problem p = bed.draw(finite_gradient_problems(bed, true, true));
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const Forward f = forward_of(p, in);
  const Gradients got = bed.call(p, BackwardInputs{in, f.handed, dout});
  const GradientSums sums = gradient_sums(p, in, dout, f.exact, f.handed, got, working_dtype(bed.capabilities(), p));
  RC_TAG(p_error_class(sums.largest_p_error));
  for (const ColumnSum& s : sums.dv)
    if (!(std::fabs(s.got - s.want) <= s.bound))
      RC_FAIL(fmt::format("Sum_j dV_j = Sum_i dO_i: (b={}, hkv={}, col={}) sums to {:.9g}, dO to {:.9g}: off by "
                          "{:.3e}, over the derived bound {:.3e}\n  problem: '{}'\n  replay: {}",
                          s.b, s.hk, s.column, s.got, s.want, std::fabs(s.got - s.want), s.bound, to_line(p),
                          replay_command(subject.name(), p)));
}

// The gradients are linear in dO (P does not depend on it): dO -> 2^k dO
// scales dQ, dK and dV by 2^k, and dO = 0 gives zeros.
// Exactly, bitwise: every IEEE operation is scale-exact for a power of two,
// fl(2^k x) = 2^k fl(x), wherever neither x nor 2^k x is subnormal or past
// the format's range; P and the other operand of every product do not depend
// on dO, so every value of the chain scales exactly (the CPU subjects and the
// mutants compute so; a kernel that quantises dO with a scale of its own
// would not, and fails here). Where that holds (every non-zero term a
// backward sums is at least 2^26 times the dtype's smallest normal (2^-100
// for f32 and bf16, whose intermediates a kernel may hold in either; f16
// intermediates almost never qualify), so that no intermediate can come near
// its subnormals even after its own roundings, and
// after the scaling), an element whose two values are normal in the dtype is
// compared bitwise; one in the dtype's subnormal range (or at its smallest
// normal, which a subnormal rounds up to) was rounded on the subnormal grid
// s_o: within (1 + 2^k) s_o / 2. Where some term is smaller,
// each f32 operation on the subnormal grid may err by s_f32 / 2 on either
// side, at most (N (d + dv + 8)) such operations per element (N: its terms),
// amplified by at most M^2 (M the largest of 1, scale |Q|, scale |K|, |V|,
// |dO|): tau = 2 (1 + 2^k) N (d + dv + 8) s_f32 M^2, and the dtype's rounding
// then moves the element by at most one unit in the last place: within
// tau + ulp(2^k g) + (1 + 2^k) s_o / 2. Elements whose scaled value leaves
// the dtype's range are not compared (counted in the tag).
void backward_linear_in_dout(Subject& subject) {
  BackwardTestbed bed(subject);
  const Problem p = bed.draw(finite_gradient_problems(bed, true, true));
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const Forward f = forward_of(p, in);
  int power = *rc::gen::element(1, -1, 2, 3);
  // dO itself must scale exactly in its dtype: halving an f16 dO of 1e-4
  // lands in f16's subnormals and rounds. Where it would, the case doubles.
  const auto exactly_scaled = [&](double times) {
    for (std::int64_t n = 0; n < dout.size(); ++n)
      if (std::isfinite(dout.load(n)) && round_to(p.dtype, times * dout.load(n)) != times * dout.load(n)) return false;
    return true;
  };
  if (!exactly_scaled(std::ldexp(1.0, power))) power = 1;
  RC_PRE(exactly_scaled(std::ldexp(1.0, power)));  // only an overflow of 2 dO could fail here
  RC_TAG(fmt::format("factor=2^{}", power));
  const double factor = std::ldexp(1.0, power);
  const HostTensor scaled = map_elements(dout, [factor](double x) { return factor * x; });
  const RowSet q_rows = all_rows(p), kv_rows = all_key_rows(p);
  const Gradients base_call = bed.call(p, BackwardInputs{in, f.handed, dout});
  const Gradients got_call = bed.call(p, BackwardInputs{in, f.handed, scaled});
  const GradientRows base = gather_gradients(p, base_call, q_rows, kv_rows);
  const GradientRows got = gather_gradients(p, got_call, q_rows, kv_rows);
  // A subject whose backward is not declared deterministic (dQ added by
  // atomics) sums in another order each call, so its two runs need not scale
  // bitwise: each is within its derived bound of the exact gradients
  // (gradient_error_bounds), which scale exactly, so got - 2^k base is within
  // bound(got) + 2^k bound(base), added to every element's allowance below.
  std::optional<GradientRows> order_bound;
  if (!bed.capabilities().backward_deterministic) {
    const DType working = working_dtype(bed.capabilities(), p);
    order_bound = plus(gradient_error_bounds(p, in, scaled, f.exact, f.handed, got_call, working),
                       gradient_error_bounds(p, in, dout, f.exact, f.handed, base_call, working), factor);
    RC_TAG("linearity=within the runs' bounds (not deterministic)");
  }
  // A kernel may store its intermediates (P, dS) in the problem's dtype for
  // its tensor-core products (cuDNN does: its f16 dQ halved with dO was off by
  // 7e-4 relative on an H200, issue 22): the subnormal grid and range that
  // matter are the dtype's where it is narrower than f32's (f16; bf16's grid).
  const DType work = p.dtype;
  const double smallest = smallest_backward_term(p, in, dout, f.exact, f.handed) * std::min(1.0, factor);
  const bool exact = smallest >= std::ldexp(min_normal(work), 26);
  if (!order_bound) RC_TAG(exact ? "linearity=bitwise" : "linearity=one ulp");
  double largest = 1;
  const auto grow = [&](const HostTensor& t, double times) {
    for (std::int64_t n = 0; n < t.size(); ++n)
      if (std::isfinite(t.load(n))) largest = std::max(largest, times * std::fabs(t.load(n)));
  };
  grow(in.q, p.softmax_scale);
  grow(in.k, p.softmax_scale);
  grow(in.v, 1);
  grow(dout, 1);
  const double terms = static_cast<double>(std::max(p.seqlen_kv, p.seqlen_q * p.group_size()));
  const double tau = 2 * (1 + factor) * terms * static_cast<double>(p.head_dim + p.head_dim_v + 8) *
                     min_subnormal(work) * largest * largest;
  const double so = min_subnormal(p.dtype), top = max_finite(p.dtype);
  std::int64_t out_of_range = 0;
  const auto check = [&](const char* name, std::int64_t b, std::int64_t h, std::int64_t r, std::int64_t c, double base_g,
                         double got_g, const double* order_row) {
    const double want = factor * base_g;
    if (!std::isfinite(base_g) || std::fabs(want) >= top) {
      ++out_of_range;
      return;
    }
    // Strictly above the smallest normal: a value rounded up to it may have
    // been subnormal before its rounding.
    const bool normal = std::fabs(base_g) > min_normal(p.dtype) && std::fabs(want) > min_normal(p.dtype);
    const double tolerance = (exact ? (normal ? 0.0 : (1 + factor) * so / 2)
                                    : tau + ulp_at(p.dtype, want) + (1 + factor) * so / 2) +
                             (order_row ? order_row[c] : 0.0);
    if (!(std::fabs(got_g - want) <= tolerance))
      RC_FAIL(fmt::format("dO -> {} dO: {}(b={}, h={}, row={}, col={}) is {:.9g}, {} x the base's {:.9g} is {:.9g} "
                          "(allowed {:.3e}: {})\n  problem: '{}'\n  replay: {}",
                          factor, name, b, h, r, c, got_g, factor, base_g, want, tolerance,
                          exact ? "bitwise where normal" : "some term is within 2^26 of the dtype's subnormals", to_line(p),
                          replay_command(subject.name(), p)));
  };
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i)
        for (std::int64_t c = 0; c < p.head_dim; ++c)
          check("dQ", b, h, i, c, base.dq_row(b, h, i)[c], got.dq_row(b, h, i)[c],
                order_bound ? order_bound->dq_row(b, h, i) : nullptr);
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
        for (std::int64_t c = 0; c < p.head_dim; ++c)
          check("dK", b, hk, j, c, base.dk_row(b, hk, j)[c], got.dk_row(b, hk, j)[c],
                order_bound ? order_bound->dk_row(b, hk, j) : nullptr);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c)
          check("dV", b, hk, j, c, base.dv_row(b, hk, j)[c], got.dv_row(b, hk, j)[c],
                order_bound ? order_bound->dv_row(b, hk, j) : nullptr);
      }
  }
  RC_TAG(out_of_range ? "scaled_out_of_range=some" : "scaled_out_of_range=none");
  // dO = 0: dV = P^T 0, dP = 0, D = 0, dS = P (0 - 0): every gradient is 0 exactly.
  const HostTensor zero = map_elements(dout, [](double) { return 0.0; });
  const Gradients zeros = bed.call(p, BackwardInputs{in, f.handed, zero});
  for (const auto& [name, t] : {std::pair<const char*, const HostTensor*>{"dQ", &zeros.dq}, {"dK", &zeros.dk}, {"dV", &zeros.dv}})
    for (std::int64_t n = 0; n < t->size(); ++n)
      if (t->load(n) != 0)
        RC_FAIL(fmt::format("dO = 0: {} element {} (storage order) is {:.9g}, not 0\n  problem: '{}'", name, n,
                            t->load(n), to_line(p)));
}

// One run of the subject on (p, inputs, dout), handed the f64 forward, with
// the per-element bound of its gradients (gradient_error_bounds).
struct BoundedRun {
  GradientRows gradients, bounds;
};
BoundedRun bounded_run(const BackwardTestbed& bed, const Problem& p, const Inputs& in, const HostTensor& dout) {
  const Forward f = forward_of(p, in);
  const Gradients got = bed.call(p, BackwardInputs{in, f.handed, dout});
  return {gather_gradients(p, got, all_rows(p), all_key_rows(p)),
          gradient_error_bounds(p, in, dout, f.exact, f.handed, got, working_dtype(bed.capabilities(), p))};
}

// A subject that declares it may flush subnormals (cuDNN) is not held to them.
bool backward_keeping_subnormals(const Capabilities& caps) {
  return caps.backward && !caps.may_flush_subnormals &&
         (caps.dtypes.contains(DType::bf16) || caps.dtypes.contains(DType::f32));
}

// A weight P below f32's smallest normal keeps its value. One key dominates
// every row by a logit gap just past exp's f32 underflow point (87.34): every
// other key's P lies between 2^-126 and 2^-129, a subnormal, and its dK and dV
// consist of those P alone. A backward that flushes them to 0 (ex2.approx.ftz:
// a 10-minute GPU sweep found it in the mma.sync and Hopper backward kernels,
// 2026-11-28) returns those gradients as 0, or far off. bf16 or f32 (whose
// outputs hold the subnormals; f16's do not), unmasked and unpadded where
// the domain allows, one query row a head: more rows put rounding errors the
// size of the dominant key's dV into the max checks, where a 1e-38 one hides.
void backward_subnormal_weights(Subject& subject) {
  BackwardTestbed bed(subject);
  const Capabilities& caps = bed.capabilities();
  std::vector<DType> dtypes;
  for (DType t : {DType::bf16, DType::f32})
    if (caps.dtypes.contains(t)) dtypes.push_back(t);
  const DType dtype = *rc::gen::elementOf(dtypes);
  // P = 2^-126.2, 2^-127 and 2^-128 (87.34 is 2^-126), the rows' noise around them.
  const double gap = *rc::gen::element(87.5, 88.0, 88.7);
  // By value: RapidCheck maps again when it shows a shrunk case, after this returns.
  const bool unmask = caps.masks.contains(MaskKind::none);
  const std::int64_t rows = caps.seqlen_q_multiple, keys = std::max<std::int64_t>(2, caps.seqlen_kv_multiple);
  const Problem p = bed.draw(rc::gen::map(bed.problems({.allow_special_values = false}), [=](Problem q) {
    q = unpadded(q);
    if (unmask) q = unmasked(q);
    q.dtype = dtype;
    q.seqlen_q = rows;
    q.seqlen_kv = std::max(q.seqlen_kv, keys);  // a key beside the dominant one
    q.values = ValueDist{ValueFamily::dominant, {gap}};
    q.softmax_scale = default_softmax_scale(q.head_dim);  // where dominant places its logits
    // dO without exact zeros: sparse_int's can zero a lone row's dO, and with
    // it every gradient this property is about.
    if (q.dout.family == ValueFamily::sparse_int) q.dout = ValueDist{ValueFamily::normal, {0.0, 1.0}};
    return q;
  }));
  bed.initialize(p);  // every row within k_g x baseline + floor of the f64 oracle
  // No vacuous pass: the oracle has gradients made of subnormal weights
  // (nonzero, below 2^-100) to compare.
  const auto tiny = [](const std::vector<double>& g) {
    return std::count_if(g.begin(), g.end(), [](double x) { return x != 0 && std::fabs(x) < 0x1p-100; });
  };
  RC_ASSERT(tiny(bed.reference().dv) + tiny(bed.reference().dk) > 0);
  // The rule's max checks take one floor for a whole gradient, set by its
  // largest terms: the dominant key's (P = 1, logits near 700) put it near
  // 1e-3, where a flushed 1e-38 hides, unless the judge samples the key rows
  // and leaves the dominant one out (how the GPU sweep saw it). Each element
  // is therefore also held to its own derived bound (gradient_error_bounds:
  // the roundings a subject may make in that element's sums), with f32's
  // gradual underflow: the relations' bounds let an intermediate flush.
  // The base case's own gradients, the run the rule judged (no second call).
  const Forward f = forward_of(p, bed.inputs());
  const GradientRows bounds = gradient_error_bounds(p, bed.inputs(), bed.dout(), f.exact, f.handed, bed.gradients(),
                                                    working_dtype(caps, p), /*gradual_underflow=*/true);
  bed.verify("subnormal weights, element by element", p, bed.rows(), bed.reference(), bounds, {&p});
}

// The rows a change of the inputs must leave alone, from a run on `before`
// and one on `after`: bitwise where the subject declares its backward
// deterministic (each row's sums then run in the same order on the same
// values); otherwise (dQ added by atomics, in another order each call) within
// the two runs' derived bounds (gradient_error_bounds, below), and tagged so.
struct BackwardCase {
  const Inputs& inputs;
  const HostTensor& dout;
};
std::int64_t unchanged_rows(const BackwardTestbed& bed, std::string_view relation, const Problem& p,
                            const BackwardCase& before, const BackwardCase& after,
                            const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_q,
                            const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_kv) {
  if (bed.capabilities().backward_deterministic) {
    RC_TAG("unchanged=bitwise");
    return bed.verify_bitwise(relation, p, bed.run(p, after.inputs, after.dout), bed.run(p, before.inputs, before.dout),
                              keep_q, keep_kv);
  }
  RC_TAG("unchanged=within the runs' bounds (not deterministic)");
  const BoundedRun was = bounded_run(bed, p, before.inputs, before.dout), is = bounded_run(bed, p, after.inputs, after.dout);
  return bed.verify_rows_within(relation, p, is.gradients, was.gradients, plus(is.bounds, was.bounds), keep_q, keep_kv);
}

// The relations between two runs below hold exactly for the exact gradients;
// each run is within its derived bound of its exact gradients
// (gradient_error_bounds, from the roundings a subject may make, no tolerance
// rule and no gradient oracle), so the two runs agree within the sum of their
// bounds, moved by the relation.

// Query head h of a group reads K/V head h / group: MHA with each K/V head
// repeated once per query head gives the same dQ, and its per-head dK and dV
// summed over the group are GQA's (the backward of repeating K and V).
void backward_gqa_equals_summed_mha(Subject& subject) {
  BackwardTestbed bed(subject);
  // The filter outlives this body while RapidCheck shrinks: it holds the domain, not the bed.
  const Problem gqa = bed.draw(grouped(finite_gradient_problems(bed, true, true), kBackwardMaxWork),
                               [caps = bed.capabilities()](const Problem& q) {
                                 return q.heads_kv < q.heads_q && !unsupported_reason(caps, repeated_mha(q));
                               });
  const Problem mha = repeated_mha(gqa);
  const Inputs in = generate_inputs(gqa);
  const HostTensor dout = generate_dout(gqa);
  const Inputs repeated{in.q, repeat(in.k, Axis::heads, gqa.group_size()), repeat(in.v, Axis::heads, gqa.group_size())};
  const BoundedRun grouped_run = bounded_run(bed, gqa, in, dout), mha_run = bounded_run(bed, mha, repeated, dout);
  bed.verify("GQA == MHA with repeated K/V, dK/dV summed over the group", gqa,
             sum_over_groups(mha_run.gradients, gqa), grouped_run.gradients,
             plus(grouped_run.bounds, sum_over_groups(mha_run.bounds, gqa)), {&gqa, &mha});
}

// Permuting each sequence's keys and values together permutes dK and dV the
// same way (each key's gradient is its own sum over the query rows) and leaves
// dQ unchanged (a sum over the keys, in another order). Unmasked problems.
void backward_key_value_permutation(Subject& subject) {
  BackwardTestbed bed(subject);
  const Problem p = bed.draw(rc::gen::map(finite_gradient_problems(bed, /*softcap=*/true, /*alibi=*/false), unmasked));
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const RowOrder order = draw_row_order(lengths_kv(p), p.heads_kv);
  const Inputs moved{in.q, permute_rows(in.k, order), permute_rows(in.v, order)};
  const BoundedRun base = bounded_run(bed, p, in, dout), permuted = bounded_run(bed, p, moved, dout);
  bed.verify("K/V row permutation", p, permuted.gradients, permute_key_rows(base.gradients, order),
             plus(permuted.bounds, permute_key_rows(base.bounds, order)), {&p});
}

// Each sequence of a padded batch alone (its Q, K, V and dO trimmed to its
// lengths) has the gradients of that sequence in the batch.
void backward_padded_equals_trimmed(Subject& subject) {
  BackwardTestbed bed(subject);
  const Problem p = bed.draw(padded(finite_gradient_problems(bed, true, true)), [caps = bed.capabilities()](const Problem& q) {
    for (std::int64_t b = 0; b < q.batch; ++b)
      if (const Problem t = trimmed(q, b); !unsupported_reason(caps, t) && visible_rows(t) > 0) return true;
    return false;
  });
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const BoundedRun batch = bounded_run(bed, p, in, dout);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Problem t = trimmed(p, b);
    if (!bed.sufficient(t)) continue;
    const auto alone = [&](const HostTensor& x, std::int64_t length) {
      return trim(slice(x, Axis::batch, b, 1), Axis::seq, length);
    };
    const Inputs entry{alone(in.q, t.seqlen_q), alone(in.k, t.seqlen_kv), alone(in.v, t.seqlen_kv)};
    const BoundedRun single = bounded_run(bed, t, entry, alone(dout, t.seqlen_q));
    bed.verify("padded == trimmed", t, single.gradients, gradient_entry(batch.gradients, b, t),
               plus(single.bounds, gradient_entry(batch.bounds, b, t)), {&p, &t});
  }
}

// Causal prefix: dQ_i = scale Sum_j dS_ij K_j over the keys row i sees, with
// dS_ij from P_ij (that row's logits), dP_ij (dO_i . V_j) and D_i (dO_i . O_i,
// O_i again over the keys it sees): nothing of a key past the row's last
// visible key enters it, and neither does it enter the O and LSE the row is
// handed. Change every key and value from `cut` on: such rows' dQ must not
// change by a single bit.
void backward_causal_prefix(Subject& subject) {
  BackwardTestbed bed(subject);
  const Problem p = bed.draw(bed.problems({.allow_special_values = false, .softcap = true, .alibi = true}), [](const Problem& q) {
    return q.mask != MaskKind::none && earliest_unseen_key(q) < q.seqlen_kv;
  });
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const std::int64_t cut = *rc::gen::inRange<std::int64_t>(earliest_unseen_key(p), p.seqlen_kv);
  // The changed values stay finite (one the map would overflow is negated).
  const auto past_cut = [&](double a, double b) {
    return [&p, cut, a, b](const Element& e, double x) {
      return e.s < cut ? x : std::isfinite(round_to(p.dtype, a * x + b)) ? a * x + b : -x;
    };
  };
  const Inputs changed{in.q, map_elements(in.k, past_cut(-3, 1)), map_elements(in.v, past_cut(7, -2))};
  const auto keep_q = [&](std::int64_t b, std::int64_t, std::int64_t i) {
    const VisibleKeys range = visible_key_range(p, b, i);
    return range.count() == 0 || range.last < cut;
  };
  const auto no_kv = [](std::int64_t, std::int64_t, std::int64_t) { return false; };
  const std::int64_t compared = unchanged_rows(bed, "dQ of rows whose keys end before the changed ones", p,
                                               {in, dout}, {changed, dout}, keep_q, no_kv);
  RC_TAG(compared > 0 ? "bitwise_rows=some" : "bitwise_rows=none");
  RC_ASSERT(compared > 0);  // by the choice of cut
}

// Change one (batch, K/V head)'s K, V and its group's Q and dO: every other
// (batch, query head)'s dQ and every other (batch, K/V head)'s dK and dV must
// not change by a single bit (nor do the O and LSE they are handed).
void backward_batch_and_head_independence(Subject& subject) {
  BackwardTestbed bed(subject);
  const Problem p = bed.draw(bed.problems({.allow_special_values = false, .softcap = true}),
                             [](const Problem& q) { return q.batch * q.heads_kv >= 2; });
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const auto [target_b, target_hk] = *rc::gen::elementOf(independence_targets(p));
  const auto in_target = [&](const Element& e, std::int64_t group) { return e.b == target_b && e.h / group == target_hk; };
  const Inputs changed{
      map_elements(in.q, [&](const Element& e, double x) { return in_target(e, p.group_size()) ? 0.5 * x + 1 : x; }),
      map_elements(in.k, [&](const Element& e, double x) { return in_target(e, 1) ? 2 * x - 1 : x; }),
      map_elements(in.v, [&](const Element& e, double x) { return in_target(e, 1) ? -x + 3 : x; })};
  const HostTensor changed_dout =
      map_elements(dout, [&](const Element& e, double x) { return in_target(e, p.group_size()) ? -2 * x + 0.5 : x; });
  const std::int64_t compared = unchanged_rows(
      bed, "another (batch, head)'s inputs", p, {in, dout}, {changed, changed_dout},
      [&](std::int64_t b, std::int64_t h, std::int64_t) { return b != target_b || h / p.group_size() != target_hk; },
      [&](std::int64_t b, std::int64_t hk, std::int64_t) { return b != target_b || hk != target_hk; });
  RC_TAG(compared > 0 ? "bitwise_rows=some" : "bitwise_rows=none");
  RC_ASSERT(compared > 0);  // by the choice of target
}

// Determinism. A subject that declares its backward deterministic
// (Capabilities::backward_deterministic: an ordered dQ reduction, no atomics)
// gives the same bits, padding and NaN payloads included, over kReruns calls
// on the same inputs. Any other is judged once (the base case passes the
// rule) and each rerun must pass the rule's max bound on its own against the
// base's reference: their spread stays inside the tolerance (tagged).
constexpr int kReruns = 4;

/// The drawn problem stretched over kManyKeyTiles of the domain's key tiles
/// (one sequence, at most 64 query rows and 4 query heads, no padding): a dQ
/// row reduced over key tiles in a varying order (atomics, TMA reductions)
/// can only change its bits once three or more shares meet (two f32 additions
/// onto 0 commute), which the drawn sizes seldom give at a tile of 128 keys.
/// nullopt when the stretched problem leaves the domain or sees no key.
constexpr std::int64_t kManyKeyTiles = 8;
std::optional<Problem> many_key_tiles(const Capabilities& caps, Problem p) {
  p.batch = 1;
  p.lens_q.clear();
  p.lens_kv.clear();
  const std::int64_t group = p.heads_q / p.heads_kv;
  p.heads_kv = std::min<std::int64_t>(p.heads_kv, std::max<std::int64_t>(1, 4 / group));
  p.heads_q = p.heads_kv * group;
  p.seqlen_kv = std::max<std::int64_t>(p.seqlen_kv, kManyKeyTiles * std::max<std::int64_t>(1, caps.tile_kv) + 1);
  p.seqlen_q = std::clamp<std::int64_t>(p.seqlen_q, 1, 64);
  if (unsupported_reason(caps, p) || visible_rows(p) == 0) return std::nullopt;
  return p;
}

void backward_deterministic(Subject& subject) {
  BackwardTestbed bed(subject);
  const Problem p = bed.draw(bed.problems({.softcap = true, .alibi = true}));
  if (bed.capabilities().backward_deterministic) {
    auto bitwise = [&](const Problem& q) {
      const Inputs in = generate_inputs(q);
      const BackwardInputs handed{in, bed.handed(q, in), generate_dout(q)};
      const Gradients first = bed.call(q, handed);
      for (int rerun = 1; rerun < kReruns; ++rerun) {
        const Gradients again = bed.call(q, handed);
        for (const auto& [name, x, y] : {std::tuple<const char*, const HostTensor*, const HostTensor*>{"dQ", &first.dq, &again.dq},
                                         {"dK", &first.dk, &again.dk}, {"dV", &first.dv, &again.dv}})
          if (!(*x == *y))
            RC_FAIL(fmt::format("declared deterministic, but call {} gave other {} bits than call 1\n  problem: '{}'\n  "
                                "replay: {}",
                                rerun + 1, name, to_line(q), replay_command(subject.name(), q)));
      }
    };
    bitwise(p);
    const std::optional<Problem> stretched = many_key_tiles(bed.capabilities(), p);
    if (stretched) bitwise(*stretched);
    RC_TAG(stretched ? "determinism=bitwise, also over many key tiles" : "determinism=bitwise");
    return;
  }
  bed.initialize(p);
  double spread = 0;
  for (int rerun = 1; rerun < kReruns; ++rerun) {
    const GradientRows again = bed.run(p, bed.inputs(), bed.dout());
    bed.verify(fmt::format("rerun {} against the reference", rerun + 1), p, again, bed.reference(), bed.bound(), {&p});
    for (std::size_t n = 0; n < again.dq.size(); ++n) spread = std::max(spread, std::fabs(again.dq[n] - bed.rows().dq[n]));
  }
  RC_TAG(spread == 0 ? "determinism=spread 0" : "determinism=spread > 0");
}

}  // namespace

const std::vector<SubjectProperty>& backward_properties() {
  static const std::vector<SubjectProperty> properties = {
      {"BackwardAgreesWithTheOracle",
       "pass=bwd: dQ, dK, dV within k_g x baseline + floor of the f64 gradient oracle, NaN/Inf positions equal",
       has_backward, backward_agrees_with_oracle, 1.0, /*end_to_end=*/true},
      {"BackwardKeyGradientsSumToTheShift", "Sum_j dK_j = scale Sum_i (dO_i . (O_i - Oh_i)) Q_i (0 for the exact O)",
       has_backward, backward_key_sum},
      {"BackwardValueGradientsSumToDout", "Sum_j dV_j = Sum_i dO_i over the rows that see a key", has_backward,
       backward_value_sum},
      {"BackwardLinearInDout", "dO -> 2^k dO scales dQ, dK, dV by 2^k (bitwise where no term nears the dtype's subnormals, "
                               "for a deterministic backward); dO = 0 gives 0",
       has_backward, backward_linear_in_dout},
      {"BackwardGqaEqualsSummedMha", "GQA's gradients equal MHA's with repeated K/V, dK/dV summed over the group",
       backward_gqa, backward_gqa_equals_summed_mha},
      {"BackwardKeyValuePermutation", "permuting K and V rows permutes dK and dV and leaves dQ (unmasked)",
       backward_unmasked, backward_key_value_permutation},
      {"BackwardCausalPrefix", "changing keys past a row's last visible key leaves its dQ bits unchanged (a backward not "
       "declared deterministic: within the two runs' bounds)",
       backward_causal, backward_causal_prefix},
      {"BackwardBatchAndHeadIndependence", "changing one (batch, head group) leaves every other's gradient bits (a backward not declared "
       "deterministic: within the two runs' bounds)",
       has_backward, backward_batch_and_head_independence},
      {"BackwardPaddedEqualsTrimmed", "each sequence of a padded batch has the gradients of that sequence alone",
       backward_varlen, backward_padded_equals_trimmed},
      {"BackwardSubnormalWeights",
       "one dominant key, the others' P subnormal in f32 (2^-126 to 2^-129): their dK and dV kept, each element within "
       "its derived bound (not for a subject that may flush subnormals)",
       backward_keeping_subnormals, backward_subnormal_weights, 1.0, /*end_to_end=*/true},
      {"BackwardDeterministic",
       "declared deterministic: bitwise over 4 calls; otherwise every rerun within the rule's bound",
       has_backward, backward_deterministic},
  };
  return properties;
}

}  // namespace flashcheck::testing
