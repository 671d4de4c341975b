// The serving vocabulary's properties (issue 25): a softcap far past every
// logit is none, ALiBi is an explicit additive bias, and a paged K/V cache
// read through any page table gives the contiguous problem's answer. Each on
// the Testbed, as subject_properties.cpp's; appended to the forward's suite.
#include <fmt/format.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "flashcheck/core/values.hpp"
#include "flashcheck/testing/property_suite.hpp"
#include "flashcheck/testing/testbed.hpp"
#include "problem_moves.hpp"

namespace flashcheck::testing {
namespace {

bool has_softcap(const Capabilities& caps) { return caps.softcap; }

// softcap=C far past every logit: C tanh(s / C) = s (1 - (s / C)^2 / 3 + ...).
// With C >= 1e4 (1 + max |s|), |s| <= scale d max|q| max|k|, the relative
// change is below 4e-9, under one f32 rounding: the capped call equals the
// uncapped case's reference within the uncapped case's bound.
void softcap_to_infinity_is_none(Subject& subject) {
  Testbed bed(subject);
  const Problem p = bed.draw(bed.problems({.allow_special_values = false}));
  bed.initialize(p);
  const double logit_max = p.softmax_scale * static_cast<double>(p.head_dim) * max_abs_finite(bed.inputs().q) *
                           max_abs_finite(bed.inputs().k);
  Problem capped = p;
  capped.softcap = std::exp2(std::ceil(std::log2(1e4 * (1 + logit_max))));  // a power of two: printed exactly
  RC_TAG(logit_max < 10 ? "logits=<10" : logit_max < 1000 ? "logits=<1000" : "logits=>=1000");
  bed.verify("softcap -> infinity == no softcap", capped, bed.run(capped, bed.inputs()), bed.reference(), bed.bound(),
             {&p, &capped});
}

// The problem of an explicit ALiBi bias (alibi_equals_explicit_bias): a
// (d+1)-th column, no alibi.
Problem explicit_bias_problem(const Problem& p) {
  Problem e = p;
  e.alibi = false;
  e.head_dim = p.head_dim + 1;
  return e;
}

bool has_alibi_in_f32_mha_causal(const Capabilities& caps) {
  return caps.alibi && caps.dtypes.contains(DType::f32) && caps.masks.contains(MaskKind::causal_br);
}

// ALiBi equals an explicit additive bias. On causal_br rows every visible key
// has j <= i' = i + (Lk - Lq), where -slope_h |i' - j| = slope_h j - slope_h i':
// the row's constant -slope_h i' leaves P alone and moves LSE by itself, and
// slope_h j is a (d+1)-th column, q_d = 1 and k_d = slope_h j / scale (MHA: one
// slope per K head; f32: k_d rounds the bias once, which the floor's logit
// term holds). The subject on that problem, LSE moved by -slope_h i', equals
// the ALiBi case's reference within its bound.
void alibi_equals_explicit_bias(Subject& subject) {
  Testbed bed(subject);
  const auto as_case = [](const Problem& drawn) {
    Problem q = retyped(drawn, DType::f32);
    q.heads_kv = q.heads_q;
    q.mask = MaskKind::causal_br;
    q.window_left = q.window_right = -1;
    q.alibi = true;
    return q;
  };
  const Problem p = bed.draw(rc::gen::map(bed.problems({.allow_special_values = false}), as_case),
                             [caps = bed.capabilities()](const Problem& q) {
                               return !unsupported_reason(caps, q) && !unsupported_reason(caps, explicit_bias_problem(q));
                             });
  const Problem e = explicit_bias_problem(p);
  bed.initialize(p);
  const Inputs& in = bed.inputs();
  const HostTensor ones = map_elements(slice(in.q, Axis::dim, 0, 1), [](double) { return 1.0; });
  const HostTensor bias_column = map_elements(slice(in.k, Axis::dim, 0, 1), [&](const Element& at, double) {
    return alibi_slope(p.heads_q, at.h) * static_cast<double>(at.s) / p.softmax_scale;
  });
  const Inputs explicit_inputs{concat(in.q, ones, Axis::dim), concat(in.k, bias_column, Axis::dim), in.v};
  AttentionRows got = bed.run(e, explicit_inputs);
  double largest_lse = 0;  // of the explicit problem, whose logits reach slope_h i' (its LSE's f32 rounding)
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < got.rows.size(); ++r) {
        const std::int64_t i = got.rows.rows[r];
        if (i >= p.len_q(b)) continue;
        const double constant = alibi_slope(p.heads_q, h) * static_cast<double>(i + p.len_kv(b) - p.len_q(b));
        double& lse = got.lse[got.index(b, h, r)];
        if (std::isfinite(lse)) largest_lse = std::max(largest_lse, std::fabs(lse));
        lse -= constant;
      }
  // The explicit problem's logits are the case's plus slope_h j, up to
  // slope_h Lk = X: each rounds about X u more (k_d, the dot product's last
  // sum, the subtraction of the maximum), so each weight moves by 6 X u
  // relative at most and O by 6 X u sum_j P_j |V_j - O| <= 12 X u max|V|; its
  // LSE is the case's plus slope_h i', and its f32 roundings reach 4 u |LSE|.
  double reach = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      reach = std::max(reach, alibi_slope(p.heads_q, h) * static_cast<double>(p.len_kv(b)));
  const double u = unit_roundoff(DType::f32);
  const Tolerance rounding{12 * reach * u * max_abs_finite(in.v), 4 * u * largest_lse};
  bed.verify("ALiBi == an explicit bias column", p, got, bed.reference(), bed.bound() + rounding, {&p, &e});
}

bool has_paged_kv(const Capabilities& caps) { return caps.min_page_size > 0; }

// Page-table invariance. A paged subject reads key j of sequence b through the
// table, so where the pages lie in the pool is not its business: the same
// logical K and V under another table (shuffled anew, no page shared) give the
// same bits of O and LSE, and the contiguous problem (where the domain takes
// it) the same values within the rule. The drawn case is judged first (its
// table shuffled, with spare pages holding NaN and shared prefix pages).
void page_table_invariance(Subject& subject) {
  Testbed bed(subject);
  const Problem p = bed.draw(bed.problems({.softcap = true, .alibi = true, .paged = true}),
                             [](const Problem& q) { return q.page_size > 0; });
  bed.initialize(p);
  const Inputs logical = logical_inputs(p, bed.inputs());
  const PageTable other = shuffled_page_table(p, *rc::gen::arbitrary<std::uint64_t>());
  RC_TAG(other == bed.inputs().pages ? "tables=same" : "tables=differ");
  const Outputs drawn = bed.call(p, bed.inputs()), moved = bed.call(p, paged_inputs(p, logical, other));
  const auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  if (!(drawn.o == moved.o) || !same_bits(drawn.lse, moved.lse))
    RC_FAIL(fmt::format("the same keys under another page table gave other {} bits\n  problem: '{}'\n  replay: {}",
                        drawn.o == moved.o ? "LSE" : "O", to_line(p), replay_command(subject.name(), p)));
  Problem contiguous = p;
  contiguous.page_size = 0;
  if (unsupported_reason(bed.capabilities(), contiguous)) return;
  bed.verify("paged == contiguous", contiguous, bed.run(contiguous, logical), bed.reference(), bed.bound(),
             {&p, &contiguous});
}

}  // namespace

const std::vector<SubjectProperty>& serving_properties() {
  static const std::vector<SubjectProperty> properties = {
      {"SoftcapToInfinityIsNone", "softcap=C with C far past every logit equals no softcap", has_softcap,
       softcap_to_infinity_is_none},
      {"AlibiEqualsAnExplicitBias", "ALiBi on causal rows equals the bias slope_h j as a (d+1)-th column of Q K^T",
       has_alibi_in_f32_mha_causal, alibi_equals_explicit_bias},
      {"PageTableInvariance", "the same K/V under another page table gives the same bits, and contiguous the same values",
       has_paged_kv, page_table_invariance},
  };
  return properties;
}

}  // namespace flashcheck::testing
