// The properties every subject is held to, each the relation it states, on
// the Testbed (testbed.hpp), the tensor transforms (transforms.hpp) and the
// derived references (relations.hpp). RapidCheck's public API only: *rc::gen
// to draw, RC_ASSERT / RC_FAIL to fail, RC_PRE to discard, RC_TAG to show
// coverage.
#include <fmt/format.h>
#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "flashcheck/core/values.hpp"
#include "flashcheck/testing/property_suite.hpp"
#include "flashcheck/testing/testbed.hpp"
#include "problem_moves.hpp"

namespace flashcheck::testing {
namespace {

std::string shift_class(double logits) {
  return logits >= 1000 ? "shift=>=1000 logits" : logits >= 100 ? "shift=>=100 logits" : "shift=<100 logits";
}

// ---- the properties ---------------------------------------------------------

void agrees_with_oracle(Subject& subject) {
  Testbed bed(subject);
  const Problem p = bed.draw(bed.problems({.softcap = true, .alibi = true, .paged = true}));
  RC_TAG("values=" + std::string(to_string(p.values.family)));
  bed.initialize(p);  // within k x baseline + floor of the f64 oracle
  // No vacuous pass: inputs the problem says are non-zero are, and so is the
  // output wherever some row sees a key and has a finite reference.
  if (p.values.family == ValueFamily::sparse_int) return;
  RC_ASSERT(bed.inputs_nonzero());
  if (bed.reference_has_finite_row() && p.values.family != ValueFamily::subnormal) RC_ASSERT(bed.outputs_nonzero());
}

void key_value_permutation(Subject& subject) {
  Testbed bed(subject);
  const Problem p = bed.draw(rc::gen::map(bed.problems({.allow_special_values = false, .softcap = true}), unmasked));
  bed.initialize(p);
  // Permuting each sequence's keys and values together permutes the terms of
  // every row's sums: O and LSE are the base's.
  const RowOrder order = draw_row_order(lengths_kv(p), p.heads_kv);
  const Inputs moved{bed.inputs().q, permute_rows(bed.inputs().k, order), permute_rows(bed.inputs().v, order)};
  // Within the sum of the two outputs' bounds: the base's, and the baseline's
  // on the permuted inputs (a same-precision sum in another order rounds
  // differently; measured on an H100: fa2-rowthread, f32, dominant keys, 1023
  // keys, 1.0005 x the base bound from the exact value).
  bed.verify("K/V row permutation", p, bed.run(p, moved), bed.outputs(),
             bed.bound() + bed.baseline_bound(p, moved, bed.reference()), {&p});
}

void query_permutation(Subject& subject) {
  Testbed bed(subject);
  const Problem p = bed.draw(rc::gen::map(bed.problems({.allow_special_values = false, .softcap = true}), unmasked));
  bed.initialize(p);
  // Permuting the query rows permutes the output rows the same way.
  const RowOrder order = draw_row_order(lengths_q(p), p.heads_q);
  const Inputs moved{permute_rows(bed.inputs().q, order), bed.inputs().k, bed.inputs().v};
  bed.verify("Q row permutation", p, bed.run(p, moved), permute_rows(bed.reference(), order), bed.bound(), {&p});
}

void key_shift_invariance(Subject& subject) {
  Testbed bed(subject);
  const Problem p = bed.draw(rc::gen::map(bed.problems({.alibi = true}), with_small_integers));
  bed.initialize(p);
  // K -> K + 1 w^T: |k| <= 3 and |w| <= 250 keep K + w an integer below 256,
  // exact in bf16; the shifts reach ~1e3 logits and beyond.
  const double magnitude = *rc::gen::element(1.0, 8.0, 64.0, 250.0);
  std::vector<double> w(static_cast<std::size_t>(p.head_dim));
  for (auto& x : w) x = std::round(magnitude * *rc::gen::inRange(-100, 101) / 100.0);
  const Inputs shifted{bed.inputs().q, map_elements(bed.inputs().k, [&](const Element& e, double x) { return x + w[e.c]; }),
                       bed.inputs().v};
  // O unchanged, LSE moved by scale q.w: the base's reference and output so moved.
  const KeyShift expected = shift_keys(p, bed.inputs(), bed.reference(), w);
  RC_TAG(shift_class(expected.largest_shift));
  // Each output within its bound of the exact value (the base's judged, the
  // shifted one's from its baseline): their relation within the sum.
  bed.verify("K + 1 w^T shift", p, bed.run(p, shifted), shift_keys(p, bed.inputs(), bed.outputs(), w).rows,
             bed.bound() + bed.baseline_bound(p, shifted, expected.rows), {&p});
}

void value_affine_map(Subject& subject) {
  Testbed bed(subject);
  const Problem p = bed.draw(rc::gen::map(bed.problems({.softcap = true, .alibi = true}), with_small_integers));
  bed.initialize(p);
  // V -> aV + b with small dyadic a, b keeps V exact: O -> aO + b, LSE unchanged.
  const double a = *rc::gen::element(2.0, -1.0, 0.5, -2.0);
  const double shift = *rc::gen::element(0.0, 1.0, -3.0, 0.5);
  const Inputs mapped{bed.inputs().q, bed.inputs().k,
                      map_elements(bed.inputs().v, [&](double x) { return a * x + shift; })};
  // As for the shift: within the sum of the two bounds (measured: cpu-plain,
  // f32, 1025 keys of same-sign V, 1.7 x the mapped case's bound alone from
  // the exact value, within the sum).
  bed.verify("V -> aV + b", p, bed.run(p, mapped), map_values(p, bed.outputs(), a, shift),
             bed.bound() + bed.baseline_bound(p, mapped, map_values(p, bed.reference(), a, shift)), {&p});
}

// Each O[i, c] is a convex combination of V[j, c] over the keys row i sees,
// with no tolerance rule: only rounding can carry it past the hull's edge:
// the weights rounded to the working dtype before P V (as kernels do: their
// sum then differs from 1 by up to n units of that dtype) and the f32
// accumulation, i.e. at most (n + 2)(u_f32 + u_work) max|V|. A row that sees
// no key is exactly 0.
void convex_hull(Subject& subject) {
  Testbed bed(subject);
  const Capabilities& caps = bed.capabilities();
  const Problem p = bed.draw(bed.problems({.allow_special_values = false, .softcap = true, .alibi = true}));
  const Inputs in = generate_inputs(p);
  const DType work = caps.compute_dtype.value_or(p.dtype);
  bed.verify_inside("each output within the hull of the values its row sees", p, bed.run(p, in),
                    value_hull(p, in.v, work, caps.may_flush_subnormals,
                               unit_roundoff(DType::f32) + unit_roundoff(work)));
}

bool has_causal(const Capabilities& caps) {
  return caps.masks.contains(MaskKind::causal_tl) || caps.masks.contains(MaskKind::causal_br) ||
         caps.masks.contains(MaskKind::window);
}

void causal_prefix(Subject& subject) {
  Testbed bed(subject);
  // A masked problem in which some row that sees a key does not see the last one.
  const Problem p = bed.draw(bed.problems({.allow_special_values = false, .softcap = true, .alibi = true}), [](const Problem& q) {
    return q.mask != MaskKind::none && earliest_unseen_key(q) < q.seqlen_kv;
  });
  const Inputs in = generate_inputs(p);
  // Change every key and value from position `cut` on (drawn so that some
  // row that sees a key sees none of them): such a row must not change by a
  // single bit. The changed values stay finite (one the map would overflow is
  // negated instead): Inf is outside some domains, and a kernel may weigh a
  // masked key's value by 0.
  const std::int64_t cut = *rc::gen::inRange<std::int64_t>(earliest_unseen_key(p), p.seqlen_kv);
  const auto past_cut = [&](double a, double b) {
    return [&p, cut, a, b](const Element& e, double x) {
      return e.s < cut ? x : std::isfinite(round_to(p.dtype, a * x + b)) ? a * x + b : -x;
    };
  };
  const Inputs changed{in.q, map_elements(in.k, past_cut(-3, 1)), map_elements(in.v, past_cut(7, -2))};
  const AttentionRows before = bed.run(p, in), after = bed.run(p, changed);
  const std::int64_t compared =
      bed.verify_bitwise("keys past a row's last visible key", p, after, before, [&](std::int64_t b, std::int64_t, std::int64_t i) {
        const VisibleKeys range = visible_key_range(p, b, i);
        return range.count() == 0 || range.last < cut;
      });
  RC_TAG(compared > 0 ? "bitwise_rows=some" : "bitwise_rows=none");
  RC_ASSERT(compared > 0);  // by the choice of cut
}

void batch_and_head_independence(Subject& subject) {
  Testbed bed(subject);
  const Problem p = bed.draw(bed.problems({.allow_special_values = false, .softcap = true}),
                             [](const Problem& q) { return q.batch * q.heads_kv >= 2; });
  const Inputs in = generate_inputs(p);
  // Change one (batch, K/V head)'s K, V and the queries of its head group:
  // every other (batch, head) must not change by a single bit.
  const auto [target_b, target_hk] = *rc::gen::elementOf(independence_targets(p));
  const auto in_target = [&](const Element& e, std::int64_t group) { return e.b == target_b && e.h / group == target_hk; };
  const Inputs changed{
      map_elements(in.q, [&](const Element& e, double x) { return in_target(e, p.group_size()) ? 0.5 * x + 1 : x; }),
      map_elements(in.k, [&](const Element& e, double x) { return in_target(e, 1) ? 2 * x - 1 : x; }),
      map_elements(in.v, [&](const Element& e, double x) { return in_target(e, 1) ? -x + 3 : x; })};
  const AttentionRows before = bed.run(p, in), after = bed.run(p, changed);
  const std::int64_t compared = bed.verify_bitwise(
      "another (batch, head)'s inputs", p, after, before,
      [&](std::int64_t b, std::int64_t h, std::int64_t) { return b != target_b || h / p.group_size() != target_hk; });
  RC_TAG(compared > 0 ? "bitwise_rows=some" : "bitwise_rows=none");
  RC_ASSERT(compared > 0);  // by the choice of target
}

bool has_gqa(const Capabilities& caps) { return caps.gqa; }

void gqa_equals_repeated_mha(Subject& subject) {
  Testbed bed(subject);
  // The filter outlives this body while RapidCheck shrinks (the sequence of
  // shrinks is lazy): it holds the domain, not a reference to the bed.
  const Problem gqa = bed.draw(grouped(bed.problems({.softcap = true, .alibi = true})), [caps = bed.capabilities()](const Problem& q) {
    return q.heads_kv < q.heads_q && !unsupported_reason(caps, repeated_mha(q));
  });
  const Problem mha = repeated_mha(gqa);
  bed.initialize(gqa);
  // Query head h of a group reads K/V head h / group: repeating each K/V head
  // once per query head gives MHA the same rows.
  const Inputs repeated{bed.inputs().q, repeat(bed.inputs().k, Axis::heads, gqa.group_size()),
                        repeat(bed.inputs().v, Axis::heads, gqa.group_size())};
  bed.verify("GQA == MHA with repeated K/V", mha, bed.run(mha, repeated), bed.reference(), bed.bound(), {&gqa, &mha});
}

bool has_varlen(const Capabilities& caps) { return caps.varlen; }

void padded_equals_trimmed(Subject& subject) {
  Testbed bed(subject);
  // Some entry alone is in the domain and has a row that sees a key.
  const Problem p = bed.draw(padded(bed.problems({.softcap = true, .alibi = true})), [caps = bed.capabilities()](const Problem& q) {
    for (std::int64_t b = 0; b < q.batch; ++b)
      if (const Problem t = trimmed(q, b); !unsupported_reason(caps, t) && visible_rows(t) > 0) return true;
    return false;
  });
  bed.initialize(p);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Problem t = trimmed(p, b);
    if (!bed.sufficient(t)) continue;  // e.g. a length the domain's multiples exclude
    const auto alone = [&](const HostTensor& x, std::int64_t length) {
      return trim(slice(x, Axis::batch, b, 1), Axis::seq, length);
    };
    const Inputs entry{alone(bed.inputs().q, t.seqlen_q), alone(bed.inputs().k, t.seqlen_kv),
                       alone(bed.inputs().v, t.seqlen_kv)};
    bed.verify("padded == trimmed", t, bed.run(t, entry), batch_entry(bed.reference(), b, t), bed.bound(), {&p, &t});
  }
}

bool has_lse_and_unmasked(const Capabilities& caps) { return caps.lse && caps.masks.contains(MaskKind::none); }

void lse_merge_of_key_halves(Subject& subject) {
  Testbed bed(subject);
  const std::int64_t multiple = bed.capabilities().seqlen_kv_multiple;
  const Problem p = bed.draw(rc::gen::map(bed.problems({.allow_special_values = false, .softcap = true}),
                                          [](Problem q) { return unpadded(unmasked(q)); }),
                             [multiple](const Problem& q) { return q.seqlen_kv >= 2 * multiple; });
  const std::int64_t cut = multiple * *rc::gen::inRange<std::int64_t>(1, p.seqlen_kv / multiple);
  const Problem first = key_slice(p, cut), second = key_slice(p, p.seqlen_kv - cut);
  RC_PRE(bed.sufficient(first) && bed.sufficient(second));
  bed.initialize(p);
  const Inputs& in = bed.inputs();
  const auto keys = [&](std::int64_t from, std::int64_t count) {
    return Inputs{in.q, slice(in.k, Axis::seq, from, count), slice(in.v, Axis::seq, from, count)};
  };
  const Merged merged = merge_by_lse(p, bed.run(first, keys(0, cut)), bed.run(second, keys(cut, p.seqlen_kv - cut)));
  // The merge of the halves equals the whole's reference. Tolerance: each
  // half within the base's bound B of its exact result (the base's baseline
  // stands for the halves'); its O error enters with its weight (<= 1), and
  // its LSE error moves the weights (Merged::weight_sensitivity).
  const Tolerance half = bed.bound();
  bed.verify("LSE merge of two key halves == whole", p, merged.rows, bed.reference(),
             {half.o + half.o + merged.weight_sensitivity * (half.lse + half.lse), half.lse + half.lse},
             {&p, &first, &second});
}

bool has_both_causal(const Capabilities& caps) {
  return caps.masks.contains(MaskKind::causal_tl) && caps.masks.contains(MaskKind::causal_br);
}

void bottom_right_equals_offset_top_left(Subject& subject) {
  Testbed bed(subject);
  // The top-left problem has Lk queries: keep Lk moderate so it stays in budget.
  // ALiBi's bias is bottom-right aligned as the mask is: |i + Lk - Lq - j| is
  // |i' - j| at row i' = i + (Lk - Lq) of the top-left problem of Lk queries.
  const DomainLimits limits{.max_seqlen = std::min<std::int64_t>(160, bed.capabilities().max_seqlen_q),
                            .softcap = true,
                            .alibi = true};
  const Problem br = bed.draw(rc::gen::map(bed.problems(limits), bottom_right),
                              [caps = bed.capabilities()](const Problem& q) {
    return q.seqlen_q <= q.seqlen_kv && !unsupported_reason(caps, top_left_extension(q));
  });
  const Problem tl = top_left_extension(br);
  bed.initialize(br);
  // Row i of the bottom-right problem is row i + (Lk - Lq) of the top-left
  // one; the rows before are filler queries.
  Problem filler = tl;
  filler.data_seed ^= 0x5eed;
  const std::int64_t offset = br.seqlen_kv - br.seqlen_q;
  // The filler queries at the case's Q descale (fp8), which keeps the case's rows exact.
  const Inputs extended{
      concat(with_descale(trim(generate_inputs(filler).q, Axis::seq, offset), bed.inputs().q.descale()),
             bed.inputs().q, Axis::seq),
      bed.inputs().k, bed.inputs().v};
  bed.verify("causal_br == causal_tl on the offset problem", br, row_window(bed.run(tl, extended), offset, br),
             bed.reference(), bed.bound(), {&br, &tl});
}

bool has_split_kv(const Capabilities& caps) { return caps.split_kv; }

void split_counts_agree(Subject& subject) {
  Testbed bed(subject);
  const Problem p = bed.draw(bed.problems({.softcap = true, .alibi = true}));
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
  RC_ASSERT(subject.set_split_count(1));
  bed.initialize(p);
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
  Testbed bed(subject);
  const Problem p = bed.draw(bed.problems({.softcap = true, .alibi = true, .paged = true}));
  const Inputs in = generate_inputs(p);
  const Outputs first = bed.call(p, in), second = bed.call(p, in);
  // Every bit of O (padding and NaN payloads included) and of LSE.
  if (!(first.o == second.o)) RC_FAIL(fmt::format("two runs gave different O bits\n  problem: '{}'", to_line(p)));
  if (first.lse.size() != second.lse.size() ||
      !std::equal(first.lse.begin(), first.lse.end(), second.lse.begin(),
                  [](float x, float y) { return std::memcmp(&x, &y, sizeof(float)) == 0; }))
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
  Testbed bed(subject);
  // Only empty or fully masked problems (DomainLimits::vacuous_only; the
  // filter is the guard until the generator honours it).
  const Problem p = *rc::gen::suchThat(gen_problem_in(bed.capabilities(), {.vacuous_only = true}),
                                       [](const Problem& q) { return visible_rows(q) == 0; });
  bed.tag(p);
  // Which kind: no query row, or rows without keys (a third kind, rows whose
  // keys the mask hides, would be a problem the generator cannot draw).
  bool any_row = false, any_key = false;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    any_row = any_row || p.len_q(b) > 0;
    any_key = any_key || (p.len_q(b) > 0 && p.len_kv(b) > 0);
  }
  RC_TAG(!any_row ? "shape=no query row" : !any_key ? "shape=no key" : "shape=masked");
  const Outputs out = bed.call(p, generate_inputs(p));
  // The outputs have the problem's shape (a GPU subject's guard bands turn a
  // write out of bounds into an error, which call() fails on).
  RC_ASSERT(out.o.batch() == p.batch && out.o.heads() == p.heads_q && out.o.seqlen() == p.seqlen_q &&
            out.o.dim() == p.head_dim_v);
  if (out.has_lse) RC_ASSERT(static_cast<std::int64_t>(out.lse.size()) == p.lse_elements());
  // Every valid row sees no key: O = 0 and LSE = -inf, the one convention.
  bed.verify("fully masked rows: O = 0, LSE = -inf", p, gather_rows(p, out, all_rows(p)), fully_masked(p), {0, 0},
             {&p});
}

bool always(const Capabilities&) { return true; }
bool has_unmasked(const Capabilities& caps) { return caps.masks.contains(MaskKind::none); }

}  // namespace

const std::vector<SubjectProperty>& subject_properties() {
  static const std::vector<SubjectProperty> properties = [] {
  std::vector<SubjectProperty> forward = {
      {"AgreesWithTheOracle", "within k x baseline + floor of cpu_f64, NaN/Inf positions equal, no vacuous pass",
       always, agrees_with_oracle, 1.0, /*end_to_end=*/true},
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
  forward.insert(forward.end(), serving_properties().begin(), serving_properties().end());
  forward.insert(forward.end(), backward_properties().begin(), backward_properties().end());
  return forward;
  }();
  return properties;
}

}  // namespace flashcheck::testing
