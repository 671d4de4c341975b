// cpu_f64's gradients: against a direct element-by-element evaluation of the
// backward formulas (D_i from O, not from P and dP as the oracle takes it), on
// every mask, GQA, varlen, both layouts and dv != d; against central finite
// differences of the f64 forward oracle; the identities the gradients obey;
// sampled rows; and independence of the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/oracles/cpu_f64_backward.hpp"

namespace flashcheck {
namespace {

// The keys query i sees, by the mask's spec (written again here).
bool sees(const Problem& p, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) {
  const std::int64_t diagonal = i + lk - lq;
  switch (p.mask) {
    case MaskKind::none: return true;
    case MaskKind::causal_tl: return j <= i;
    case MaskKind::causal_br: return j <= diagonal;
    case MaskKind::window:
      return (p.window_left < 0 || j >= diagonal - p.window_left) && (p.window_right < 0 || j <= diagonal + p.window_right);
  }
  return false;
}

// Every gradient, element by element, in long double.
GradientRows direct_gradients(const Problem& p, const Inputs& in, const HostTensor& dout) {
  GradientRows g(p, all_rows(p), all_key_rows(p));
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group_size();
      for (std::int64_t i = 0; i < lq; ++i) {
        std::vector<long double> s(lk), pr(lk, 0), dp(lk, 0), o(dv, 0);
        long double maximum = -INFINITY;
        bool any = false;
        for (std::int64_t j = 0; j < lk; ++j) {
          if (!sees(p, i, j, lq, lk)) continue;
          long double dot = 0;
          for (std::int64_t c = 0; c < d; ++c) dot += (long double)in.q.get(b, h, i, c) * in.k.get(b, hk, j, c);
          s[j] = p.softmax_scale * dot;
          maximum = std::max(maximum, s[j]);
          any = true;
        }
        if (!any) continue;
        long double sum = 0;
        for (std::int64_t j = 0; j < lk; ++j)
          if (sees(p, i, j, lq, lk)) sum += std::exp(s[j] - maximum);
        for (std::int64_t j = 0; j < lk; ++j) {
          if (!sees(p, i, j, lq, lk)) continue;
          pr[j] = std::exp(s[j] - maximum) / sum;
          for (std::int64_t c = 0; c < dv; ++c) {
            o[c] += pr[j] * in.v.get(b, hk, j, c);
            dp[j] += (long double)dout.get(b, h, i, c) * in.v.get(b, hk, j, c);
          }
        }
        long double delta = 0;
        for (std::int64_t c = 0; c < dv; ++c) delta += (long double)dout.get(b, h, i, c) * o[c];
        for (std::int64_t j = 0; j < lk; ++j) {
          if (!sees(p, i, j, lq, lk)) continue;
          const long double ds = pr[j] * (dp[j] - delta);
          for (std::int64_t c = 0; c < d; ++c) {
            g.dq_row(b, h, i)[c] += static_cast<double>(p.softmax_scale * ds * in.k.get(b, hk, j, c));
            g.dk_row(b, hk, j)[c] += static_cast<double>(p.softmax_scale * ds * in.q.get(b, h, i, c));
          }
          for (std::int64_t c = 0; c < dv; ++c)
            g.dv_row(b, hk, j)[c] += static_cast<double>(pr[j] * dout.get(b, h, i, c));
        }
      }
    }
  }
  return g;
}

// max |a - b| / max(max |b|, tiny): one normwise-relative figure per gradient.
double relative_gap(const std::vector<double>& a, const std::vector<double>& b) {
  double gap = 0, scale = 1e-300;
  for (std::size_t n = 0; n < a.size(); ++n) {
    gap = std::max(gap, std::fabs(a[n] - b[n]));
    scale = std::max(scale, std::fabs(b[n]));
  }
  return gap / scale;
}

Problem shaped(std::int64_t b, std::int64_t hq, std::int64_t hkv, std::int64_t sq, std::int64_t skv, std::int64_t d,
               MaskKind mask, std::uint64_t seed) {
  Problem p = make_problem(b, hq, hkv, sq, skv, d, DType::bf16, mask);
  p.data_seed = seed;
  return p;
}

