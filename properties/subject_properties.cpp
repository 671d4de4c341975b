#include "properties/subject_properties.hpp"

#include <fmt/format.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/TestListener.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/generators/generators.hpp"
#include "properties/testbed.hpp"

namespace flashcheck {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// ---- drawing cases that test something ----------------------------------------

// A length's class relative to the domain's tile.
std::string length_class(std::int64_t length, std::int64_t tile) {
  if (length <= 1) return std::to_string(length);
  if (tile > 1 && length == tile) return "tile";
  if (tile > 1 && length < tile) return "<tile";
  if (length <= 4 * std::max<std::int64_t>(tile, 1)) return "<=4tile";
  return ">4tile";
}

// Coverage labels, one per dimension ("dtype=bf16", "mask=window", ...).
// Local stand-in for generators.hpp's coverage_labels(), which the generator
// work adds in parallel; replace it with that one once merged.
std::vector<std::string> dimension_labels(const Problem& p, const Capabilities& caps) {
  const std::int64_t group = p.group_size();
  return {fmt::format("dtype={}", to_string(p.dtype)), fmt::format("mask={}", to_string(p.mask)),
          fmt::format("d={}", p.head_dim),
          p.heads_kv == 1 && p.heads_q > 1 ? std::string("gqa=mqa") : fmt::format("gqa={}", group),
          fmt::format("len_q={}", length_class(p.seqlen_q, caps.tile_q)),
          fmt::format("len_kv={}", length_class(p.seqlen_kv, caps.tile_kv)),
          fmt::format("padded={}", p.padded() ? "yes" : "no")};
}

// Tags the case per dimension (check_property tallies each dimension apart,
// instead of RapidCheck's cross product of every tag).
void classify(const Problem& p, const Capabilities& caps) {
  for (const std::string& label : dimension_labels(p, caps)) RC_TAG(label);
}

// Every drawn case compares at least one row that sees a key: the draws are
// filtered in the generator (suchThat), so that they count toward the budget
// only when they test something, together with a property's own condition
// on the geometry and the domain. DomainLimits::vacuous_only = false asks the
// generator for the first part itself; the RC_PRE is the guard.
Problem draw(const rc::Gen<Problem>& problems, const Capabilities& caps,
             const std::function<bool(const Problem&)>& accept = {}) {
  const Problem p = *rc::gen::suchThat(problems, [caps, accept](const Problem& q) {
    return visible_rows(q) > 0 && !unsupported_reason(caps, q) && (!accept || accept(q));
  });
  RC_PRE(visible_rows(p) > 0);
  classify(p, caps);
  RC_TAG(visible_rows(p) > 0 ? "compared_rows=some" : "compared_rows=none");
  return p;
}

rc::Gen<Problem> in_domain(const Capabilities& caps, DomainLimits limits = {}) {
  limits.vacuous_only = false;
  return gen_problem_in(caps, limits);
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

std::vector<std::int64_t> lengths_q(const Problem& p) {
  std::vector<std::int64_t> lengths;
  for (std::int64_t b = 0; b < p.batch; ++b) lengths.push_back(p.len_q(b));
  return lengths;
}

std::vector<std::int64_t> lengths_kv(const Problem& p) {
  std::vector<std::int64_t> lengths;
  for (std::int64_t b = 0; b < p.batch; ++b) lengths.push_back(p.len_kv(b));
  return lengths;
}

// Runs a subject without judging it (the properties that compare bits).
RunResult run_subject(Subject& subject, const Problem& p, const Inputs& in) {
  RunResult run = subject.run(p, in);
  if (run.status == Status::unsupported) RC_DISCARD("refused at launch: " + run.message);
  if (run.status != Status::ok)
    RC_FAIL(fmt::format("the subject returned {}: {}\n  problem: '{}'", to_string(run.status), run.message, to_line(p)));
  return run;
}

double tensor_norm(const HostTensor& t) {
  double sum = 0;
  for (std::int64_t i = 0; i < t.size(); ++i) {
    const double x = t.load(i);
    if (std::isfinite(x)) sum += x * x;
  }
  return std::sqrt(sum);
}

// Norm over the finite valid (unpadded) positions of a [batch, heads, seq,
// dim] tensor, whether there are any, and whether one is NaN or infinite (not
// zero either: a one-element K of nan_inf values may hold only an Inf).
struct ValidNorm {
  double norm = 0;
  bool any = false;
  bool nonfinite = false;
  bool nonzero() const { return norm > 0 || nonfinite; }
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
          else result.nonfinite = true;
        }
  result.norm = std::sqrt(sum);
  return result;
}

// Bitwise equality of every element of the rows that `keep` selects; returns
// how many of them see a key (a comparison of fully masked rows alone would
// test nothing).
std::int64_t assert_bitwise(std::string_view relation, const Problem& p, const Outputs& a, const Outputs& b,
                            const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep) {
  std::int64_t compared = 0;
  for (std::int64_t batch = 0; batch < p.batch; ++batch)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(batch); ++i) {
        if (!keep(batch, h, i)) continue;
        compared += visible_key_range(p, batch, i).count() > 0;
        const float lse_a = a.lse[(batch * p.heads_q + h) * p.seqlen_q + i];
        const float lse_b = b.lse[(batch * p.heads_q + h) * p.seqlen_q + i];
        if (a.has_lse && std::memcmp(&lse_a, &lse_b, sizeof(float)) != 0)
          RC_FAIL(fmt::format("{}: LSE of (b={}, h={}, row={}) changed: {:.9g} -> {:.9g}\n  problem: '{}'", relation, batch,
                              h, i, lse_a, lse_b, to_line(p)));
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double x = a.o.get(batch, h, i, c), y = b.o.get(batch, h, i, c);
          if (std::memcmp(&x, &y, sizeof(double)) != 0 && !(std::isnan(x) && std::isnan(y)))
            RC_FAIL(fmt::format("{}: O(b={}, h={}, row={}, col={}) changed: {:.9g} -> {:.9g}\n  problem: '{}'", relation,
                                batch, h, i, c, x, y, to_line(p)));
        }
      }
  return compared;
}

