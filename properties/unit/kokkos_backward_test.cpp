// The Kokkos gradient reference (FlashAttention-2's Algorithm 2 in f64)
// against cpu_f64_gradients, element by element: the triangulation that
// guards the gradient oracle. The two share no code (cpu_f64: whole rows with
// BLAS, D_i = sum_j P_ij dP_ij; Kokkos: P recomputed from its own forward's
// LSE per key block, D_i = rowsum(dO_i o O_i), dK/dV per key block and dQ in a
// second pass); both are f64, so each lies within the derived bound of
// gradient_bounds.hpp of the exact gradients, and they lie within the sum of
// the two bounds of each other (a few hundred roundings of the magnitudes
// involved; the bound is derived from the sums' lengths, not picked).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cpu_f64_backward.hpp"
#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/oracles/kokkos/kokkos_backward.hpp"
#include "properties/unit/gradient_bounds.hpp"

namespace flashcheck {
namespace {

using namespace testing_bounds;

Problem shaped(std::int64_t b, std::int64_t hq, std::int64_t hkv, std::int64_t sq, std::int64_t skv, std::int64_t d,
               MaskKind mask, std::uint64_t seed, DType dtype = DType::bf16) {
  Problem p = make_problem(b, hq, hkv, sq, skv, d, dtype, mask);
  p.pass = Pass::bwd;
  p.data_seed = seed;
  return p;
}

// The problems of the triangulation: every mask, GQA and MQA, varlen with an
// empty sequence, both layouts, dv != d, causal with seqlen_q != seqlen_kv
// both ways, fully masked rows (causal_br with more queries than keys), keys
// past several key blocks.
std::vector<Problem> triangulation_problems() {
  std::vector<Problem> problems;
  problems.push_back(shaped(2, 2, 2, 37, 29, 16, MaskKind::none, 1));
  problems.push_back(shaped(1, 4, 2, 70, 70, 32, MaskKind::causal_tl, 2));
  Problem br_longer_keys = shaped(1, 2, 1, 50, 90, 24, MaskKind::causal_br, 3, DType::f32);
  br_longer_keys.head_dim_v = 40;
  problems.push_back(br_longer_keys);
  problems.push_back(shaped(1, 3, 1, 60, 40, 16, MaskKind::causal_br, 4, DType::f16));  // rows 0..19 fully masked
  problems.push_back(shaped(2, 2, 1, 45, 30, 8, MaskKind::causal_tl, 5));
  Problem window = shaped(1, 4, 2, 41, 53, 16, MaskKind::window, 6);
  window.window_left = 5;
  window.window_right = 2;
  problems.push_back(window);
  Problem right_only = shaped(1, 2, 2, 33, 33, 16, MaskKind::window, 7);
  right_only.window_right = 0;  // left unbounded: causal written as a window
  problems.push_back(right_only);
  Problem varlen = shaped(3, 4, 2, 40, 33, 8, MaskKind::causal_br, 8);
  varlen.lens_q = {40, 0, 17};
  varlen.lens_kv = {21, 9, 33};
  varlen.layout = Layout::bshd;
  problems.push_back(varlen);
  Problem varlen_window = shaped(2, 2, 1, 30, 50, 16, MaskKind::window, 9);
  varlen_window.lens_q = {30, 12};
  varlen_window.lens_kv = {50, 7};
  varlen_window.window_left = 3;
  varlen_window.window_right = 4;
  problems.push_back(varlen_window);
  Problem wide = shaped(1, 2, 1, 20, 300, 24, MaskKind::none, 10);  // keys past many key blocks
  wide.layout = Layout::bshd;
  wide.head_dim_v = 12;
  problems.push_back(wide);
  Problem tall = shaped(1, 1, 1, 300, 40, 8, MaskKind::causal_tl, 11);  // queries past many row tiles
  problems.push_back(tall);
  Problem capped = shaped(2, 4, 2, 45, 70, 16, MaskKind::causal_br, 12);  // the serving vocabulary
  capped.softcap = 5;
  capped.alibi = true;
  capped.softmax_scale = 0.75;
  capped.lens_q = {45, 20};
  capped.lens_kv = {70, 33};
  problems.push_back(capped);
  Problem squeezed = shaped(1, 3, 1, 37, 29, 8, MaskKind::window, 13);
  squeezed.softcap = 0.5;
  squeezed.window_left = 6;
  squeezed.window_right = 2;
  problems.push_back(squeezed);
  for (const Problem& p : problems) validate(p);
  return problems;
}

// The tilings each problem runs with: the default (Br 64, Bc 32), tiles that
// divide nothing, and one row by one key.
const KokkosTiling kTilings[] = {{}, {7, 5}, {16, 64}, {1, 1}};

void expect_within(const char* name, const Agreement& agreement) {
  EXPECT_GT(agreement.compared, 0) << name << ": nothing compared";
  EXPECT_GT(agreement.largest, 0) << name << ": every element is 0 (a vacuous comparison)";
  EXPECT_EQ(agreement.exceeded, 0) << name << ": " << agreement.exceeded << " of " << agreement.compared
                                   << " elements outside the derived bound (worst ratio " << agreement.worst_ratio
                                   << "); first " << agreement.first_failure;
}

TEST(KokkosGradients, AgreeWithCpuF64ElementByElementWithinTheDerivedBound) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  std::int64_t compared = 0;
  for (const Problem& p : triangulation_problems()) {
    SCOPED_TRACE(to_line(p));
    const Inputs in = generate_inputs(p);
    const HostTensor dout = generate_dout(p);
    const GradientRows want = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
    const GradientRows bound = sum_of(gradient_error_bound(p, in, dout, SoftmaxOrder::two_pass),
                                      gradient_error_bound(p, in, dout, SoftmaxOrder::online_with_lse));
    for (const KokkosTiling& tiling : kTilings) {
      SCOPED_TRACE("tiling Br " + std::to_string(tiling.rows_per_team) + " Bc " + std::to_string(tiling.key_tile));
      const GradientRows got = kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), tiling);
      const Agreement dq = agree(got.dq, want.dq, bound.dq), dk = agree(got.dk, want.dk, bound.dk),
                      dv = agree(got.dv, want.dv, bound.dv);
      expect_within("dQ", dq);
      expect_within("dK", dk);
      expect_within("dV", dv);
      compared += dq.compared + dk.compared + dv.compared;
    }
  }
  EXPECT_GT(compared, 100000);
}

