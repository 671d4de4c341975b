// Metamorphic properties of the f64 oracle. Each transforms the inputs in a way
// whose effect on attention is known exactly and checks the oracle follows.
//
// The inputs are f32 tensors holding multiples of 1/64 below 2^10, so the
// transformed inputs (K + w, aV + b with dyadic a, b) are exact and the only
// differences left are the oracle's own f64 rounding: the bounds below are a
// few f64 roundings at the magnitudes involved.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/generators/generators.hpp"

namespace flashcheck {
namespace {

constexpr double kF64Eps = std::numeric_limits<double>::epsilon();

Problem exact_problem(Problem p) {
  p.dtype = DType::f32;
  p.values = ValueDist{ValueFamily::normal, {0.5, 2.0}};
  return p;
}

// Rounds every element to a multiple of 1/64 (exact in f32 below 2^18).
void quantize(HostTensor& t) {
  for (std::int64_t i = 0; i < t.size(); ++i) t.store(i, std::round(t.load(i) * 64.0) / 64.0);
}

Inputs exact_inputs(const Problem& p) {
  Inputs in = generate_inputs(p);
  quantize(in.q);
  quantize(in.k);
  quantize(in.v);
  return in;
}

double max_abs(const std::vector<double>& values) {
  double m = 0;
  for (double x : values)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// Asserts element-wise |a - b| <= bound, with -inf (fully masked LSE) equal to itself.
void assert_close(const std::vector<double>& a, const std::vector<double>& b, double bound, const char* what) {
  RC_ASSERT(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    if (std::fabs(a[i] - b[i]) > bound)
      RC_FAIL(std::string(what) + " differs at flat index " + std::to_string(i) + ": " + std::to_string(a[i]) +
              " vs " + std::to_string(b[i]) + " (bound " + std::to_string(bound) + ")");
  }
}

rc::Gen<Problem> gen_oracle_problem() {
  ProblemLimits limits;
  limits.allow_special_values = false;
  return rc::gen::map(gen_problem(limits), exact_problem);
}

// A bound for O differences: f64 roundings through the two products and the
// exponentials, at the magnitude of V, growing with the number of keys.
double o_bound(const Problem& p, double v_scale, double logit_scale) {
  return 64 * kF64Eps * (1.0 + logit_scale) * v_scale * std::max<double>(1.0, std::log2(p.seqlen_kv + 1.0)) * 8;
}

RC_GTEST_PROP(CpuF64, JointKeyValuePermutationLeavesOutputUnchanged, ()) {
  Problem p = *gen_oracle_problem();
  p.mask = MaskKind::none;
  p.window_left = p.window_right = -1;
  RC_CLASSIFY(p.padded(), "padded");
  RC_CLASSIFY(p.heads_q != p.heads_kv, "gqa");
  const Inputs in = exact_inputs(p);
  Inputs permuted = in;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_kv; ++h) {
      // Fisher-Yates over the valid keys, drawn through RapidCheck so it shrinks.
      std::vector<std::int64_t> perm(static_cast<std::size_t>(p.len_kv(b)));
      std::iota(perm.begin(), perm.end(), 0);
      for (std::size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[*rc::gen::inRange<std::size_t>(0, i)]);
      for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
        for (std::int64_t c = 0; c < p.head_dim; ++c) permuted.k.set(b, h, j, c, in.k.get(b, h, perm[j], c));
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) permuted.v.set(b, h, j, c, in.v.get(b, h, perm[j], c));
      }
    }
  const auto rows = all_rows(p);
  const auto base = cpu_f64_reference(p, in, rows);
  const auto moved = cpu_f64_reference(p, permuted, rows);
  const double logit_scale = max_abs(base.lse) + 1;
  assert_close(moved.o, base.o, o_bound(p, max_abs(base.o) + 1, logit_scale), "O");
  assert_close(moved.lse, base.lse, 64 * kF64Eps * logit_scale * std::max<double>(1, p.seqlen_kv), "LSE");
}

RC_GTEST_PROP(CpuF64, AddingOneVectorToEveryKeyShiftsOnlyTheLse, ()) {
  const Problem p = *gen_oracle_problem();
  RC_CLASSIFY(true, to_string(p.mask));
  const Inputs in = exact_inputs(p);
  // K -> K + 1 w^T: every logit of row i moves by scale * q_i . w, which softmax
  // ignores; LSE moves by exactly that. Shifts reach ~1e3 logits.
  const auto magnitude = *rc::gen::element(1.0, 16.0, 256.0);
  Inputs shifted = in;
  std::vector<double> w(static_cast<std::size_t>(p.head_dim));
  for (auto& x : w) x = std::round(*rc::gen::inRange(-64, 65) * magnitude / 64.0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_kv; ++h)
      for (std::int64_t j = 0; j < p.seqlen_kv; ++j)
        for (std::int64_t c = 0; c < p.head_dim; ++c) shifted.k.set(b, h, j, c, in.k.get(b, h, j, c) + w[c]);
  const auto rows = all_rows(p);
  const auto base = cpu_f64_reference(p, in, rows);
  const auto moved = cpu_f64_reference(p, shifted, rows);
  double max_shift = 0;
  std::vector<double> expected_lse = base.lse;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        double dot = 0;
        for (std::int64_t c = 0; c < p.head_dim; ++c) dot += in.q.get(b, h, i, c) * w[c];
        const double shift = p.softmax_scale * dot;
        max_shift = std::max(max_shift, std::fabs(shift));
        double& lse = expected_lse[base.index(b, h, i)];
        if (std::isfinite(lse)) lse += shift;
      }
  RC_CLASSIFY(max_shift > 100, "shift > 100 logits");
  const double logit_scale = max_abs(moved.lse) + max_shift + 1;
  assert_close(moved.o, base.o, o_bound(p, max_abs(base.o) + 1, logit_scale), "O");
  assert_close(moved.lse, expected_lse, 64 * kF64Eps * logit_scale * std::max<double>(1, p.head_dim), "LSE");
}