// ---- the properties ---------------------------------------------------------

bool always(const Capabilities&) { return true; }
bool has_unmasked(const Capabilities& caps) { return caps.masks.contains(MaskKind::none); }

void agrees_with_oracle(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const Problem p = draw(in_domain(caps), caps);
  RC_TAG("values=" + std::string(to_string(p.values.family)));
  Testbed bed(subject);
  bed.initialize(p, generate_inputs(p));  // within k x baseline + floor of the f64 oracle
  // No vacuous pass: inputs that the problem says are non-zero are, and so is
  // the output wherever some row sees a key.
  if (p.values.family == ValueFamily::sparse_int) return;
  const Inputs& in = bed.inputs();
  const auto queries = [&](std::int64_t b) { return p.len_q(b); };
  const auto keys = [&](std::int64_t b) { return p.len_kv(b); };
  for (const ValidNorm& norm : {valid_norm(in.q, queries), valid_norm(in.k, keys), valid_norm(in.v, keys)})
    if (norm.any) RC_ASSERT(norm.nonzero());
  // A row that sees a key and whose reference is finite has a non-zero output.
  const AttentionRows& reference = bed.reference();
  bool some_finite_row = false;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        const double* o = reference.o_row(b, h, i);
        some_finite_row = some_finite_row || (std::isfinite(reference.lse[reference.index(b, h, i)]) &&
                                              std::all_of(o, o + p.head_dim_v, [](double x) { return std::isfinite(x); }));
      }
  if (some_finite_row && p.values.family != ValueFamily::subnormal) {
    RC_ASSERT(bed.base().subject_metrics.o.errors.ref_rms > 0);
    RC_ASSERT(tensor_norm(bed.base().outputs.o) > 0);
  }
}

void key_value_permutation(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const Problem p = draw(rc::gen::map(in_domain(caps, {.allow_special_values = false}), unmasked), caps);
  Testbed bed(subject);
  bed.initialize(p, generate_inputs(p));
  // Permuting each sequence's keys and values together permutes the terms of
  // every row's sums: O and LSE are the base's.
  const RowOrder order = draw_row_order(lengths_kv(p), p.heads_kv);
  const Inputs moved{bed.inputs().q, permute_rows(bed.inputs().k, order), permute_rows(bed.inputs().v, order)};
  // The two outputs' relation, within the sum of their bounds: the base's, and
  // the baseline's on the permuted inputs (a same-precision sum in another
  // order has another rounding error; measured on an H100: fa2-rowthread, f32,
  // dominant keys, 1023 keys, 1.0005 x the base bound from the exact value).
  // The logit conditioning does not depend on the order: the base's.
  bed.verify("K/V row permutation", p, bed.run(p, moved), bed.outputs(),
             bed.bound() + bed.baseline_bound(p, moved, bed.reference(), bed.reference()), {&p});
}

void query_permutation(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const Problem p = draw(rc::gen::map(in_domain(caps, {.allow_special_values = false}), unmasked), caps);
  Testbed bed(subject);
  bed.initialize(p, generate_inputs(p));
  // Permuting the query rows permutes the output rows the same way.
  const RowOrder order = draw_row_order(lengths_q(p), p.heads_q);
  const Inputs moved{permute_rows(bed.inputs().q, order), bed.inputs().k, bed.inputs().v};
  bed.verify("Q row permutation", p, bed.run(p, moved), permute_rows(bed.reference(), order), bed.bound(), {&p});
}