// Fully masked query rows (causal_br with 60 queries and 40 keys: rows 0..19
// see no key) and padding rows get dQ = 0 exactly and add nothing to dK/dV;
// a key no query sees (causal_tl with more keys than queries) gets dK = dV = 0.
TEST(KokkosGradients, FullyMaskedRowsAndUnseenKeysAreZero) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const Problem masked = shaped(1, 2, 1, 60, 40, 16, MaskKind::causal_br, 21);
  const Inputs in = generate_inputs(masked);
  const HostTensor dout = generate_dout(masked);
  const GradientRows got = kokkos_gradients(masked, in, dout, all_rows(masked), all_key_rows(masked));
  double elsewhere = 0;
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < 60; ++i)
      for (std::int64_t c = 0; c < 16; ++c) {
        if (i < 20) EXPECT_EQ(got.dq_row(0, h, i)[c], 0.0) << "fully masked row " << i;
        else elsewhere = std::max(elsewhere, std::fabs(got.dq_row(0, h, i)[c]));
      }
  EXPECT_GT(elsewhere, 0);

  const Problem unseen = shaped(1, 2, 2, 20, 50, 8, MaskKind::causal_tl, 22);
  const Inputs in2 = generate_inputs(unseen);
  const HostTensor dout2 = generate_dout(unseen);
  const GradientRows keys = kokkos_gradients(unseen, in2, dout2, all_rows(unseen), all_key_rows(unseen), {8, 8});
  double seen = 0;
  for (std::int64_t hk = 0; hk < 2; ++hk)
    for (std::int64_t j = 0; j < 50; ++j)
      for (std::int64_t c = 0; c < 8; ++c) {
        if (j >= 20) {
          EXPECT_EQ(keys.dk_row(0, hk, j)[c], 0.0) << "key " << j;
          EXPECT_EQ(keys.dv_row(0, hk, j)[c], 0.0) << "key " << j;
        } else {
          seen = std::max(seen, std::fabs(keys.dv_row(0, hk, j)[c]));
        }
      }
  EXPECT_GT(seen, 0);
}