TEST(OracleBackward, AgreesWithTheFormulasElementByElement) {
  std::vector<Problem> problems;
  std::uint64_t seed = 1;
  for (MaskKind mask : {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window})
    for (auto [hq, hkv] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{3, 1}}) {
      Problem p = shaped(2, hq, hkv, 37, 29, 16, mask, seed++);
      if (mask == MaskKind::window) p.window_left = 5, p.window_right = 2;
      problems.push_back(p);
    }
  Problem varlen = shaped(3, 4, 2, 40, 33, 8, MaskKind::causal_br, 99);
  varlen.lens_q = {40, 0, 17};
  varlen.lens_kv = {21, 9, 33};
  problems.push_back(varlen);
  Problem layout = shaped(1, 2, 1, 20, 300, 24, MaskKind::none, 5);  // keys past one row block's width
  layout.layout = Layout::bshd;
  layout.head_dim_v = 12;
  problems.push_back(layout);
  Problem more_queries = shaped(1, 1, 1, 700, 40, 8, MaskKind::causal_tl, 6);  // several row blocks
  problems.push_back(more_queries);
  for (const Problem& p : problems) {
    SCOPED_TRACE(to_line(p));
    const Inputs in = generate_inputs(p);
    const HostTensor dout = generate_dout(p);
    const GradientRows want = direct_gradients(p, in, dout);
    const GradientRows got = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
    // Both are f64 evaluations of the same sums (the direct one in long double):
    // they differ by rounding, a few units of 1e-16 times the sums' conditioning.
    EXPECT_LE(relative_gap(got.dq, want.dq), 1e-12);
    EXPECT_LE(relative_gap(got.dk, want.dk), 1e-12);
    EXPECT_LE(relative_gap(got.dv, want.dv), 1e-12);
  }
}

// L(Q, K, V) = sum dO o O, whose gradient is the oracle's. Central differences
// D(h) = (L(x + h) - L(x - h)) / 2h differ from dL/dx by (h^2 / 6) L'''(x) +
// O(h^4), and by rounding: |L| eps / h. With h = 2^-7 and 2^-8 (perturbed
// inputs stay exact in f32: the inputs are multiples of 2^-10 of magnitude
// below 2, 21 bits) the truncation term dominates the rounding term (about
// 1e-6 against 1e-13), so a correct gradient g shows |D(h) - g| ~ 4 |D(h/2) - g|:
// the error falls as h^2. A wrong gradient leaves a gap that does not shrink.
// The test requires the gap at h/2 to be at most a third of the one at h (or
// both at rounding level) and at most 1e-4 of the gradient's scale.
TEST(OracleBackward, AgreesWithCentralDifferencesOfTheForwardOracle) {
  for (MaskKind mask : {MaskKind::none, MaskKind::causal_br}) {
    Problem p = make_problem(1, 2, 1, 3, 4, 3, DType::f32, mask);
    p.data_seed = 11;
    Inputs in = generate_inputs(p);
    auto quantize = [](HostTensor& t) {
      for (std::int64_t n = 0; n < t.size(); ++n) t.store(n, std::round(t.load(n) * 1024) / 1024);
    };
    quantize(in.q), quantize(in.k), quantize(in.v);
    HostTensor dout = generate_dout(p);
    quantize(dout);
    const GradientRows g = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
    auto loss = [&](const Inputs& x) {
      const AttentionRows o = cpu_f64_reference(p, x, all_rows(p));
      double sum = 0;
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t i = 0; i < p.seqlen_q; ++i)
          for (std::int64_t c = 0; c < p.head_dim_v; ++c) sum += dout.get(0, h, i, c) * o.o_row(0, h, i)[c];
      return sum;
    };
    double scale = 0;
    for (double x : g.dq) scale = std::max(scale, std::fabs(x));
    int checked = 0;
    for (int tensor = 0; tensor < 3; ++tensor) {
      HostTensor Inputs::*member = tensor == 0 ? &Inputs::q : tensor == 1 ? &Inputs::k : &Inputs::v;
      const HostTensor& t = in.*member;
      for (std::int64_t h = 0; h < t.heads(); ++h)
        for (std::int64_t s = 0; s < t.seqlen(); ++s)
          for (std::int64_t c = 0; c < t.dim(); ++c) {
            const double want = tensor == 0 ? g.dq_row(0, h, s)[c] : tensor == 1 ? g.dk_row(0, h, s)[c] : g.dv_row(0, h, s)[c];
            double gap[2];
            for (int k = 0; k < 2; ++k) {
              const double step = k == 0 ? 1.0 / 128 : 1.0 / 256;
              Inputs plus = in, minus = in;
              (plus.*member).set(0, h, s, c, t.get(0, h, s, c) + step);
              (minus.*member).set(0, h, s, c, t.get(0, h, s, c) - step);
              gap[k] = std::fabs((loss(plus) - loss(minus)) / (2 * step) - want);
            }
            SCOPED_TRACE(testing::Message() << "tensor " << tensor << " h " << h << " s " << s << " c " << c);
            EXPECT_TRUE(gap[1] <= gap[0] / 3 || gap[0] <= 1e-11) << gap[0] << " then " << gap[1];
            EXPECT_LE(gap[1], 1e-4 * std::max(scale, 1.0));
            ++checked;
          }
    }
    EXPECT_EQ(checked, 2 * 3 * 3 + 2 * 4 * 3);
  }
}