void key_shift_invariance(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const Problem p = draw(rc::gen::map(in_domain(caps), with_small_integers), caps);
  Testbed bed(subject);
  bed.initialize(p, generate_inputs(p));
  const Inputs& in = bed.inputs();
  // K -> K + 1 w^T moves row i's logits by scale * q_i . w, which softmax
  // ignores; LSE moves by exactly that. |k| <= 3 and |w| <= 250 keep K + w an
  // integer below 256, exact in bf16; shifts reach ~1e3 logits and beyond.
  const double magnitude = *rc::gen::element(1.0, 8.0, 64.0, 250.0);
  std::vector<double> w(static_cast<std::size_t>(p.head_dim));
  for (auto& x : w) x = std::round(magnitude * *rc::gen::inRange(-100, 101) / 100.0);
  HostTensor shifted_k = in.k;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_kv; ++h)
      for (std::int64_t j = 0; j < p.seqlen_kv; ++j)
        for (std::int64_t c = 0; c < p.head_dim; ++c) shifted_k.set(b, h, j, c, in.k.get(b, h, j, c) + w[c]);
  const Inputs shifted{in.q, shifted_k, in.v};
  // The shifted case's reference: the base's, LSE moved. Its logits'
  // conditioning grows: a_j = scale sum_c |q_c k_jc| becomes at most
  // a_j + s_i with s_i = scale sum_c |q_ic w_c|, so the per-element condition
  // sum_j p_j a_j (|V_jc| + |O_c|) grows by at most s_i (max_j |V_jc| + |O_c|)
  // and the per-row one by s_i (the weights p_j do not change).
  AttentionRows expected = bed.reference();
  AttentionRows moved_outputs = bed.outputs();  // the base case's output, LSE moved
  double largest_shift = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group_size();
      std::vector<double> v_max(static_cast<std::size_t>(p.head_dim_v), 0.0);
      for (std::int64_t j = 0; j < p.len_kv(b); ++j)
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) v_max[c] = std::max(v_max[c], std::fabs(in.v.get(b, hk, j, c)));
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        double dot = 0, abs_dot = 0;
        for (std::int64_t c = 0; c < p.head_dim; ++c) {
          dot += in.q.get(b, h, i, c) * w[c];
          abs_dot += std::fabs(in.q.get(b, h, i, c) * w[c]);
        }
        const double shift = p.softmax_scale * dot, growth = p.softmax_scale * abs_dot;
        largest_shift = std::max(largest_shift, std::fabs(shift));
        const auto row = expected.index(b, h, i);
        if (!std::isfinite(expected.lse[row])) continue;  // fully masked: stays -inf
        expected.lse[row] += shift;
        moved_outputs.lse[moved_outputs.index(b, h, i)] += shift;
        expected.lse_condition[row] += growth;
        for (std::int64_t c = 0; c < p.head_dim_v; ++c)
          expected.o_condition[row * p.head_dim_v + c] += growth * (v_max[c] + std::fabs(expected.o_row(b, h, i)[c]));
      }
    }
  RC_TAG(largest_shift >= 1000 ? "shift=>=1000 logits" : largest_shift >= 100 ? "shift=>=100 logits" : "shift=<100 logits");
  // The relation between the two outputs, each within its bound of the exact
  // value (the base's judged, the shifted one's from its baseline): their sum.
  bed.verify("K + 1 w^T shift", p, bed.run(p, shifted), moved_outputs,
             bed.bound() + bed.baseline_bound(p, shifted, expected, expected), {&p});
}

void value_affine_map(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const Problem p = draw(rc::gen::map(in_domain(caps), with_small_integers), caps);
  Testbed bed(subject);
  bed.initialize(p, generate_inputs(p));
  // V -> aV + b with small dyadic a, b keeps V exact; the weights sum to one,
  // so O -> aO + b on every row that sees a key, and LSE is unchanged. The
  // conditioning sum_j p_j a_j (|V_jc| + |O_c|) becomes at most |a| times
  // itself plus 2 |b| sum_j p_j a_j (the per-row condition).
  const double a = *rc::gen::element(2.0, -1.0, 0.5, -2.0);
  const double shift = *rc::gen::element(0.0, 1.0, -3.0, 0.5);
  const Inputs mapped{bed.inputs().q, bed.inputs().k,
                      map_elements(bed.inputs().v, [&](double x) { return a * x + shift; })};
  AttentionRows expected = bed.reference();
  AttentionRows mapped_outputs = bed.outputs();  // a O + b of the base case's output
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        if (visible_key_range(p, b, i).count() == 0) continue;  // fully masked: stays 0
        const auto row = expected.index(b, h, i);
        double* o = expected.o_row(b, h, i);
        double* mapped_o = mapped_outputs.o_row(b, h, i);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          o[c] = a * o[c] + shift;
          mapped_o[c] = a * mapped_o[c] + shift;
          double& condition = expected.o_condition[row * p.head_dim_v + c];
          condition = std::fabs(a) * condition + 2 * std::fabs(shift) * expected.lse_condition[row];
        }
      }
  // As for the shift: the two outputs' relation, within the sum of their bounds
  // (measured: cpu-plain, f32, 1025 keys of same-sign V, 1.7 x the mapped
  // case's bound alone from the exact value, within the sum).
  bed.verify("V -> aV + b", p, bed.run(p, mapped), mapped_outputs,
             bed.bound() + bed.baseline_bound(p, mapped, expected, expected), {&p});
}