// Sampled rows: dQ on a set of query rows, dK/dV on a set of key rows, equal
// to the every-row result at those rows (each row's sums run in the same
// order whatever else is computed), and within the bound of cpu_f64's.
TEST(KokkosGradients, SampledRowsAreTheEveryRowResultAtThoseRows) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  Problem p = shaped(2, 4, 2, 150, 170, 16, MaskKind::causal_br, 31);
  p.lens_q = {150, 61};
  p.lens_kv = {170, 90};
  validate(p);
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const RowSet q_rows = sample_rows(p, 20, 5), kv_rows = sample_key_rows(p, 20, 6);
  ASSERT_LT(q_rows.size(), p.seqlen_q);
  ASSERT_LT(kv_rows.size(), p.seqlen_kv);
  const GradientRows every = kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p));
  const GradientRows sampled = kokkos_gradients(p, in, dout, q_rows, kv_rows);
  const GradientRows cpu = cpu_f64_gradients(p, in, dout, q_rows, kv_rows);
  const GradientRows bound = sum_of(gradient_error_bound(p, in, dout, SoftmaxOrder::two_pass),
                                    gradient_error_bound(p, in, dout, SoftmaxOrder::online_with_lse));
  std::int64_t compared = 0;
  std::vector<double> got, want, limit;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < q_rows.size(); ++r)
        for (std::int64_t c = 0; c < p.head_dim; ++c) {
          const double value = sampled.dq_row(b, h, r)[c];
          EXPECT_EQ(value, every.dq_row(b, h, q_rows.rows[r])[c]);
          got.push_back(value);
          want.push_back(cpu.dq_row(b, h, r)[c]);
          limit.push_back(bound.dq_row(b, h, q_rows.rows[r])[c]);
        }
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t r = 0; r < kv_rows.size(); ++r) {
        for (std::int64_t c = 0; c < p.head_dim; ++c) {
          EXPECT_EQ(sampled.dk_row(b, hk, r)[c], every.dk_row(b, hk, kv_rows.rows[r])[c]);
          got.push_back(sampled.dk_row(b, hk, r)[c]);
          want.push_back(cpu.dk_row(b, hk, r)[c]);
          limit.push_back(bound.dk_row(b, hk, kv_rows.rows[r])[c]);
        }
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          EXPECT_EQ(sampled.dv_row(b, hk, r)[c], every.dv_row(b, hk, kv_rows.rows[r])[c]);
          got.push_back(sampled.dv_row(b, hk, r)[c]);
          want.push_back(cpu.dv_row(b, hk, r)[c]);
          limit.push_back(bound.dv_row(b, hk, kv_rows.rows[r])[c]);
        }
      }
  }
  const Agreement agreement = agree(got, want, limit);
  expect_within("sampled rows", agreement);
  compared += agreement.compared;
  EXPECT_GT(compared, 1000);
}

// No atomics: the same inputs give the same bits, run after run.
TEST(KokkosGradients, AreBitwiseRepeatable) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const Problem p = shaped(1, 4, 2, 90, 110, 32, MaskKind::causal_br, 41);
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const GradientRows first = kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p));
  for (int run = 0; run < 3; ++run) {
    const GradientRows again = kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p));
    EXPECT_EQ(again.dq, first.dq);
    EXPECT_EQ(again.dk, first.dk);
    EXPECT_EQ(again.dv, first.dv);
  }
}

