// The gradient oracles' own accuracy: cpu_f64_gradients (and the Kokkos
// Algorithm-2 reference, where Kokkos is built) against the gradients at 256
// bits (mpfr_gradients), element by element, on small cases: each mask, GQA,
// varlen with an empty sequence, fully masked rows, bshd and dv != d. Each f64
// oracle must lie within its own derived bound of the exact gradients
// (gradient_bounds.hpp: first order in u, from the sums' lengths), and the
// bound must be small enough to mean something: its largest element below
// 1e-11 of the largest gradient (a few thousand roundings at most; a wrong
// mask, scale or D gives errors of order 1e-3 and more).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cpu_f64_backward.hpp"
#include "flashcheck/oracles/kokkos/kokkos_backward.hpp"
#include "properties/mpfr_reference.hpp"
#include "properties/unit/gradient_bounds.hpp"

namespace flashcheck {
namespace {

using namespace testing_bounds;

std::vector<Problem> small_problems() {
  std::vector<Problem> problems;
  auto add = [&](Problem p) {
    p.pass = Pass::bwd;
    validate(p);
    problems.push_back(p);
  };
  Problem none = make_problem(2, 2, 2, 13, 11, 16, DType::bf16, MaskKind::none);
  none.data_seed = 1;
  add(none);
  Problem gqa = make_problem(1, 4, 2, 17, 17, 8, DType::f32, MaskKind::causal_tl);  // GQA: groups of 2
  gqa.data_seed = 2;
  add(gqa);
  Problem masked = make_problem(1, 3, 1, 20, 12, 8, DType::f16, MaskKind::causal_br);  // MQA; rows 0..7 fully masked
  masked.data_seed = 3;
  masked.head_dim_v = 12;
  masked.layout = Layout::bshd;
  add(masked);
  Problem window = make_problem(1, 2, 1, 15, 19, 8, DType::bf16, MaskKind::window);
  window.window_left = 3;
  window.window_right = 1;
  window.data_seed = 4;
  add(window);
  Problem varlen = make_problem(3, 4, 2, 14, 16, 8, DType::bf16, MaskKind::causal_br);
  varlen.lens_q = {14, 0, 6};
  varlen.lens_kv = {9, 5, 16};
  varlen.data_seed = 5;
  add(varlen);
  Problem capped = make_problem(1, 4, 2, 12, 15, 8, DType::bf16, MaskKind::causal_br);  // the serving vocabulary
  capped.softcap = 1;
  capped.alibi = true;
  capped.softmax_scale = 1.5;  // logits past the cap
  capped.data_seed = 6;
  add(capped);
  Problem alibi = make_problem(2, 3, 3, 11, 9, 8, DType::f16, MaskKind::none);
  alibi.alibi = true;
  alibi.lens_q = {11, 4};
  alibi.lens_kv = {9, 7};
  alibi.data_seed = 7;
  add(alibi);
  return problems;
}

void expect_within(const std::string& name, const Agreement& agreement) {
  EXPECT_GT(agreement.compared, 0) << name << ": nothing compared";
  EXPECT_GT(agreement.largest, 0) << name << ": every element is 0 (a vacuous comparison)";
  EXPECT_LT(agreement.largest_bound, 1e-11 * agreement.largest) << name << ": the bound is too loose to mean anything";
  EXPECT_EQ(agreement.exceeded, 0) << name << ": " << agreement.exceeded << " of " << agreement.compared
                                   << " elements outside the derived bound (worst ratio " << agreement.worst_ratio
                                   << "); first " << agreement.first_failure;
}

void check(const std::string& oracle, const GradientRows& got, const GradientRows& exact, const GradientRows& bound) {
  expect_within(oracle + " dQ", agree(got.dq, exact.dq, bound.dq));
  expect_within(oracle + " dK", agree(got.dk, exact.dk, bound.dk));
  expect_within(oracle + " dV", agree(got.dv, exact.dv, bound.dv));
}

TEST(GradientOracleAccuracy, CpuF64IsWithinTheDerivedBoundOfMpfr) {
  if (!mpfr_available()) GTEST_SKIP() << "MPFR not built: install libmpfr-dev";
  for (const Problem& p : small_problems()) {
    SCOPED_TRACE(to_line(p));
    const Inputs in = generate_inputs(p);
    const HostTensor dout = generate_dout(p);
    const GradientRows exact = mpfr_gradients(p, in, dout);
    check("cpu_f64", cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p)), exact,
          gradient_error_bound(p, in, dout, SoftmaxOrder::two_pass));
    if (kokkos_available())
      check("kokkos_f64", kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), {4, 3}), exact,
            gradient_error_bound(p, in, dout, SoftmaxOrder::online_with_lse));
  }
}

// The MPFR gradients themselves, on a case small enough to do by hand: one
// query, two keys, d = dv = 1, scale 1. With q = 1, k = (0, 1), v = (2, 4),
// dO = 1: P = (1, e) / (1 + e), O = (2 + 4e) / (1 + e), dP = v, D = O,
// dS_j = P_j (v_j - O), dQ = sum_j dS_j k_j = dS_1, dK_j = dS_j q = dS_j,
// dV_j = P_j.
TEST(GradientOracleAccuracy, MpfrGradientsOfTwoKeysByHand) {
  if (!mpfr_available()) GTEST_SKIP() << "MPFR not built: install libmpfr-dev";
  Problem p = make_problem(1, 1, 1, 1, 2, 1, DType::f32);
  p.softmax_scale = 1;
  p.pass = Pass::bwd;
  Inputs in{HostTensor(DType::f32, Layout::bhsd, 1, 1, 1, 1), HostTensor(DType::f32, Layout::bhsd, 1, 1, 2, 1),
            HostTensor(DType::f32, Layout::bhsd, 1, 1, 2, 1)};
  in.q.set(0, 0, 0, 0, 1);
  in.k.set(0, 0, 0, 0, 0);
  in.k.set(0, 0, 1, 0, 1);
  in.v.set(0, 0, 0, 0, 2);
  in.v.set(0, 0, 1, 0, 4);
  HostTensor dout(DType::f32, Layout::bhsd, 1, 1, 1, 1);
  dout.set(0, 0, 0, 0, 1);
  const double e = std::exp(1.0);
  const double p0 = 1 / (1 + e), p1 = e / (1 + e), o = 2 * p0 + 4 * p1;
  const GradientRows g = mpfr_gradients(p, in, dout);
  EXPECT_NEAR(g.dq[0], p1 * (4 - o), 1e-15);
  EXPECT_NEAR(g.dk[0], p0 * (2 - o), 1e-15);
  EXPECT_NEAR(g.dk[1], p1 * (4 - o), 1e-15);
  EXPECT_NEAR(g.dv[0], p0, 1e-15);
  EXPECT_NEAR(g.dv[1], p1, 1e-15);
}

}  // namespace
}  // namespace flashcheck