// Each O[i, c] is a convex combination of V[j, c] over the keys row i sees,
// with no tolerance rule: only rounding can carry it past the hull's edge:
// the weights rounded to the working dtype before P V (as kernels do: their
// sum then differs from 1 by up to n units of that dtype) and the f32
// accumulation, i.e. at most (n + 2)(u_f32 + u_work) max|V|.
// A row that sees no key is exactly 0.
void convex_hull(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const Problem p = draw(in_domain(caps, {.allow_special_values = false}), caps);
  const Inputs in = generate_inputs(p);
  const RunResult run = run_subject(subject, p, in);
  const DType work = caps.compute_dtype.value_or(p.dtype);
  const double units = unit_roundoff(DType::f32) + unit_roundoff(work);
  std::vector<double> row_lo, row_hi, key_lo, key_hi;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    std::vector<VisibleKeys> ranges;
    for (std::int64_t i = 0; i < lq; ++i) ranges.push_back(visible_key_range(p, b, i));
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
        // The hull of V as the subject sees it: rounded to the dtype it computes
        // in, and, where it declares it may flush subnormals, with them as 0 too.
        key_lo.assign(static_cast<std::size_t>(lk), 0.0);
        key_hi.assign(static_cast<std::size_t>(lk), 0.0);
        for (std::int64_t j = 0; j < lk; ++j) {
          const double x = round_to(work, in.v.get(b, hk, j, c));
          const double flushed = caps.may_flush_subnormals && std::fabs(x) < min_normal(work) ? 0.0 : x;
          key_lo[j] = std::min(x, flushed);
          key_hi[j] = std::max(x, flushed);
        }
        // Both ends of a row's key range move forward with the row under every
        // mask, so one pass with monotone deques gives each row's min and max.
        row_lo.assign(static_cast<std::size_t>(lq), kInfinity);
        row_hi.assign(static_cast<std::size_t>(lq), -kInfinity);
        std::deque<std::int64_t> lows, highs;  // key indices, values increasing / decreasing
        std::int64_t next = 0;
        for (std::int64_t i = 0; i < lq; ++i) {
          const VisibleKeys range = ranges[i];
          if (range.count() == 0) continue;
          for (; next <= range.last; ++next) {
            while (!lows.empty() && key_lo[lows.back()] >= key_lo[next]) lows.pop_back();
            while (!highs.empty() && key_hi[highs.back()] <= key_hi[next]) highs.pop_back();
            lows.push_back(next);
            highs.push_back(next);
          }
          while (lows.front() < range.first) lows.pop_front();
          while (highs.front() < range.first) highs.pop_front();
          row_lo[i] = key_lo[lows.front()];
          row_hi[i] = key_hi[highs.front()];
        }
        for (std::int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h)
          for (std::int64_t i = 0; i < lq; ++i) {
            const double o = run.outputs.o.get(b, h, i, c);
            const std::int64_t seen = ranges[i].count();
            if (seen == 0) {
              if (o != 0.0)
                RC_FAIL(fmt::format("fully masked row (b={}, h={}, row={}) has O={} (want 0)\n  problem: '{}'", b, h, i,
                                    o, to_line(p)));
              continue;
            }
            const double lo = row_lo[i], hi = row_hi[i];
            const double slack = static_cast<double>(seen + 2) * units * std::max(std::fabs(lo), std::fabs(hi));
            if (!(o >= lo - slack && o <= hi + slack))
              RC_FAIL(fmt::format("O(b={}, h={}, row={}, col={}) = {:.9g} is outside the hull [{:.9g}, {:.9g}] of the "
                                  "{} values it sees\n  problem: '{}'",
                                  b, h, i, c, o, lo, hi, seen, to_line(p)));
          }
      }
  }
}

bool has_causal(const Capabilities& caps) {
  return caps.masks.contains(MaskKind::causal_tl) || caps.masks.contains(MaskKind::causal_br) ||
         caps.masks.contains(MaskKind::window);
}

// The first key position past the last visible key of the visible row that
// ends earliest: keys from there on are unseen by at least that row.
std::int64_t earliest_unseen_key(const Problem& p) {
  std::int64_t earliest = p.seqlen_kv;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 0; i < p.len_q(b); ++i)
      if (const VisibleKeys range = visible_key_range(p, b, i); range.count() > 0)
        earliest = std::min(earliest, range.last + 1);
  return earliest;
}

void causal_prefix(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  // A masked problem in which some row that sees a key does not see the last one.
  const Problem p = draw(in_domain(caps, {.allow_special_values = false}), caps, [](const Problem& q) {
    return q.mask != MaskKind::none && earliest_unseen_key(q) < q.seqlen_kv;
  });
  const Inputs in = generate_inputs(p);
  // Change every key and value from position `cut` on; a row that sees only
  // keys before `cut` must not change by a single bit. `cut` is drawn where at
  // least one row that sees a key is unaffected. The changed values stay
  // finite (a value the map would overflow is negated instead): Inf is outside
  // some domains, and a kernel may weigh a masked key's value by 0.
  const std::int64_t cut = *rc::gen::inRange<std::int64_t>(earliest_unseen_key(p), p.seqlen_kv);
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
  const auto unaffected = [&](std::int64_t b, std::int64_t, std::int64_t i) {
    const VisibleKeys range = visible_key_range(p, b, i);
    return range.count() == 0 || range.last < cut;
  };
  const std::int64_t compared = assert_bitwise("keys past a row's last visible key", p, before.outputs, after.outputs,
                                               unaffected);
  RC_TAG(compared > 0 ? "bitwise_rows=some" : "bitwise_rows=none");
  RC_ASSERT(compared > 0);  // by the choice of cut
}

