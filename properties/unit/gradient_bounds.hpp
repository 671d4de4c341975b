// How far an f64 evaluation of attention's gradients may lie from the exact
// gradients, element by element, derived from the sums' lengths (first order
// in u = 2^-53; Higham, Accuracy and Stability of Numerical Algorithms, 2nd
// ed., eq. 3.5 for dot products and sums: n roundings give at most gamma_n =
// n u / (1 - n u) relative to the sum of the magnitudes). Used by the gradient
// oracles' tests: cpu_f64 against MPFR, and cpu_f64 against the Kokkos
// Algorithm-2 reference (each within its own bound of the exact value, so
// within the sum of the two bounds of each other).
//
// For query row i (valid, with n visible keys) and visible key j, with
// a_ij = scale sum_c |q_ic k_jc|, A = max_j a_ij, R = max_j (m - s_ij) the
// spread of the row's logits below their maximum m:
//   S     |dS_ij| (the logit) <= gamma_{d+1} a_ij                (a dot product, then the scale)
//   P     |dP_ij| <= c P_ij, where c depends on how P is formed:
//         two-pass (cpu_f64: exp(s - m) / sum): the weight's error
//           w = 2 gamma_{d+1} A + u R + 2u (s and m, the subtraction,
//           exp to 1 ULP), twice (the weight and the sum's terms), gamma_n
//           for the sum, u for the quotient: c = 2 w + gamma_n + u;
//         online with LSE (Kokkos: the forward's rescaled running sum, then
//           exp(s - LSE)): the running sum takes at most n + 2 rescalings
//           of error w each (the forward's MPFR bound, triangulation_properties.cpp),
//           f = (n + 2) w + 2 gamma_n + u is the error of the sum and of O; LSE
//           = m + log(sum) adds gamma_{d+1} A (m), f, u |LSE| and u log n; the
//           recomputation adds gamma_{d+1} a_ij, u (R + log n) for s - LSE and
//           2u for exp: c = 2 gamma_{d+1} A + f + u (|LSE| + R + 2 log n) + 2u
//           (c >= f: it covers O's error, and so D's, below).
//   dP    |d(dP_ij)| <= gamma_dv b_ij,  b_ij = sum_c |dO_ic v_jc|
//   D     either way (sum_j P dP or rowsum(dO o O)) |dD_i| <= (c + gamma_n + gamma_dv) B_i,
//         B_i = sum_j P_ij b_ij, which bounds both sum_j P |dP| and sum_c |dO_c O_c|
//   dS    e_ij = P_ij ((c + 2u)(|dP_ij| + |D_i|) + gamma_dv b_ij + |dD_i|)
//   dV_jc: sum over the N = group x lq query rows of P_ij dO_ic:
//          sum_i (c + gamma_{N+1}) P_ij |dO_ic|
//   dK_jc: scale sum_i dS_ij q_ic:  scale sum_i (e_ij + gamma_{N+2} |dS_ij|) |q_ic|
//   dQ_ic: scale sum_j dS_ij k_jc:  scale sum_j (e_ij + gamma_{lk+2} |dS_ij|) |k_jc|
// (the sums' lengths are taken as every row or key a blocked product may run
// over, zeros included; the +2 is the scale's product and the dS product).
// The score modifications (Problem::softcap, ::alibi) add to a logit's error:
// a softcap s / C, tanh (1 ULP) and C tanh, 4 u |s| at most (the error before
// passes with tanh's slope <= 1); ALiBi's bias two roundings (the slope, its
// product) and the subtraction one, 3 u |bias|. With a softcap, dS carries
// the chain rule's g = 1 - tanh^2(s / C): its own error is 3 u (t^2, 1 - t^2)
// plus 2 |t| g |ds| / C for the logit's error ds, relative to |P (dP - D)|.
// The exact P, dP, D and dS the bound weighs are evaluated here in long
// double: the bound needs their size, not their last bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck::testing_bounds {

inline constexpr double kUnit = std::numeric_limits<double>::epsilon() / 2;  // u = 2^-53