TEST(KokkosGradients, RefuseATilingOutOfRange) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const Problem p = shaped(1, 1, 1, 8, 8, 8, MaskKind::none, 51);
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  EXPECT_THROW(kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), {0, 32}), std::invalid_argument);
  EXPECT_THROW(kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), {64, 2048}), std::invalid_argument);
  EXPECT_THROW(kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), {}, KokkosSpace::host, true, 0),
               std::invalid_argument);
  EXPECT_THROW(kokkos_gradient_baseline(p, in, dout, all_rows(p), all_key_rows(p), p.dtype, KokkosSpace::host, 0),
               std::invalid_argument);
}

// Non-finite inputs (NaN, +-Inf injected into Q, K, V and dO): the two
// oracles agree on which gradient elements are finite. They need not agree on
// NaN against Inf: D_i is rowsum(dO_i o O_i) here and sum_j P_ij dP_ij in
// cpu_f64, equal for finite values only (an Inf in dO gives one D = +-Inf
// here and +Inf - Inf = NaN there when the row's dP_ij take both signs); of
// 600 such cases (p = 0.002) 97 had elements NaN in cpu_f64 and +-Inf here,
// none the other way and none finite in one and not the other.
TEST(KokkosGradients, AgreeWithCpuF64OnWhichElementsAreFinite) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  std::int64_t finite = 0, nonfinite = 0;
  for (std::uint64_t seed = 1; seed <= 20; ++seed)
    for (MaskKind mask : {MaskKind::none, MaskKind::causal_br, MaskKind::window}) {
      Problem p = shaped(2, 4, 2, 33, 45, 8, mask, seed);
      if (mask == MaskKind::window) p.window_left = 4, p.window_right = 3;
      p.values = ValueDist{ValueFamily::nan_inf, {0.002}};
      if (seed % 2) p.dout = ValueDist{ValueFamily::nan_inf, {0.002}};
      validate(p);
      SCOPED_TRACE(to_line(p));
      const Inputs in = generate_inputs(p);
      const HostTensor dout = generate_dout(p);
      const GradientRows want = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
      const GradientRows got = kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), {7, 5});
      const std::pair<const std::vector<double>*, const std::vector<double>*> pairs[] = {
          {&got.dq, &want.dq}, {&got.dk, &want.dk}, {&got.dv, &want.dv}};
      for (const auto& [mine, theirs] : pairs)
        for (std::size_t n = 0; n < theirs->size(); ++n) {
          EXPECT_EQ(std::isfinite((*mine)[n]), std::isfinite((*theirs)[n]))
              << "element " << n << ": kokkos " << (*mine)[n] << ", cpu_f64 " << (*theirs)[n];
          (std::isfinite((*theirs)[n]) ? finite : nonfinite) += 1;
        }
    }
  EXPECT_GT(finite, 0);
  EXPECT_GT(nonfinite, 0) << "no non-finite gradient: the injection did not reach the gradients";
}

// The same kernels on the GPU (a CUDA Kokkos): within the derived bound of
// cpu_f64 on a mid-size case, every row. SKIPPED without a CUDA Kokkos or a GPU.
TEST(KokkosGradients, DeviceAgreesWithCpuF64OnEveryRow) {
  if (!kokkos_device_available()) GTEST_SKIP() << "no CUDA Kokkos built in, or no GPU";
  const Problem p = shaped(1, 4, 2, 1024, 1024, 128, MaskKind::causal_br, 61);
  const Inputs in = generate_inputs(p);
  const HostTensor dout = generate_dout(p);
  const GradientRows device = kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), {}, KokkosSpace::device);
  const GradientRows want = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
  const GradientRows bound = sum_of(gradient_error_bound(p, in, dout, SoftmaxOrder::two_pass),
                                    gradient_error_bound(p, in, dout, SoftmaxOrder::online_with_lse));
  expect_within("dQ", agree(device.dq, want.dq, bound.dq));
  expect_within("dK", agree(device.dk, want.dk, bound.dk));
  expect_within("dV", agree(device.dv, want.dv, bound.dv));
  const GradientRows again = kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), {}, KokkosSpace::device);
  EXPECT_EQ(again.dq, device.dq) << "the device run is not bitwise repeatable";
  EXPECT_EQ(again.dk, device.dk);
  EXPECT_EQ(again.dv, device.dv);
}