void batch_and_head_independence(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const Problem p = draw(in_domain(caps, {.allow_special_values = false}), caps,
                         [](const Problem& q) { return q.batch * q.heads_kv >= 2; });
  const Inputs in = generate_inputs(p);
  // Change one (batch, K/V head)'s K, V and the queries of its head group:
  // every other (batch, head) must not change by a single bit. The target is
  // drawn so that some other group has a row that sees a key.
  std::vector<std::int64_t> entries_with_rows;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 0; i < p.len_q(b); ++i)
      if (visible_key_range(p, b, i).count() > 0) {
        entries_with_rows.push_back(b);
        break;
      }
  std::vector<std::pair<std::int64_t, std::int64_t>> targets;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      if (p.heads_kv > 1 || entries_with_rows.size() > 1 || b != entries_with_rows.front()) targets.push_back({b, hk});
  const auto [target_b, target_hk] = *rc::gen::elementOf(targets);
  Inputs changed = in;
  for (std::int64_t j = 0; j < p.seqlen_kv; ++j) {
    for (std::int64_t c = 0; c < p.head_dim; ++c) changed.k.set(target_b, target_hk, j, c, 2 * in.k.get(target_b, target_hk, j, c) - 1);
    for (std::int64_t c = 0; c < p.head_dim_v; ++c) changed.v.set(target_b, target_hk, j, c, -in.v.get(target_b, target_hk, j, c) + 3);
  }
  for (std::int64_t h = target_hk * p.group_size(); h < (target_hk + 1) * p.group_size(); ++h)
    for (std::int64_t i = 0; i < p.seqlen_q; ++i)
      for (std::int64_t c = 0; c < p.head_dim; ++c) changed.q.set(target_b, h, i, c, 0.5 * in.q.get(target_b, h, i, c) + 1);
  const RunResult before = run_subject(subject, p, in), after = run_subject(subject, p, changed);
  const std::int64_t compared = assert_bitwise(
      "another (batch, head)'s inputs", p, before.outputs, after.outputs,
      [&](std::int64_t b, std::int64_t h, std::int64_t) { return b != target_b || h / p.group_size() != target_hk; });
  RC_TAG(compared > 0 ? "bitwise_rows=some" : "bitwise_rows=none");
  RC_ASSERT(compared > 0);  // by the choice of target
}

bool has_gqa(const Capabilities& caps) { return caps.gqa; }

// Grouped heads: the drawn grouping, or, for a drawn MHA problem, a ratio of
// 2, 4 or 8 (those within the default work budget), or MQA, drawn evenly.
rc::Gen<Problem> grouped(const Capabilities& caps) {
  return rc::gen::mapcat(in_domain(caps), [](Problem p) -> rc::Gen<Problem> {
    if (p.heads_kv < p.heads_q) return rc::gen::just(p);
    const double work_per_head = static_cast<double>(p.batch) * p.heads_kv * p.seqlen_q * p.seqlen_kv *
                                 static_cast<double>(p.head_dim + p.head_dim_v);
    std::vector<std::int64_t> ratios = {0};  // 0: MQA
    for (std::int64_t ratio : {2, 4, 8})
      if (work_per_head * static_cast<double>(ratio) <= DomainLimits{}.max_work) ratios.push_back(ratio);
    return rc::gen::map(rc::gen::elementOf(ratios), [p](std::int64_t ratio) {
      Problem q = p;
      if (ratio == 0) {
        q.heads_kv = 1;
        q.heads_q = std::max<std::int64_t>(p.heads_q, 2);
      } else {
        q.heads_q = p.heads_kv * ratio;
      }
      return q;
    });
  });
}

Problem repeated_mha(const Problem& gqa) {
  Problem mha = gqa;
  mha.heads_kv = gqa.heads_q;
  return mha;
}