// sum_j dV_j = sum_i dO_i over the rows that see a key (the rows of P sum to 1),
// and sum_j dK_j = scale sum_i (sum_j dS_ij) q_i = 0 (each row of dS sums to
// sum_j P_ij dP_ij - D_i = 0): per (batch, K/V head), up to f64 rounding.
TEST(OracleBackward, KeyGradientsSumToZeroAndValueGradientsToTheUpstreamOnes) {
  Problem p = shaped(2, 4, 2, 64, 80, 32, MaskKind::causal_br, 3);
  p.lens_q = {64, 30};
  p.lens_kv = {80, 12};
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const GradientRows g = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
      for (std::int64_t c = 0; c < p.head_dim; ++c) {
        double sum = 0, magnitude = 0;
        for (std::int64_t j = 0; j < lk; ++j) sum += g.dk_row(b, hk, j)[c], magnitude += std::fabs(g.dk_row(b, hk, j)[c]);
        EXPECT_LE(std::fabs(sum), 1e-13 * std::max(magnitude, 1.0)) << "b " << b << " hk " << hk << " c " << c;
      }
      for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
        double sum = 0, upstream = 0;
        for (std::int64_t j = 0; j < lk; ++j) sum += g.dv_row(b, hk, j)[c];
        for (std::int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h)
          for (std::int64_t i = 0; i < lq; ++i)
            if (i + lk - lq >= 0) upstream += dout.get(b, h, i, c);  // causal_br: row i sees a key
        EXPECT_NEAR(sum, upstream, 1e-12 * std::max(std::fabs(upstream), 1.0)) << "b " << b << " hk " << hk;
      }
      // Padding rows stay 0.
      for (std::int64_t j = lk; j < p.seqlen_kv; ++j) EXPECT_EQ(g.dk_row(b, hk, j)[0], 0.0);
    }
}

TEST(OracleBackward, SampledRowsAreTheFullRowsAtThoseRowsAndTheThreadCountChangesNothing) {
  Problem p = shaped(1, 2, 1, 600, 520, 32, MaskKind::window, 8);
  p.window_left = 100, p.window_right = 30;
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const GradientRows full = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
  const RowSet q = sample_rows(p, 40, 3), kv = sample_key_rows(p, 50, 4);
  const GradientRows sampled = cpu_f64_gradients(p, in, dout, q, kv);
  for (std::int64_t h = 0; h < p.heads_q; ++h)
    for (std::int64_t r = 0; r < q.size(); ++r)
      for (std::int64_t c = 0; c < p.head_dim; ++c)
        EXPECT_EQ(sampled.dq_row(0, h, r)[c], full.dq_row(0, h, q.rows[r])[c]);
  for (std::int64_t r = 0; r < kv.size(); ++r)
    for (std::int64_t c = 0; c < p.head_dim; ++c)
      EXPECT_NEAR(sampled.dk_row(0, 0, r)[c], full.dk_row(0, 0, kv.rows[r])[c],
                  1e-13 * (1 + std::fabs(full.dk_row(0, 0, kv.rows[r])[c])));
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const GradientRows one = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
  omp_set_num_threads(std::max(threads, 2));
  const GradientRows two = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
  omp_set_num_threads(threads);
  EXPECT_EQ(one.dq, two.dq);
  EXPECT_EQ(one.dk, two.dk);
  EXPECT_EQ(one.dv, two.dv);
}

TEST(OracleBackward, FullyMaskedRowsHaveZeroGradientsAndNonFiniteMaskedKeysStayOut) {
  // causal_br with more queries than keys: the first rows see no key.
  Problem p = shaped(1, 1, 1, 12, 5, 4, MaskKind::causal_br, 2);
  Inputs in = generate_inputs(p);
  in.k.set(0, 0, 4, 0, std::numeric_limits<double>::infinity());  // seen only by the last row
  in.v.set(0, 0, 4, 1, std::numeric_limits<double>::quiet_NaN());
  const HostTensor dout = generate_dout(p);
  const GradientRows g = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
  for (std::int64_t i = 0; i < 7; ++i)
    for (std::int64_t c = 0; c < p.head_dim; ++c) EXPECT_EQ(g.dq_row(0, 0, i)[c], 0.0) << "row " << i;
  for (std::int64_t i = 7; i < 11; ++i)  // they do not see key 4
    for (std::int64_t c = 0; c < p.head_dim; ++c) EXPECT_TRUE(std::isfinite(g.dq_row(0, 0, i)[c])) << "row " << i;
  EXPECT_TRUE(std::isnan(g.dq_row(0, 0, 11)[0]));  // the Inf logit makes its row NaN, as in the forward
}

}  // namespace
}  // namespace flashcheck