// The device kernels on every problem of the triangulation, with tiles that
// divide nothing and teams of 32 and 96 threads, within the bound of cpu_f64
// (not bitwise the host's: the GPU's FMAs and exp differ). Small enough for
// compute-sanitizer's racecheck and memcheck.
// SKIPPED without a CUDA Kokkos or a GPU.
TEST(KokkosGradients, DeviceAgreesWithCpuF64OnTheTriangulationProblems) {
  if (!kokkos_device_available()) GTEST_SKIP() << "no CUDA Kokkos built in, or no GPU";
  for (const Problem& p : triangulation_problems()) {
    SCOPED_TRACE(to_line(p));
    const Inputs in = generate_inputs(p);
    const HostTensor dout = generate_dout(p);
    const GradientRows want = cpu_f64_gradients(p, in, dout, all_rows(p), all_key_rows(p));
    const GradientRows bound = sum_of(gradient_error_bound(p, in, dout, SoftmaxOrder::two_pass),
                                      gradient_error_bound(p, in, dout, SoftmaxOrder::online_with_lse));
    for (const KokkosTiling& tiling : {KokkosTiling{}, KokkosTiling{7, 5, 32}, KokkosTiling{16, 64, 96}}) {
      SCOPED_TRACE("tiling Br " + std::to_string(tiling.rows_per_team) + " Bc " + std::to_string(tiling.key_tile) +
                   " team " + std::to_string(tiling.team_size));
      const GradientRows got =
          kokkos_gradients(p, in, dout, all_rows(p), all_key_rows(p), tiling, KokkosSpace::device);
      expect_within("dQ", agree(got.dq, want.dq, bound.dq));
      expect_within("dK", agree(got.dk, want.dk, bound.dk));
      expect_within("dV", agree(got.dv, want.dv, bound.dv));
    }
  }
}

// The conditioning of the gradients (GradientRows::dq_terms_max and the rest,
// the scales of the tolerance's gradient floor) as the Kokkos kernels record
// it is cpu_f64_gradients' on every row and on sampled rows: the same sums of
// non-negative terms, P from the Kokkos forward's LSE where cpu_f64 divides by
// the row's sum (a relative difference of a few f64 roundings per term).
TEST(KokkosGradients, RecordTheConditioningCpuF64Records) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  const auto expect_same = [](const char* name, double got, double want) {
    EXPECT_GT(want, 0) << name << ": nothing recorded (a vacuous comparison)";
    EXPECT_LE(std::fabs(got - want), 1e-10 * want) << name << ": got " << got << ", cpu_f64 " << want;
  };
  std::vector<Problem> problems = triangulation_problems();
  Problem sampled = shaped(2, 4, 2, 150, 170, 16, MaskKind::causal_br, 31);
  sampled.lens_q = {150, 61};
  sampled.lens_kv = {170, 90};
  problems.push_back(sampled);
  for (const Problem& p : problems) {
    SCOPED_TRACE(to_line(p));
    const Inputs in = generate_inputs(p);
    const HostTensor dout = generate_dout(p);
    const bool every = p.seqlen_q < 150;
    const RowSet q_rows = every ? all_rows(p) : sample_rows(p, 20, 5);
    const RowSet kv_rows = every ? all_key_rows(p) : sample_key_rows(p, 20, 6);
    const GradientRows want = cpu_f64_gradients(p, in, dout, q_rows, kv_rows);
    const GradientRows got = kokkos_gradients(p, in, dout, q_rows, kv_rows, {}, KokkosSpace::host, true);
    expect_same("dq_terms_max", got.dq_terms_max, want.dq_terms_max);
    expect_same("dq_logit_terms_max", got.dq_logit_terms_max, want.dq_logit_terms_max);
    expect_same("dk_terms_max", got.dk_terms_max, want.dk_terms_max);
    expect_same("dk_logit_terms_max", got.dk_logit_terms_max, want.dk_logit_terms_max);
    expect_same("dv_terms_max", got.dv_terms_max, want.dv_terms_max);
    expect_same("dv_logit_terms_max", got.dv_logit_terms_max, want.dv_logit_terms_max);
    expect_same("key_weight_max", got.key_weight_max, want.key_weight_max);
    // The rows in chunks of one to a few (a pair budget of 64): the same sums in the same order.
    const GradientRows chunked = kokkos_gradients(p, in, dout, q_rows, kv_rows, {}, KokkosSpace::host, true, 64);
    EXPECT_EQ(chunked.dq_terms_max, got.dq_terms_max);
    EXPECT_EQ(chunked.dq_logit_terms_max, got.dq_logit_terms_max);
    EXPECT_EQ(chunked.dk_logit_terms_max, got.dk_logit_terms_max);
    EXPECT_EQ(chunked.dv_logit_terms_max, got.dv_logit_terms_max);
    // Without the flag nothing is recorded, and the gradients are the same bits.
    const GradientRows plain = kokkos_gradients(p, in, dout, q_rows, kv_rows);
    EXPECT_EQ(plain.dq_terms_max, 0.0);
    EXPECT_EQ(plain.dq, got.dq);
    EXPECT_EQ(plain.dk, got.dk);
    EXPECT_EQ(plain.dv, got.dv);
  }
}