void gqa_equals_repeated_mha(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const Problem gqa = draw(grouped(caps), caps, [&caps](const Problem& q) {
    return q.heads_kv < q.heads_q && !unsupported_reason(caps, repeated_mha(q));
  });
  const Problem mha = repeated_mha(gqa);
  Testbed bed(subject);
  bed.initialize(gqa, generate_inputs(gqa));
  // Query head h of a group reads K/V head h / group: repeating each K/V head
  // once per query head gives MHA the same rows.
  const Inputs repeated{bed.inputs().q, repeat_heads(bed.inputs().k, gqa.group_size()),
                        repeat_heads(bed.inputs().v, gqa.group_size())};
  bed.verify("GQA == MHA with repeated K/V", mha, bed.run(mha, repeated), bed.reference(), bed.bound(), {&gqa, &mha});
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

// Padded batches: the drawn one, or a drawn problem padded with a second,
// shorter sequence.
rc::Gen<Problem> padded(const Capabilities& caps) {
  return rc::gen::mapcat(in_domain(caps), [](Problem p) -> rc::Gen<Problem> {
    if (p.padded()) return rc::gen::just(p);
    return rc::gen::map(rc::gen::pair(rc::gen::inRange<std::int64_t>(0, p.seqlen_q + 1),
                                      rc::gen::inRange<std::int64_t>(0, p.seqlen_kv + 1)),
                        [p](std::pair<std::int64_t, std::int64_t> second) {
                          Problem q = p;
                          q.batch = 2;
                          q.lens_q = {p.seqlen_q, second.first};
                          q.lens_kv = {p.seqlen_kv, second.second};
                          return q;
                        });
  });
}

void padded_equals_trimmed(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  // Some entry alone is in the domain and has a row that sees a key.
  const Problem p = draw(padded(caps), caps, [&caps](const Problem& q) {
    for (std::int64_t b = 0; b < q.batch; ++b)
      if (const Problem t = trimmed(q, b); !unsupported_reason(caps, t) && visible_rows(t) > 0) return true;
    return false;
  });
  Testbed bed(subject);
  bed.initialize(p, generate_inputs(p));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Problem t = trimmed(p, b);
    if (!bed.sufficient(t)) continue;  // e.g. a length the domain's multiples exclude
    const Inputs alone{batch_entry(bed.inputs().q, b, t.seqlen_q), batch_entry(bed.inputs().k, b, t.seqlen_kv),
                       batch_entry(bed.inputs().v, b, t.seqlen_kv)};
    bed.verify("padded == trimmed", t, bed.run(t, alone), batch_entry(bed.reference(), b, t), bed.bound(), {&p, &t});
  }
}

bool has_lse_and_unmasked(const Capabilities& caps) { return caps.lse && caps.masks.contains(MaskKind::none); }

// The sub-problem of `count` keys.
Problem key_slice(const Problem& p, std::int64_t count) {
  Problem s = p;
  s.seqlen_kv = count;
  return s;
}

void lse_merge_of_key_halves(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const std::int64_t multiple = caps.seqlen_kv_multiple;
  const auto unpadded_unmasked = [](Problem q) {
    q = unmasked(q);
    q.lens_q.clear();
    q.lens_kv.clear();
    return q;
  };
  const Problem p = draw(rc::gen::map(in_domain(caps, {.allow_special_values = false}), unpadded_unmasked), caps,
                         [multiple](const Problem& q) { return q.seqlen_kv >= 2 * multiple; });
  const std::int64_t cut = multiple * *rc::gen::inRange<std::int64_t>(1, p.seqlen_kv / multiple);
  const Problem first = key_slice(p, cut), second = key_slice(p, p.seqlen_kv - cut);
  Testbed bed(subject);
  RC_PRE(bed.sufficient(first) && bed.sufficient(second));
  bed.initialize(p, generate_inputs(p));
  const Inputs& in = bed.inputs();
  const AttentionRows ra = bed.run(first, {in.q, slice_rows(in.k, 0, cut), slice_rows(in.v, 0, cut)});
  const AttentionRows rb = bed.run(second, {in.q, slice_rows(in.k, cut, p.seqlen_kv - cut),
                                            slice_rows(in.v, cut, p.seqlen_kv - cut)});
  // Merge the halves through their LSE, in f64:
  //   L = log(e^La + e^Lb),  O = e^(La - L) Oa + e^(Lb - L) Ob.
  AttentionRows merged(p, all_rows(p));
  double weight_sensitivity = 0;  // max over elements of wa wb |Oa - Ob|
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        const double la = ra.lse[ra.index(b, h, i)], lb = rb.lse[rb.index(b, h, i)];
        const double top = std::max(la, lb);
        const double lse = top + std::log(std::exp(la - top) + std::exp(lb - top));
        const double wa = std::exp(la - lse), wb = std::exp(lb - lse);
        merged.lse[merged.index(b, h, i)] = lse;
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double oa = ra.o_row(b, h, i)[c], ob = rb.o_row(b, h, i)[c];
          merged.o_row(b, h, i)[c] = wa * oa + wb * ob;
          weight_sensitivity = std::max(weight_sensitivity, wa * wb * std::fabs(oa - ob));
        }
      }
  // The merge of the halves equals the whole's reference. Tolerance: each
  // half within the base's bound B of its exact result (the base's baseline
  // stands for the halves'); its O error enters with its weight (<= 1), and
  // its LSE error moves the weights: dO/dLa = wa wb (Oa - Ob), likewise Lb.
  const Tolerance half = bed.bound();
  bed.verify("LSE merge of two key halves == whole", p, merged, bed.reference(),
             {half.o + half.o + weight_sensitivity * (half.lse + half.lse), half.lse + half.lse},
             {&p, &first, &second});
}

bool has_both_causal(const Capabilities& caps) {
  return caps.masks.contains(MaskKind::causal_tl) && caps.masks.contains(MaskKind::causal_br);
}

