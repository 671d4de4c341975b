// Cross-oracle triangulation: the f64 oracle against the independent Kokkos
// reference (online softmax), and both against MPFR at 256 bits.
#include <cmath>
#include <limits>
#include <numeric>

#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cpu_f64.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"
#include "flashcheck/generators/generators.hpp"
#include "properties/gtest_prop.hpp"
#include "properties/mpfr_reference.hpp"

namespace flashcheck {
namespace {

constexpr double kUnit = std::numeric_limits<double>::epsilon() / 2;  // u = 2^-53

// Higham's gamma_n = n u / (1 - n u): the relative error bound of n roundings.
double gamma(double n) { return n * kUnit / (1 - n * kUnit); }

// ||a - b||_2 / ||b||_2 over O, with NaN/Inf positions required to agree.
double normwise(const AttentionRows& a, const AttentionRows& b) {
  double error = 0, norm = 0;
  for (std::size_t i = 0; i < b.o.size(); ++i) {
    if (!std::isfinite(b.o[i])) {
      RC_ASSERT(std::isnan(a.o[i]) == std::isnan(b.o[i]));
      continue;
    }
    error += (a.o[i] - b.o[i]) * (a.o[i] - b.o[i]);
    norm += b.o[i] * b.o[i];
  }
  return norm > 0 ? std::sqrt(error / norm) : std::sqrt(error);
}

std::string decade(double x) {
  return x == 0 ? "error 0" : "error 1e" + std::to_string(static_cast<int>(std::floor(std::log10(x))));
}

// cpu_f64 (two-pass, BLAS) and kokkos<double> (online softmax, tiles) share no
// code; on the same inputs they must agree to f64 rounding. 1e-12 normwise
// leaves room for the condition of the weighted sums on generated data (see the
// MPFR property for the derived bound); a shared bug or a mask misread by one
// of them shows up as O(1e-3) or worse.
FLASHCHECK_PROP_IF(kokkos_available(), "Kokkos not built: install libtrilinos-kokkos-dev", Triangulation,
                   CpuF64AgreesWithKokkosToOneInATrillion, ()) {
  const Problem p = *gen_problem({.score_mods = true, .paged = true});
  RC_CLASSIFY(true, to_string(p.mask));
  RC_CLASSIFY(true, to_string(p.values.family));
  const Inputs in = generate_inputs(p);
  const RowSet rows = all_rows(p);
  const AttentionRows a = cpu_f64_reference(p, in, rows);
  const KokkosTiling tiling{*rc::gen::inRange<std::int64_t>(1, 33), *rc::gen::element<std::int64_t>(1, 7, 16, 64)};
  const AttentionRows b = kokkos_reference(p, in, rows, Accumulation::f64, tiling);
  const double error = normwise(b, a);
  RC_CLASSIFY(true, decade(error));
  RC_ASSERT(error <= 1e-12);
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isnan(a.lse[i]) || std::isinf(a.lse[i])) {
      RC_ASSERT(std::isnan(a.lse[i]) == std::isnan(b.lse[i]));
      if (!std::isnan(a.lse[i])) RC_ASSERT(a.lse[i] == b.lse[i]);
      continue;
    }
    RC_ASSERT(std::fabs(a.lse[i] - b.lse[i]) <= 1e-12 * (1 + std::fabs(a.lse[i])));
  }
}

// The same reference on the GPU (a CUDA Kokkos, kokkos_attention.hpp
// instantiated for Kokkos::Cuda): it must agree with cpu_f64 exactly as the
// Serial instantiation does, with the GPU's team sizes. SKIPPED without a CUDA
// Kokkos or a GPU (docs/kokkos-cuda.md).
FLASHCHECK_PROP_IF(kokkos_device_available(), "no CUDA Kokkos built in, or no GPU", Triangulation,
                   DeviceKokkosAgreesWithCpuF64ToOneInATrillion, ()) {
  const Problem p = *gen_problem({.score_mods = true, .paged = true});
  RC_CLASSIFY(true, to_string(p.mask));
  const Inputs in = generate_inputs(p);
  const RowSet rows = all_rows(p);
  const AttentionRows a = cpu_f64_reference(p, in, rows);
  const KokkosTiling tiling{*rc::gen::inRange<std::int64_t>(1, 65), *rc::gen::element<std::int64_t>(1, 7, 16, 32, 64),
                            *rc::gen::element<std::int64_t>(0, 32, 96)};
  const AttentionRows b = kokkos_reference(p, in, rows, Accumulation::f64, tiling, KokkosSpace::device);
  const double error = normwise(b, a);
  RC_CLASSIFY(true, decade(error));
  RC_ASSERT(error <= 1e-12);
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isnan(a.lse[i]) || std::isinf(a.lse[i])) {
      RC_ASSERT(std::isnan(a.lse[i]) == std::isnan(b.lse[i]));
      if (!std::isnan(a.lse[i])) RC_ASSERT(a.lse[i] == b.lse[i]);
      continue;
    }
    RC_ASSERT(std::fabs(a.lse[i] - b.lse[i]) <= 1e-12 * (1 + std::fabs(a.lse[i])));
  }
}

// The bound on an f64 oracle's O error against exact attention, per element,
// first order in u (Higham, Accuracy and Stability of Numerical Algorithms,
// 2nd ed., eq. 3.5 for the dot products, §4.2 for the sums), for a row with n
// visible keys:
//   logits       |ds_j| <= gamma(d+1) a_j,  a_j = scale sum_c |q_c k_jc|
//   weights      w_j = exp(s_j - m): relative error <= 2 gamma(d+1) max_j a_j
//                (a wrong max scales every weight alike and cancels) plus
//                u |s_j - m| for the subtraction and 2u for exp (1 ULP)
//   sum, numerator: gamma(n) each, relative to sum_j w_j |v_jc|
//   online softmax: each of at most n rescalings adds the same three terms once more
// so |O_c - O*_c| <= coefficient * A_c, A_c = sum_j p_j |V[j,c]|, with
//   coefficient = (n + 2) (2 gamma(d+1) max a + u max|s - m| + 2u) + 2 gamma(n) + u.
// Checked normwise: ||O - O*||_2 <= ||coefficient A||_2.
struct Bound {
  std::vector<double> o;  // per element
  std::vector<double> lse;
};