/// Higham's gamma_n = n u / (1 - n u): the relative error bound of n roundings.
inline double gamma(double n) { return n * kUnit / (1 - n * kUnit); }

/// How an oracle forms P.
enum class SoftmaxOrder { two_pass, online_with_lse };

/// Whether valid query i of a sequence with lq queries and lk keys sees key j
/// (the mask's rule from core/problem.hpp, written again for the tests).
inline bool sees(const Problem& p, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) {
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

/// The bound above for every element of dQ (all query rows), dK and dV (all
/// key rows), in GradientRows' layout. Padding rows and fully masked rows
/// get 0: their gradients must be exactly 0.
inline GradientRows gradient_error_bound(const Problem& p, const Inputs& in, const HostTensor& dout, SoftmaxOrder order) {
  GradientRows bound(p, all_rows(p), all_key_rows(p));
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  const double scale = p.softmax_scale;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    const double rows_summed = static_cast<double>(p.group_size() * lq);
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group_size();
      for (std::int64_t i = 0; i < lq; ++i) {
        std::vector<std::int64_t> keys;
        for (std::int64_t j = 0; j < lk; ++j)
          if (sees(p, i, j, lq, lk)) keys.push_back(j);
        if (keys.empty()) continue;
        const auto n = static_cast<double>(keys.size());
        const std::size_t count = keys.size();
        std::vector<long double> s(count), prob(count), dprob(count), chain(count, 1.0L);
        std::vector<double> a(count), magnitude_dp(count), modification(count, 0.0);
        long double maximum = -INFINITY, minimum = INFINITY;
        for (std::size_t t = 0; t < count; ++t) {
          long double dot = 0, absolute = 0;
          for (std::int64_t c = 0; c < d; ++c) {
            const long double x = static_cast<long double>(in.q.get(b, h, i, c)) * in.k.get(b, hk, keys[t], c);
            dot += x;
            absolute += std::fabs(x);
          }
          s[t] = scale * dot;
          a[t] = static_cast<double>(scale * absolute);
          if (p.softcap > 0) {
            const long double capped = std::tanh(s[t] / p.softcap);
            chain[t] = 1 - capped * capped;
            s[t] = p.softcap * capped;
            modification[t] += 4 * kUnit * a[t];
          }
          if (p.alibi) {
            const double bias = alibi_slope(p.heads_q, h) * std::fabs(static_cast<double>(i + lk - lq - keys[t]));
            s[t] -= bias;
            modification[t] += 3 * kUnit * bias;
          }
          maximum = std::max(maximum, s[t]);
          minimum = std::min(minimum, s[t]);
          long double dp = 0, absolute_dp = 0;
          for (std::int64_t c = 0; c < dv; ++c) {
            const long double x = static_cast<long double>(dout.get(b, h, i, c)) * in.v.get(b, hk, keys[t], c);
            dp += x;
            absolute_dp += std::fabs(x);
          }
          dprob[t] = dp;
          magnitude_dp[t] = static_cast<double>(absolute_dp);
        }
        long double sum = 0;
        for (std::size_t t = 0; t < count; ++t) sum += std::exp(s[t] - maximum);
        long double delta = 0, weighted_b = 0;
        for (std::size_t t = 0; t < count; ++t) {
          prob[t] = std::exp(s[t] - maximum) / sum;
          delta += prob[t] * dprob[t];
          weighted_b += prob[t] * magnitude_dp[t];
        }
        const double max_a = *std::max_element(a.begin(), a.end());
        // A logit's error: its dot product and scale, and its modifications.
        const double logit_error = gamma(d + 1.0) * max_a + *std::max_element(modification.begin(), modification.end());
        const double spread = static_cast<double>(maximum - minimum);
        const double lse = static_cast<double>(maximum + std::log(sum));
        const double weight_error = 2 * logit_error + kUnit * spread + 2 * kUnit;
        double c_p;
        if (order == SoftmaxOrder::two_pass) {
          c_p = 2 * weight_error + gamma(n) + kUnit;
        } else {
          const double sum_error = (n + 2) * weight_error + 2 * gamma(n) + kUnit;
          c_p = 2 * logit_error + sum_error + kUnit * (std::fabs(lse) + spread + 2 * std::log(n)) + 2 * kUnit;
        }
        const double delta_error = (c_p + gamma(n) + gamma(static_cast<double>(dv))) * static_cast<double>(weighted_b);
        for (std::size_t t = 0; t < count; ++t) {
          const std::int64_t j = keys[t];
          const double pr = static_cast<double>(prob[t]);
          const double g = static_cast<double>(chain[t]);
          const double unchained = static_cast<double>(std::fabs(prob[t] * (dprob[t] - delta)));
          const double ds = static_cast<double>(prob[t] * (dprob[t] - delta) * chain[t]);
          double ds_error = g * pr * ((c_p + 2 * kUnit) * (std::fabs(static_cast<double>(dprob[t])) +
                                                          std::fabs(static_cast<double>(delta))) +
                                      gamma(static_cast<double>(dv)) * magnitude_dp[t] + delta_error);
          if (p.softcap > 0) {
            const double t_abs = std::sqrt(std::max(0.0, 1 - g));
            ds_error += unchained * (3 * kUnit + 2 * t_abs * g * logit_error / p.softcap) + kUnit * std::fabs(ds);
          }
          double* dq = bound.dq_row(b, h, i);
          double* dk = bound.dk_row(b, hk, j);
          double* dvb = bound.dv_row(b, hk, j);
          const double dq_weight = scale * (ds_error + gamma(lk + 2.0) * std::fabs(ds));
          const double dk_weight = scale * (ds_error + gamma(rows_summed + 2) * std::fabs(ds));
          const double dv_weight = (c_p + gamma(rows_summed + 1)) * pr;
          for (std::int64_t c = 0; c < d; ++c) {
            dq[c] += dq_weight * std::fabs(in.k.get(b, hk, j, c));
            dk[c] += dk_weight * std::fabs(in.q.get(b, h, i, c));
          }
          for (std::int64_t c = 0; c < dv; ++c) dvb[c] += dv_weight * std::fabs(dout.get(b, h, i, c));
        }
      }
    }
  }
  return bound;
}