// Bottom-right causal with Lq <= Lk is top-left causal on Lk queries whose
// last Lq rows are the original queries.
Problem top_left_extension(const Problem& br) {
  Problem tl = br;
  tl.mask = MaskKind::causal_tl;
  tl.seqlen_q = br.seqlen_kv;
  return tl;
}

void bottom_right_equals_offset_top_left(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  // The top-left problem has Lk queries: keep Lk moderate so it stays in budget.
  const auto bottom_right = [](Problem q) {
    q.mask = MaskKind::causal_br;
    q.window_left = q.window_right = -1;
    q.lens_q.clear();
    q.lens_kv.clear();
    return q;
  };
  const Problem br = draw(
      rc::gen::map(in_domain(caps, {.max_seqlen = std::min<std::int64_t>(160, caps.max_seqlen_q)}), bottom_right), caps,
      [&caps](const Problem& q) {
        return q.seqlen_q <= q.seqlen_kv && !unsupported_reason(caps, top_left_extension(q));
      });
  const Problem tl = top_left_extension(br);
  Testbed bed(subject);
  bed.initialize(br, generate_inputs(br));
  // Row i of the bottom-right problem is row i + (Lk - Lq) of the top-left one;
  // the rows before are filler queries.
  Problem filler = tl;
  filler.data_seed ^= 0x5eed;
  Inputs extended = generate_inputs(filler);
  extended.k = bed.inputs().k;
  extended.v = bed.inputs().v;
  const std::int64_t offset = br.seqlen_kv - br.seqlen_q;
  for (std::int64_t b = 0; b < br.batch; ++b)
    for (std::int64_t h = 0; h < br.heads_q; ++h)
      for (std::int64_t i = 0; i < br.seqlen_q; ++i)
        for (std::int64_t c = 0; c < br.head_dim; ++c) extended.q.set(b, h, i + offset, c, bed.inputs().q.get(b, h, i, c));
  bed.verify("causal_br == causal_tl on the offset problem", br, row_window(bed.run(tl, extended), offset, br),
             bed.reference(), bed.bound(), {&br, &tl});
}

bool has_split_kv(const Capabilities& caps) { return caps.split_kv; }

void split_counts_agree(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  const Problem p = draw(in_domain(caps), caps);
  RC_TAG(p.seqlen_kv < 7 ? "splits=more than keys" : "splits=at most keys");
  // Back to the heuristic however the property ends (RC_FAIL throws).
  struct Restore {
    Subject& subject;
    ~Restore() { subject.set_split_count(0); }
  } restore{subject};
  // Each split count must pass the whole rule on its own (a split that writes
  // a wrong slot, or leaves one unwritten, fails here) against the one
  // reference and baseline of the case; any two then agree within the sum of
  // their bounds.
  Testbed bed(subject);
  RC_ASSERT(subject.set_split_count(1));
  bed.initialize(p, generate_inputs(p));
  for (int splits : {2, 3, 7}) {
    RC_ASSERT(subject.set_split_count(splits));
    bed.verify_rule(fmt::format("with {} splits", splits), bed.run(p, bed.inputs()));
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
  const Capabilities& caps = subject.capabilities();
  const Problem p = draw(in_domain(caps), caps);
  const Inputs in = generate_inputs(p);
  const RunResult first = run_subject(subject, p, in), second = run_subject(subject, p, in);
  if (!(first.outputs.o == second.outputs.o))
    RC_FAIL(fmt::format("two runs gave different O bits\n  problem: '{}'", to_line(p)));
  RC_ASSERT(first.outputs.lse.size() == second.outputs.lse.size());
  if (!first.outputs.lse.empty() &&
      std::memcmp(first.outputs.lse.data(), second.outputs.lse.data(), first.outputs.lse.size() * sizeof(float)) != 0)
    RC_FAIL(fmt::format("two runs gave different LSE bits\n  problem: '{}'", to_line(p)));
}

// Whether the domain holds problems with no row to compare. Under every mask
// the last query row of a sequence with keys sees its last key (the masks are
// aligned at the bottom-right, or causal_tl's row 0 sees key 0), so such a
// problem is one whose every sequence has no query or no key: it needs
// empty sequences. Fully masked rows inside other problems are ConvexHull's
// and the oracle's business (O = 0 exactly; LSE = -inf in the NaN/Inf census).
bool has_vacuous_shapes(const Capabilities& caps) { return caps.empty_sequences; }

void fully_masked_convention(Subject& subject) {
  const Capabilities& caps = subject.capabilities();
  // Only empty or fully masked problems (DomainLimits::vacuous_only; the
  // filter is the guard until the generator honours it).
  const Problem p = *rc::gen::suchThat(gen_problem_in(caps, {.vacuous_only = true}),
                                       [](const Problem& q) { return visible_rows(q) == 0; });
  classify(p, caps);
  // Which kind: no query row, or rows without keys (a third kind, rows whose
  // keys the mask hides, would be a problem the generator cannot draw).
  bool any_row = false, any_key = false;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    any_row = any_row || p.len_q(b) > 0;
    any_key = any_key || (p.len_q(b) > 0 && p.len_kv(b) > 0);
  }
  RC_TAG(!any_row ? "shape=no query row" : !any_key ? "shape=no key" : "shape=masked");
  const RunResult run = run_subject(subject, p, generate_inputs(p));
  // The outputs have the problem's shape (a GPU subject's guard bands turn a
  // write out of bounds into an error, which run_subject fails on).
  const HostTensor& o = run.outputs.o;
  RC_ASSERT(o.batch() == p.batch && o.heads() == p.heads_q && o.seqlen() == p.seqlen_q && o.dim() == p.head_dim_v);
  if (run.outputs.has_lse) RC_ASSERT(static_cast<std::int64_t>(run.outputs.lse.size()) == p.lse_elements());
  // Every valid row sees no key: O = 0 and LSE = -inf, the one convention.
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        for (std::int64_t c = 0; c < p.head_dim_v; ++c)
          if (const double x = o.get(b, h, i, c); x != 0.0)
            RC_FAIL(fmt::format("fully masked row (b={}, h={}, row={}) has O[{}] = {} (want 0)\n  problem: '{}'", b, h,
                                i, c, x, to_line(p)));
        if (!run.outputs.has_lse) continue;
        const float lse = run.outputs.lse[(b * p.heads_q + h) * p.seqlen_q + i];
        if (!(std::isinf(lse) && lse < 0))
          RC_FAIL(fmt::format("fully masked row (b={}, h={}, row={}) has LSE = {} (want -inf)\n  problem: '{}'", b, h, i,
                              lse, to_line(p)));
      }
}