Bound derived_bound(const Problem& p, const Inputs& in, const MpfrAttention& exact) {
  Bound bound{std::vector<double>(exact.rows.o.size(), 0.0), std::vector<double>(exact.rows.lse.size(), 0.0)};
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        const std::int64_t hk = h / p.group_size(), lk = p.len_kv(b);
        double max_a = 0, max_s = -INFINITY, min_s = INFINITY, max_bias = 0;
        for (std::int64_t j = 0; j < lk; ++j) {
          double a = 0, s = 0;
          for (std::int64_t c = 0; c < p.head_dim; ++c) {
            a += std::fabs(in.q.get(b, h, i, c) * in.k.get(b, hk, j, c));
            s += in.q.get(b, h, i, c) * in.k.get(b, hk, j, c);
          }
          s *= p.softmax_scale;
          const double bias = p.alibi ? alibi_slope(p.heads_q, h) * std::fabs(static_cast<double>(i + lk - p.len_q(b) - j)) : 0;
          if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
          max_a = std::max(max_a, p.softmax_scale * a);
          max_s = std::max(max_s, s - bias);
          min_s = std::min(min_s, s - bias);
          max_bias = std::max(max_bias, bias);
        }
        const double n = static_cast<double>(lk);
        // A softcap adds s / C, tanh (1 ULP) and C tanh: 4 u |s| at most (the
        // logit's own error passes with tanh's slope <= 1); ALiBi's bias two
        // roundings (the slope, its product) and the subtraction one.
        const double modifications = (p.softcap > 0 ? 4 * kUnit * max_a : 0.0) + 3 * kUnit * max_bias;
        const double per_step =
            2 * gamma(p.head_dim + 1.0) * max_a + kUnit * (max_s - min_s) + 2 * kUnit + modifications;
        const double coefficient = (n + 2) * per_step + 2 * gamma(n) + kUnit;
        const auto row = exact.rows.index(b, h, i);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const auto at = static_cast<std::size_t>(row * p.head_dim_v + c);
          bound.o[at] = coefficient * exact.abs_weighted[at];
        }
        // LSE = m + log(l): the max's own error, log's relative error on l, and two roundings.
        bound.lse[static_cast<std::size_t>(row)] = gamma(p.head_dim + 1.0) * max_a + modifications + coefficient +
                                                   2 * kUnit * std::fabs(exact.rows.lse[row]);
      }
  return bound;
}

void check_against_mpfr(const Problem& p, const AttentionRows& got, const MpfrAttention& exact, const Bound& bound,
                        const char* oracle) {
  double error_sq = 0, bound_sq = 0, norm_sq = 0;
  for (std::size_t i = 0; i < exact.rows.o.size(); ++i) {
    const double error = got.o[i] - exact.rows.o[i];
    error_sq += error * error;
    bound_sq += bound.o[i] * bound.o[i];
    norm_sq += exact.rows.o[i] * exact.rows.o[i];
  }
  RC_CLASSIFY(true, std::string(oracle) + " " + decade(norm_sq > 0 ? std::sqrt(error_sq / norm_sq) : 0.0));
  if (std::sqrt(error_sq) > std::sqrt(bound_sq))
    RC_FAIL(std::string(oracle) + ": ||O - O_mpfr|| = " + std::to_string(std::sqrt(error_sq)) +
            " exceeds the derived bound " + std::to_string(std::sqrt(bound_sq)) + " for " + to_line(p));
  for (std::size_t r = 0; r < exact.rows.lse.size(); ++r) {
    const double want = exact.rows.lse[r];
    if (std::isinf(want)) {
      RC_ASSERT(got.lse[r] == want);
      continue;
    }
    if (std::fabs(got.lse[r] - want) > bound.lse[r])
      RC_FAIL(std::string(oracle) + ": LSE error " + std::to_string(std::fabs(got.lse[r] - want)) +
              " exceeds the derived bound " + std::to_string(bound.lse[r]) + " for " + to_line(p));
  }
}

FLASHCHECK_PROP_IF(mpfr_available(), "MPFR not built: install libmpfr-dev", Triangulation,
                   F64OraclesAreWithinTheDerivedBoundOfMpfr, ()) {
  ProblemLimits limits;
  limits.max_batch = 2;
  limits.max_heads_kv = 2;
  limits.max_group = 2;
  limits.max_seqlen = 24;
  limits.max_head_dim = 32;
  limits.allow_special_values = false;
  limits.score_mods = true;
  limits.paged = true;
  Problem p = *gen_problem(limits);
  RC_CLASSIFY(true, to_string(p.mask));
  RC_CLASSIFY(p.page_size > 0, "paged");
  const Inputs in = generate_inputs(p);
  const MpfrAttention exact = mpfr_attention(p, in);  // through the page table, as the oracles read
  const Bound bound = derived_bound(p, logical_inputs(p, in), exact);
  check_against_mpfr(p, cpu_f64_reference(p, in, all_rows(p)), exact, bound, "cpu_f64");
  if (kokkos_available())
    check_against_mpfr(p, kokkos_reference(p, in, all_rows(p), Accumulation::f64), exact, bound, "kokkos_f64");
}

}  // namespace
}  // namespace flashcheck