RC_GTEST_PROP(CpuF64, AffineMapOfValuesMapsTheOutput, ()) {
  const Problem p = *gen_oracle_problem();
  const Inputs in = exact_inputs(p);
  // V -> aV + b: softmax weights sum to one, so O -> aO + b and LSE is unchanged.
  const double a = *rc::gen::element(0.5, 2.0, -1.0, 3.0, -0.25);
  const double shift = *rc::gen::element(0.0, 1.0, -7.0, 0.25, 100.0);
  Inputs mapped = in;
  for (std::int64_t i = 0; i < mapped.v.size(); ++i) mapped.v.store(i, a * in.v.load(i) + shift);
  const auto rows = all_rows(p);
  const auto base = cpu_f64_reference(p, in, rows);
  const auto moved = cpu_f64_reference(p, mapped, rows);
  std::vector<double> expected = base.o;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < rows.size(); ++r) {
        if (!std::isfinite(base.lse[base.index(b, h, r)])) continue;  // fully masked or padding: O stays 0
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          double& o = expected[static_cast<std::size_t>(base.index(b, h, r) * p.head_dim_v + c)];
          o = a * o + shift;
        }
      }
  const double scale = std::fabs(a) * (max_abs(base.o) + 1) + std::fabs(shift);
  assert_close(moved.o, expected, o_bound(p, scale, max_abs(base.lse) + 1), "O");
  assert_close(moved.lse, base.lse, 0.0, "LSE");
}

RC_GTEST_PROP(CpuF64, EachOutputLiesInTheConvexHullOfTheValues, ()) {
  const Problem p = *gen_oracle_problem();
  RC_CLASSIFY(true, to_string(p.mask));
  const Inputs in = exact_inputs(p);
  const auto rows = all_rows(p);
  const auto ref = cpu_f64_reference(p, in, rows);
  // O[i, c] is a convex combination of V[j, c] over the keys row i sees, so it
  // lies within [min_j V[j, c], max_j V[j, c]] over the valid keys (up to f64
  // rounding of the weighted sum). Fully masked rows are exactly 0.
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        const double* o = ref.o_row(b, h, i);
        const bool masked = ref.lse[ref.index(b, h, i)] == -std::numeric_limits<double>::infinity();
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          if (masked) {
            RC_ASSERT(o[c] == 0.0);
            continue;
          }
          double lo = std::numeric_limits<double>::infinity(), hi = -lo;
          for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
            const double v = in.v.get(b, h / p.group_size(), j, c);
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
          const double slack = 4 * kF64Eps * std::max(std::fabs(lo), std::fabs(hi)) * std::log2(p.len_kv(b) + 2.0);
          RC_ASSERT(o[c] >= lo - slack);
          RC_ASSERT(o[c] <= hi + slack);
        }
      }
}

RC_GTEST_PROP(CpuF64, SampledRowsMatchTheFullComputation, ()) {
  const Problem p = *gen_oracle_problem();
  const Inputs in = exact_inputs(p);
  const auto count = *rc::gen::inRange<std::int64_t>(1, std::max<std::int64_t>(2, p.seqlen_q));
  const RowSet sample = sample_rows(p, count, *rc::gen::arbitrary<std::uint64_t>());
  if (p.seqlen_q > 0) {
    RC_ASSERT(sample.rows.front() == 0);
    RC_ASSERT(sample.rows.back() == p.seqlen_q - 1);
  }
  RC_ASSERT(std::is_sorted(sample.rows.begin(), sample.rows.end()));
  const auto full = cpu_f64_reference(p, in, all_rows(p));
  const auto part = cpu_f64_reference(p, in, sample);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < sample.size(); ++r) {
        const std::int64_t i = sample.rows[r];
        const double lse_full = full.lse[full.index(b, h, i)], lse_part = part.lse[part.index(b, h, r)];
        RC_ASSERT(lse_full == lse_part || std::fabs(lse_full - lse_part) <= 1e-12 * (1 + std::fabs(lse_full)));
        for (std::int64_t c = 0; c < p.head_dim_v; ++c)
          RC_ASSERT(std::fabs(full.o_row(b, h, i)[c] - part.o_row(b, h, r)[c]) <=
                    1e-12 * (1 + std::fabs(full.o_row(b, h, i)[c])));
      }
}

}  // namespace
}  // namespace flashcheck