// Counts a property run's cases: discards, and the passing cases per
// dimension of their tags ("dimension=value").
class CaseTally final : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription& description) override {
    using Type = rc::detail::CaseResult::Type;
    if (description.result.type == Type::Discard) {
      ++discarded_;
      if (discard_reasons_.size() < 3) discard_reasons_.push_back(description.result.description);
      return;
    }
    if (description.result.type != Type::Success) return;
    ++passed_;
    for (std::string tag : description.tags) {
      // RC_TAG shows a string argument quoted.
      if (tag.size() >= 2 && tag.front() == '"' && tag.back() == '"') tag = tag.substr(1, tag.size() - 2);
      const std::size_t equals = tag.find('=');
      if (equals == std::string::npos) ++coverage_["other"][tag];
      else ++coverage_[tag.substr(0, equals)][tag.substr(equals + 1)];
    }
  }
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}

  int passed() const { return passed_; }
  int discarded() const { return discarded_; }
  double discard_share() const { return passed_ + discarded_ ? double(discarded_) / (passed_ + discarded_) : 0.0; }
  std::string report() const {
    std::string text = fmt::format("{} case(s) passed, {} discarded ({:.1f}% of those drawn)\n", passed_, discarded_,
                                   100 * discard_share());
    for (const auto& [dimension, values] : coverage_) {
      text += fmt::format("  {:<14}", dimension);
      for (const auto& [value, count] : values)
        text += fmt::format(" {} {:.0f}%", value, 100.0 * count / std::max(passed_, 1));
      text += "\n";
    }
    for (const std::string& reason : discard_reasons_) text += "  discarded: " + reason.substr(0, 200) + "\n";
    return text;
  }

 private:
  int passed_ = 0, discarded_ = 0;
  std::map<std::string, std::map<std::string, int>> coverage_;
  std::vector<std::string> discard_reasons_;
};

}  // namespace

rc::detail::TestParams budget_for(const SubjectProperty& property, rc::detail::TestParams params) {
  params.maxSuccess = std::max(1, static_cast<int>(property.budget_share * params.maxSuccess));
  return params;
}

PropertyOutcome check_property(const SubjectProperty& property, Subject& subject, const rc::detail::TestParams& params,
                               const std::string& id) {
  rc::detail::TestMetadata metadata;
  metadata.id = id;
  metadata.description = std::string(property.name);
  CaseTally tally;
  const rc::detail::TestResult result = rc::detail::checkTestable([&] { property.check(subject); }, metadata,
                                                                  budget_for(property, params), tally);
  PropertyOutcome outcome;
  outcome.coverage = tally.report();
  std::ostringstream message;
  rc::detail::printResultMessage(result, message);
  outcome.message = message.str();
  outcome.passed = result.template is<rc::detail::SuccessResult>();
  if (outcome.passed && tally.discard_share() > kMaxDiscardShare && tally.discarded() > kDiscardsAlwaysAllowed) {
    outcome.passed = false;
    outcome.message = fmt::format("{} discarded {} of {} drawn cases ({:.1f}%), more than the {:.0f}% allowed "
                                  "(kMaxDiscardShare): the passing count overstates what was tested\n{}",
                                  property.name, tally.discarded(), tally.passed() + tally.discarded(),
                                  100 * tally.discard_share(), 100 * kMaxDiscardShare, outcome.coverage);
  }
  return outcome;
}

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
      {"FullyMaskedConvention", "problems with no row that sees a key: O = 0 and LSE = -inf on every row, shapes kept",
       has_vacuous_shapes, fully_masked_convention, 1.0 / 20},
  };
  return properties;
}

}  // namespace flashcheck