// The Kokkos gradient baseline takes cpu_lowp_gradients' steps in the same
// order (f32 sums never fused, a rounding to the working dtype after each
// step): on the host the two give the same values, in every working dtype,
// on every row and on sampled rows. On a GPU the same kernels let a backward
// case's baseline cover every row.
TEST(KokkosGradientBaseline, IsCpuLowpGradientsOnTheHost) {
  if (!kokkos_available()) GTEST_SKIP() << "Kokkos not built";
  std::int64_t compared = 0, nonzero = 0;
  for (const Problem& base : triangulation_problems())
    for (const DType working : {DType::bf16, DType::f16, DType::f32}) {
      Problem p = base;
      p.dtype = working;
      SCOPED_TRACE(to_line(p));
      const Inputs in = generate_inputs(p);
      const HostTensor dout = generate_dout(p);
      const bool sample = p.seqlen_q >= 60;
      const RowSet q_rows = sample ? sample_rows(p, 9, 3) : all_rows(p);
      const RowSet kv_rows = sample ? sample_key_rows(p, 9, 4) : all_key_rows(p);
      const GradientRows want = cpu_lowp_gradients(p, in, dout, q_rows, kv_rows, working);
      const GradientRows got = kokkos_gradient_baseline(p, in, dout, q_rows, kv_rows, working);
      // The rows in chunks of one to a few (a pair budget of 64): the same bits.
      const GradientRows chunked = kokkos_gradient_baseline(p, in, dout, q_rows, kv_rows, working, KokkosSpace::host, 64);
      EXPECT_EQ(chunked.dq, want.dq);
      EXPECT_EQ(chunked.dk, want.dk);
      EXPECT_EQ(chunked.dv, want.dv);
      for (const auto& [a, b] : {std::pair{&got.dq, &want.dq}, {&got.dk, &want.dk}, {&got.dv, &want.dv}}) {
        ASSERT_EQ(a->size(), b->size());
        for (std::size_t n = 0; n < a->size(); ++n) {
          EXPECT_EQ((*a)[n], (*b)[n]) << "element " << n;
          nonzero += (*b)[n] != 0;
        }
        compared += static_cast<std::int64_t>(a->size());
      }
    }
  EXPECT_GT(compared, 10000);
  EXPECT_GT(nonzero, compared / 2);
}

}  // namespace
}  // namespace flashcheck