/// The element-wise sum of two bounds (two oracles, each within its own bound
/// of the exact gradients, are within the sum of each other).
inline GradientRows sum_of(GradientRows first, const GradientRows& second) {
  for (std::size_t n = 0; n < first.dq.size(); ++n) first.dq[n] += second.dq[n];
  for (std::size_t n = 0; n < first.dk.size(); ++n) first.dk[n] += second.dk[n];
  for (std::size_t n = 0; n < first.dv.size(); ++n) first.dv[n] += second.dv[n];
  return first;
}

/// One gradient compared element by element against a bound.
struct Agreement {
  std::int64_t compared = 0;   // elements compared
  std::int64_t exceeded = 0;   // elements outside the bound
  double worst_ratio = 0;      // max |got - want| / bound (0 / 0 counts as 0)
  double largest = 0;          // max |want|
  double largest_bound = 0;    // max bound
  std::string first_failure;   // "index i: got x, want y, bound z"
};

/// Compares got and want at the positions of `bound` (same layout): where the
/// bound is 0 (padding, fully masked) both must be exactly 0.
inline Agreement agree(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& bound) {
  Agreement result;
  for (std::size_t n = 0; n < want.size(); ++n) {
    ++result.compared;
    const double error = std::fabs(got[n] - want[n]);
    result.largest = std::max(result.largest, std::fabs(want[n]));
    result.largest_bound = std::max(result.largest_bound, bound[n]);
    const bool within = bound[n] > 0 ? error <= bound[n] : (got[n] == 0 && want[n] == 0);
    if (bound[n] > 0) result.worst_ratio = std::max(result.worst_ratio, error / bound[n]);
    if (!within || std::isnan(got[n]) || std::isnan(want[n])) {
      if (result.exceeded++ == 0) {
        char text[160];
        std::snprintf(text, sizeof text, "index %zu: got %.17g, want %.17g, bound %.3g", n, got[n], want[n], bound[n]);
        result.first_failure = text;
      }
    }
  }
  return result;
}

}  // namespace flashcheck::testing_bounds
