// Error metrics (core/metrics), the tolerance rule (core/tolerance) and JSON
// Lines records (core/record), on tiny hand-built problems whose every error is
// chosen by the test (errors are multiples of powers of two, so got - want is exact).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashcheck/core/dtype.hpp"
#include "flashcheck/core/metrics.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/random.hpp"
#include "flashcheck/core/record.hpp"
#include "flashcheck/core/tensor.hpp"
#include "flashcheck/core/tolerance.hpp"

namespace flashcheck {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// Subject and reference rows of one problem, every row present, both with LSE.
struct RowsPair {
  Problem problem;
  AttentionRows got, want;
  explicit RowsPair(Problem p)
      : problem(std::move(p)), got(problem, all_rows(problem)), want(problem, all_rows(problem)) {}

  // Element (b, h, row, column) of O; rows are all rows, so row index == position.
  double& got_o(std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t c) { return got.o_row(b, h, row)[c]; }
  double& want_o(std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t c) { return want.o_row(b, h, row)[c]; }
  // Sets want everywhere to `value` and got = want (+0 error), LSE to `lse` in both.
  void fill(double value, double lse = 1.0) {
    std::fill(want.o.begin(), want.o.end(), value);
    got.o = want.o;
    std::fill(want.lse.begin(), want.lse.end(), lse);
    got.lse = want.lse;
  }
  // Sets got = want + error for the flat O element `i` (storage order of AttentionRows).
  void set_error(std::size_t i, double error) { got.o[i] = want.o[i] + error; }
  CaseMetrics compare(DType dtype, const Bounds& bounds = {}) const {
    return flashcheck::compare(problem, got, want, dtype, bounds);
  }
};

std::string where(const Position& at) {
  return "(b=" + std::to_string(at.b) + ", h=" + std::to_string(at.h) + ", row=" + std::to_string(at.row) +
         ", col=" + std::to_string(at.column) + ")";
}

void expect_position(const Position& at, std::int64_t b, std::int64_t h, std::int64_t row, std::int64_t column) {
  EXPECT_EQ(at.b, b) << where(at);
  EXPECT_EQ(at.h, h) << where(at);
  EXPECT_EQ(at.row, row) << where(at);
  EXPECT_EQ(at.column, column) << where(at);
}

// ---- compare(): error statistics -----------------------------------------------

TEST(MetricsTest, MaxAbsAndItsPosition) {
  RowsPair rows(make_problem(2, 2, 1, 4, 4, 8, DType::bf16));
  rows.fill(1.5);
  rows.got_o(0, 0, 0, 0) += 0x1p-10;
  rows.got_o(1, 1, 2, 5) -= 3 * 0x1p-10;  // the worst, negative
  rows.got_o(1, 0, 3, 7) += 2 * 0x1p-10;
  const CaseMetrics m = rows.compare(DType::bf16);
  const ErrorStats& e = m.o.errors;
  EXPECT_EQ(e.count, 2 * 2 * 4 * 8);
  EXPECT_EQ(e.max_abs, 3 * 0x1p-10);
  ASSERT_TRUE(e.worst.has_value());
  expect_position(e.worst->at, 1, 1, 2, 5);
  EXPECT_EQ(e.worst->got, 1.5 - 3 * 0x1p-10);
  EXPECT_EQ(e.worst->want, 1.5);
  EXPECT_EQ(e.worst->abs_error, 3 * 0x1p-10);
  EXPECT_EQ(e.ref_max_abs, 1.5);
  EXPECT_EQ(m.rows_compared, 2 * 2 * 4);
  EXPECT_EQ(m.o.census.mismatches, 0);
}

// Rows with two errors under a bound of 2^-9 and one over it (2^-8, at the
// reference's largest magnitude, -6), and a NaN where the reference is finite.
RowsPair rows_with_errors() {
  RowsPair rows(make_problem(2, 2, 1, 4, 4, 8, DType::bf16));
  rows.fill(1.5);
  rows.want_o(0, 1, 1, 3) = -6.0;
  rows.got_o(0, 1, 1, 3) = -6.0 + 0x1p-8;
  rows.got_o(1, 1, 2, 5) -= 3 * 0x1p-10;
  rows.got_o(1, 0, 3, 7) = kNan;  // a census mismatch
  return rows;
}

// The rule's depth keeps what rule_bounds reads, and the census, the worst
// element and the count over a bound, exactly as the full comparison has them.
TEST(MetricsTest, TheExtremesDepthKeepsWhatTheRuleReads) {
  RowsPair rows = rows_with_errors();
  const Bounds bounds{0x1p-9, std::nullopt};
  const CaseMetrics full = rows.compare(DType::bf16, bounds);
  const CaseMetrics lean = flashcheck::compare(rows.problem, rows.got, rows.want, DType::bf16, bounds,
                                               MetricDepth::extremes);
  EXPECT_EQ(lean.o.errors.max_abs, full.o.errors.max_abs);
  EXPECT_EQ(lean.o.errors.max_abs, 0x1p-8);
  EXPECT_EQ(lean.o.errors.ref_max_abs, 6.0);
  EXPECT_EQ(lean.o.errors.count, full.o.errors.count);
  EXPECT_EQ(lean.o.errors.worst, full.o.errors.worst);
  EXPECT_EQ(lean.o.census.mismatches, 1);  // (== on Census is false: its first mismatch holds a NaN)
  EXPECT_EQ(lean.o.census.got_nan, full.o.census.got_nan);
  ASSERT_TRUE(lean.o.census.first_mismatch.has_value());
  EXPECT_EQ(lean.o.census.first_mismatch->at, full.o.census.first_mismatch->at);
  EXPECT_EQ(lean.o.over_bound, 2);
  EXPECT_EQ(lean.o.first_over_bound, full.o.first_over_bound);
  EXPECT_EQ(lean.lse.errors.ref_max_abs, full.lse.errors.ref_max_abs);
  EXPECT_EQ(lean.rows_compared, full.rows_compared);
  // The rule's bounds from either are the same numbers.
  const LogitCondition none;
  EXPECT_EQ(*rule_bounds(lean, DType::bf16, none).o, *rule_bounds(full, DType::bf16, none).o);
  EXPECT_EQ(*rule_bounds(lean, DType::bf16, none).lse, *rule_bounds(full, DType::bf16, none).lse);
  // What it skips stays 0 (full has them).
  EXPECT_GT(full.o.errors.rmse, 0.0);
  EXPECT_EQ(lean.o.errors.rmse, 0.0);
  EXPECT_EQ(lean.o.errors.p999, 0.0);
  EXPECT_EQ(lean.o.errors.max_ulp, 0.0);
}

// The rule depth (the properties' judgement) keeps every statistic that the
// verdict reads, bit for bit, and leaves the distributions at 0.
TEST(MetricsTest, TheRuleDepthKeepsWhatTheVerdictReads) {
  RowsPair rows = rows_with_errors();
  rows.got_o(0, 0, 0, 0) += 0x1p-7;  // a second element over the bound
  const Bounds bounds{0x1p-9, std::nullopt};
  const CaseMetrics full = rows.compare(DType::bf16, bounds);
  const CaseMetrics rule =
      flashcheck::compare(rows.problem, rows.got, rows.want, DType::bf16, bounds, MetricDepth::rule);
  for (const auto* pair : {&full.o, &full.lse}) {
    const TensorMetrics& f = *pair;
    const TensorMetrics& r = pair == &full.o ? rule.o : rule.lse;
    EXPECT_EQ(r.errors.count, f.errors.count);
    for (double ErrorStats::*kept :
         {&ErrorStats::max_abs, &ErrorStats::ref_max_abs, &ErrorStats::rmse, &ErrorStats::ref_rms,
          &ErrorStats::normwise_rel, &ErrorStats::mean_signed, &ErrorStats::rounding_mean, &ErrorStats::tie_slack,
          &ErrorStats::bias_t, &ErrorStats::mean_magnitude, &ErrorStats::magnitude_t})
      EXPECT_EQ(r.errors.*kept, f.errors.*kept);
    EXPECT_EQ(r.errors.worst, f.errors.worst);
    EXPECT_EQ(r.over_bound, f.over_bound);
    EXPECT_EQ(r.census.mismatches, f.census.mismatches);
  }
  EXPECT_GT(full.o.errors.rmse, 0.0);
  EXPECT_NE(full.o.errors.mean_signed, 0.0);
  // The verdict from either is the same, check for check.
  const LogitCondition none;
  const Verdict from_full = decide(full, full, DType::bf16, none), from_rule = decide(rule, rule, DType::bf16, none);
  EXPECT_EQ(from_rule.pass, from_full.pass);
  ASSERT_EQ(from_rule.checks.size(), from_full.checks.size());
  for (std::size_t i = 0; i < from_full.checks.size(); ++i) EXPECT_EQ(from_rule.checks[i], from_full.checks[i]);
  // The distributions stay 0 (full has them).
  EXPECT_GT(full.o.errors.p999, 0.0);
  EXPECT_GT(full.o.errors.max_ulp, 0.0);
  for (double ErrorStats::*skipped : {&ErrorStats::p50, &ErrorStats::p99, &ErrorStats::p999, &ErrorStats::p99_ulp,
                                      &ErrorStats::max_ulp, &ErrorStats::max_rel})
    EXPECT_EQ(rule.o.errors.*skipped, 0.0);
  EXPECT_EQ(rule.o.errors.histogram, ErrorStats{}.histogram);
}

TEST(MetricsTest, RmseNormwiseAndMeanOnAKnownVector) {
  // One row of four: want = (1, 2, 2, 4), ||want|| = 5; errors (+-0.5) -> rmse 0.5, normwise 1/5.
  RowsPair rows(make_problem(1, 1, 1, 1, 1, 4, DType::f32));
  const std::vector<double> want = {1, 2, 2, 4}, error = {0.5, -0.5, 0.5, -0.5};
  for (int c = 0; c < 4; ++c) {
    rows.want_o(0, 0, 0, c) = want[c];
    rows.got_o(0, 0, 0, c) = want[c] + error[c];
  }
  const ErrorStats e = rows.compare(DType::f32).o.errors;
  EXPECT_EQ(e.count, 4);
  EXPECT_DOUBLE_EQ(e.rmse, 0.5);
  EXPECT_DOUBLE_EQ(e.normwise_rel, 0.2);
  EXPECT_DOUBLE_EQ(e.ref_rms, 2.5);  // sqrt(25 / 4)
  EXPECT_EQ(e.ref_max_abs, 4.0);
  EXPECT_EQ(e.mean_signed, 0.0);
  EXPECT_EQ(e.bias_t, 0.0);
  EXPECT_EQ(e.max_abs, 0.5);
  EXPECT_EQ(e.max_rel, 0.5);  // 0.5 / 1 at column 0, not max_abs / |want of the worst|
  EXPECT_EQ(e.p50, 0.5);
}

TEST(MetricsTest, MaxRelIsOverNonZeroReferences) {
  RowsPair rows(make_problem(1, 1, 1, 1, 1, 4, DType::f32));
  const std::vector<double> want = {4.0, 0.5, 0.0, 1.0}, error = {0x1p-8, 0x1p-9, 0x1p-7, 0.0};
  for (int c = 0; c < 4; ++c) {
    rows.want_o(0, 0, 0, c) = want[c];
    rows.got_o(0, 0, 0, c) = want[c] + error[c];
  }
  const ErrorStats e = rows.compare(DType::f32).o.errors;
  EXPECT_EQ(e.max_abs, 0x1p-7);                 // the element whose reference is 0
  EXPECT_EQ(e.max_rel, 0x1p-9 / 0.5);           // not 0x1p-8 / 4, and the zero reference is skipped
  expect_position(e.worst->at, 0, 0, 0, 2);
}

TEST(MetricsTest, NormwiseOfZeroReference) {
  RowsPair rows(make_problem(1, 1, 1, 1, 1, 4, DType::f32));
  rows.fill(0.0);
  EXPECT_EQ(rows.compare(DType::f32).o.errors.normwise_rel, 0.0);  // exact zeros
  rows.got_o(0, 0, 0, 1) = 0x1p-20;
  EXPECT_EQ(rows.compare(DType::f32).o.errors.normwise_rel, kInf);  // any error against a zero reference
}

TEST(MetricsTest, PercentilesAreNearestRank) {
  // 1000 errors k * 2^-20, k = 1..1000, scattered over the tensor.
  RowsPair rows(make_problem(1, 1, 1, 10, 10, 100, DType::bf16));
  rows.fill(1.0);
  ASSERT_EQ(rows.got.o.size(), 1000u);
  for (std::size_t k = 1; k <= 1000; ++k) rows.set_error((k * 37) % 1000, static_cast<double>(k) * 0x1p-20);
  const ErrorStats e = rows.compare(DType::bf16).o.errors;
  EXPECT_EQ(e.count, 1000);
  EXPECT_EQ(e.p50, 500 * 0x1p-20) << "p50 must be the 500th smallest (no interpolation)";
  EXPECT_EQ(e.p99, 990 * 0x1p-20);
  EXPECT_EQ(e.p999, 999 * 0x1p-20);
  EXPECT_EQ(e.max_abs, 1000 * 0x1p-20);

  // Ten errors: nearest rank p50 = 5th, p99 = p999 = 10th.
  RowsPair small(make_problem(1, 1, 1, 1, 1, 10, DType::bf16));
  small.fill(1.0);
  for (std::size_t k = 1; k <= 10; ++k) small.set_error(10 - k, static_cast<double>(k) * 0x1p-12);
  const ErrorStats s = small.compare(DType::bf16).o.errors;
  EXPECT_EQ(s.p50, 5 * 0x1p-12);
  EXPECT_EQ(s.p99, 10 * 0x1p-12);
  EXPECT_EQ(s.p999, 10 * 0x1p-12);
}

TEST(MetricsTest, MaxUlpIsInTheOutputDtype) {
  RowsPair rows(make_problem(1, 1, 1, 1, 1, 4, DType::bf16));
  rows.fill(1.0);
  rows.got_o(0, 0, 0, 0) = 1.0 + 0x1p-7;  // one bf16 ULP at 1
  rows.got_o(0, 0, 0, 1) = 1.0 - 0x1p-8;  // half a bf16 ULP at 1 (measured at the reference)
  EXPECT_EQ(rows.compare(DType::bf16).o.errors.max_ulp, 1.0);
  EXPECT_EQ(rows.compare(DType::f16).o.errors.max_ulp, 8.0);
  EXPECT_EQ(rows.compare(DType::f32).o.errors.max_ulp, 65536.0);
}

TEST(MetricsTest, P99UlpIgnoresASingleSignFlip) {
  // 199 elements one bf16 ULP off, and one near-zero element whose sign flips.
  RowsPair rows(make_problem(1, 1, 1, 1, 1, 200, DType::bf16));
  rows.fill(1.0);
  for (int c = 0; c < 199; ++c) rows.got_o(0, 0, 0, c) = 1.0 + 0x1p-7;
  rows.want_o(0, 0, 0, 199) = 1e-6;
  rows.got_o(0, 0, 0, 199) = -1e-6;
  const ErrorStats e = rows.compare(DType::bf16).o.errors;
  EXPECT_EQ(e.max_ulp, std::numeric_limits<double>::infinity());
  EXPECT_EQ(e.p99_ulp, 1.0);
}

TEST(MetricsTest, ConstantOffsetWithNoiseIsBiased) {
  RowsPair rows(make_problem(1, 1, 1, 10, 10, 100, DType::bf16));
  rows.fill(0.75);
  const CounterRng rng(3, 1);
  for (std::size_t i = 0; i < rows.got.o.size(); ++i) rows.set_error(i, 1e-3 + 1e-4 * rng.normal(i));
  const ErrorStats e = rows.compare(DType::bf16).o.errors;
  EXPECT_NEAR(e.mean_signed, 1e-3, 2e-5);
  // t = mean / (sd / sqrt(n)) ~ 1e-3 / (1e-4 / 31.6) ~ 316.
  EXPECT_GT(e.bias_t, 200.0);
  EXPECT_LT(e.bias_t, 450.0);
}

TEST(MetricsTest, NegativeOffsetGivesNegativeT) {
  RowsPair rows(make_problem(1, 1, 1, 10, 10, 100, DType::bf16));
  rows.fill(0.75);
  const CounterRng rng(3, 2);
  for (std::size_t i = 0; i < rows.got.o.size(); ++i) rows.set_error(i, -1e-3 + 1e-4 * rng.normal(i));
  EXPECT_LT(rows.compare(DType::bf16).o.errors.bias_t, -200.0);
}

TEST(MetricsTest, SymmetricErrorsAreUnbiased) {
  RowsPair rows(make_problem(1, 1, 1, 10, 10, 100, DType::bf16));
  rows.fill(0.75);
  const CounterRng rng(3, 3);
  const std::size_t n = rows.got.o.size();
  for (std::size_t i = 0; i < n / 2; ++i) {
    const double error = 1e-3 * rng.normal(i);
    rows.set_error(2 * i, error);
    rows.set_error(2 * i + 1, -error);
  }
  const ErrorStats e = rows.compare(DType::bf16).o.errors;
  EXPECT_GT(e.rmse, 5e-4) << "the errors must not be vacuous";
  EXPECT_LT(std::fabs(e.bias_t), 1.0);
  EXPECT_LT(std::fabs(e.mean_signed), 1e-12);
}

TEST(MetricsTest, ConstantOffsetWithoutNoiseIsBiased) {
  // Every element off by the same +2^-10: the most biased error there is. The
  // t statistic has zero variance in its denominator; whatever the code does
  // with that, it must not report |t| <= 4 ("unbiased").
  RowsPair rows(make_problem(1, 1, 1, 4, 4, 8, DType::bf16));
  rows.fill(0.75);
  for (std::size_t i = 0; i < rows.got.o.size(); ++i) rows.set_error(i, 0x1p-10);
  const ErrorStats e = rows.compare(DType::bf16).o.errors;
  EXPECT_EQ(e.mean_signed, 0x1p-10);
  EXPECT_GT(e.bias_t, 4.0) << "a constant offset of 2^-10 on all " << e.count << " elements reported as t = "
                           << e.bias_t;
}

TEST(MetricsTest, LargeOffsetWithTinyNoiseIsBiased) {
  // Offset 1e-2 with noise of standard deviation 1e-10 (resolvable in binary64
  // at 0.75): t ~ 1e-2 / (1e-10 / sqrt(1000)) ~ 3e9. Computing the variance as
  // E[e^2] - E[e]^2 cancels catastrophically here; the result must still be > 4.
  RowsPair rows(make_problem(1, 1, 1, 10, 10, 100, DType::bf16));
  rows.fill(0.75);
  const CounterRng rng(3, 1);
  for (std::size_t i = 0; i < rows.got.o.size(); ++i) rows.set_error(i, 1e-2 + 1e-10 * rng.normal(i));
  const ErrorStats e = rows.compare(DType::bf16).o.errors;
  EXPECT_NEAR(e.mean_signed, 1e-2, 1e-9);
  EXPECT_GT(e.bias_t, 1e8) << "offset 1e-2 with noise sd 1e-10 on " << e.count << " elements reported as t = "
                           << e.bias_t;
}

TEST(MetricsTest, HistogramBins) {
  EXPECT_EQ(histogram_bin(0.0), 0);
  EXPECT_EQ(histogram_bin(1e-17), 1);
  EXPECT_EQ(histogram_bin(std::numeric_limits<double>::denorm_min()), 1);
  EXPECT_EQ(histogram_bin(1e-16), 2);
  EXPECT_EQ(histogram_bin(3e-5), 13);  // [1e-5, 1e-4): i = 11
  EXPECT_EQ(histogram_bin(0.5), 17);
  EXPECT_EQ(histogram_bin(9999.0), 21);
  EXPECT_EQ(histogram_bin(1e4), kHistogramBins - 1);
  EXPECT_EQ(histogram_bin(kInf), kHistogramBins - 1);
  EXPECT_EQ(histogram_bin(kNan), kHistogramBins - 1);
  EXPECT_EQ(histogram_bin_floor(0), 0.0);
  EXPECT_EQ(histogram_bin_floor(2), 1e-16);
  EXPECT_EQ(histogram_bin_floor(13), 1e-5);
  EXPECT_EQ(histogram_bin_floor(kHistogramBins - 1), 1e4);
  // Every edge: the edge itself opens its bin, the double below it closes the one before.
  for (int bin = 3; bin < kHistogramBins; ++bin) {
    const double edge = histogram_bin_floor(bin);
    EXPECT_EQ(edge, std::pow(10.0, bin - 18)) << bin;
    EXPECT_EQ(histogram_bin(edge), bin) << bin;
    EXPECT_EQ(histogram_bin(std::nextafter(edge, 0.0)), bin - 1) << bin;
  }
}

TEST(MetricsTest, UlpHistogramBins) {
  EXPECT_EQ(ulp_histogram_bin(0.0), 0);
  EXPECT_EQ(ulp_histogram_bin(0x1p-9), 1);
  EXPECT_EQ(ulp_histogram_bin(0x1p-8), 2);                            // [2^-8, 2^-7): i = 0
  EXPECT_EQ(ulp_histogram_bin(std::nextafter(0x1p-7, 0.0)), 2);
  EXPECT_EQ(ulp_histogram_bin(0.5), 9);                               // [2^-1, 2^0): i = 7
  EXPECT_EQ(ulp_histogram_bin(1.0), 10);                              // [1, 2): i = 8
  EXPECT_EQ(ulp_histogram_bin(3.0), 11);
  EXPECT_EQ(ulp_histogram_bin(std::nextafter(0x1p20, 0.0)), kUlpHistogramBins - 2);
  EXPECT_EQ(ulp_histogram_bin(0x1p20), kUlpHistogramBins - 1);
  EXPECT_EQ(ulp_histogram_bin(kInf), kUlpHistogramBins - 1);
  EXPECT_EQ(ulp_histogram_bin(kNan), kUlpHistogramBins - 1);
}

TEST(MetricsTest, UlpHistogramCountsEveryFinitePair) {
  // bf16 spacing at 0.75 is 2^-8: errors of 0, 1 and 4 ulp, every element.
  RowsPair rows(make_problem(1, 1, 1, 3, 3, 2, DType::bf16));
  rows.fill(0.75);
  const std::size_t n = rows.got.o.size();
  for (std::size_t i = 0; i < n; ++i) rows.set_error(i, i % 3 == 0 ? 0.0 : i % 3 == 1 ? 0x1p-8 : 0x1p-6);
  const ErrorStats e = rows.compare(DType::bf16).o.errors;
  EXPECT_EQ(e.ulp_histogram[0], (static_cast<std::int64_t>(n) + 2) / 3);
  EXPECT_EQ(e.ulp_histogram[10], (static_cast<std::int64_t>(n) + 1) / 3);  // [1, 2) ulp
  EXPECT_EQ(e.ulp_histogram[12], static_cast<std::int64_t>(n) / 3);        // [4, 8) ulp
  std::int64_t total = 0;
  for (auto count : e.ulp_histogram) total += count;
  EXPECT_EQ(total, e.count);
}

TEST(MetricsTest, HistogramBinEdgesAgreeWithBinFloors) {
  // Every decade bin b holds [floor(b), floor(b + 1)): its lower edge and the
  // largest double below its upper edge.
  std::string failures;
  for (int bin = 2; bin < kHistogramBins - 1; ++bin) {
    const double lower = histogram_bin_floor(bin), upper = histogram_bin_floor(bin + 1);
    if (histogram_bin(lower) != bin)
      failures += "  lower edge " + std::to_string(lower) + " of bin " + std::to_string(bin) + " lands in bin " +
                  std::to_string(histogram_bin(lower)) + "\n";
    const double below_upper = std::nextafter(upper, 0.0);
    if (histogram_bin(below_upper) != bin) {
      char text[64];
      std::snprintf(text, sizeof text, "%.17g", below_upper);
      failures += "  " + std::string(text) + " (just below the upper edge of bin " + std::to_string(bin) +
                  ") lands in bin " + std::to_string(histogram_bin(below_upper)) + "\n";
    }
  }
  EXPECT_TRUE(failures.empty()) << failures;
}

TEST(MetricsTest, HistogramCountsFromCompare) {
  RowsPair rows(make_problem(1, 1, 1, 1, 1, 8, DType::f32));
  rows.fill(1.0);
  rows.set_error(1, 0x1p-40);  // ~9.1e-13 -> [1e-13, 1e-12): bin 5
  rows.set_error(2, 0x1p-40);
  rows.set_error(3, 3 * 0x1p-16);  // ~4.6e-5 -> bin 13
  rows.set_error(4, -0.25);       // bin 17
  const ErrorStats e = rows.compare(DType::f32).o.errors;
  std::array<std::int64_t, kHistogramBins> want{};
  want[0] = 4;
  want[5] = 2;
  want[13] = 1;
  want[17] = 1;
  EXPECT_EQ(e.histogram, want);
}

// ---- compare(): NaN/Inf census ---------------------------------------------------

TEST(MetricsTest, NanInfCensus) {
  RowsPair rows(make_problem(1, 1, 1, 2, 2, 4, DType::f16));
  rows.fill(1.0);
  auto set = [&](std::int64_t row, std::int64_t c, double got, double want) {
    rows.got_o(0, 0, row, c) = got;
    rows.want_o(0, 0, row, c) = want;
  };
  set(0, 0, kNan, kNan);    // agree
  set(0, 1, kNan, 1.0);     // mismatch (the first)
  set(0, 2, -kInf, kInf);   // mismatch
  set(0, 3, kInf, kInf);    // agree
  set(1, 0, -kInf, -kInf);  // agree
  set(1, 1, kInf, 2.0);     // mismatch
  set(1, 2, 3.0, 3.0 + 0x1p-9);  // finite, compared
  const CaseMetrics m = rows.compare(DType::f16);
  const Census& c = m.o.census;
  EXPECT_EQ(c.mismatches, 3);
  EXPECT_EQ(c.got_nan, 2);
  EXPECT_EQ(c.want_nan, 1);
  EXPECT_EQ(c.got_pos_inf, 2);
  EXPECT_EQ(c.want_pos_inf, 2);
  EXPECT_EQ(c.got_neg_inf, 2);
  EXPECT_EQ(c.want_neg_inf, 1);
  ASSERT_TRUE(c.first_mismatch.has_value());
  expect_position(c.first_mismatch->at, 0, 0, 0, 1);
  EXPECT_TRUE(std::isnan(c.first_mismatch->got));
  EXPECT_EQ(c.first_mismatch->want, 1.0);
  // Only the finite pairs enter the error statistics.
  EXPECT_EQ(m.o.errors.count, 2);
  EXPECT_EQ(m.o.errors.max_abs, 0x1p-9);
  EXPECT_TRUE(std::isfinite(m.o.errors.rmse));
}

TEST(MetricsTest, AgreeingNanAndInfAreNotMismatches) {
  RowsPair rows(make_problem(1, 1, 1, 1, 1, 3, DType::bf16));
  rows.fill(1.0);
  rows.got_o(0, 0, 0, 0) = rows.want_o(0, 0, 0, 0) = kNan;
  rows.got_o(0, 0, 0, 1) = rows.want_o(0, 0, 0, 1) = kInf;
  rows.got_o(0, 0, 0, 2) = rows.want_o(0, 0, 0, 2) = -kInf;
  const CaseMetrics m = rows.compare(DType::bf16);
  EXPECT_EQ(m.o.census.mismatches, 0);
  EXPECT_FALSE(m.o.census.first_mismatch.has_value());
  EXPECT_EQ(m.o.census.got_nan, 1);
  EXPECT_EQ(m.o.errors.count, 0);
}

TEST(MetricsTest, LseCensusAndUlpInF32) {
  RowsPair rows(make_problem(1, 1, 1, 3, 3, 2, DType::bf16));
  rows.fill(1.0, 2.0);
  rows.got.lse[0] = 2.0 + 0x1p-22;  // one f32 ULP at 2
  rows.got.lse[1] = kNan;          // mismatch in LSE only
  const CaseMetrics m = rows.compare(DType::bf16);
  ASSERT_TRUE(m.has_lse);
  EXPECT_EQ(m.lse.errors.max_ulp, 1.0);
  EXPECT_EQ(m.lse.errors.max_abs, 0x1p-22);
  EXPECT_EQ(m.lse.census.mismatches, 1);
  ASSERT_TRUE(m.lse.census.first_mismatch.has_value());
  expect_position(m.lse.census.first_mismatch->at, 0, 0, 1, -1);
  EXPECT_EQ(m.o.census.mismatches, 0);
}

TEST(MetricsTest, NoLseWhenEitherSideLacksIt) {
  RowsPair rows(make_problem(1, 1, 1, 2, 2, 2, DType::bf16));
  rows.fill(1.0, 2.0);
  rows.got.lse[0] = kNan;
  rows.got.has_lse = false;
  const CaseMetrics m = rows.compare(DType::bf16);
  EXPECT_FALSE(m.has_lse);
  EXPECT_EQ(m.lse.errors.count, 0);
  EXPECT_EQ(m.lse.census.mismatches, 0);
  rows.got.has_lse = true;
  rows.want.has_lse = false;
  EXPECT_FALSE(rows.compare(DType::bf16).has_lse);
}

TEST(MetricsTest, PaddingRowsAreSkipped) {
  Problem p = make_problem(2, 2, 1, 4, 4, 4, DType::bf16);
  p.lens_q = {4, 2};
  p.lens_kv = {4, 4};
  RowsPair rows(p);
  rows.fill(1.0, 0.5);
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t row = 2; row < 4; ++row) {  // padding of sequence 1: garbage that must not count
      for (std::int64_t c = 0; c < 4; ++c) {
        rows.got_o(1, h, row, c) = (c % 2) ? kNan : 1e6;
        rows.want_o(1, h, row, c) = 0.0;
      }
      rows.got.lse[rows.got.index(1, h, row)] = kNan;
      rows.want.lse[rows.want.index(1, h, row)] = -kInf;
    }
  rows.got_o(1, 1, 1, 3) += 0x1p-8;  // the last valid row of sequence 1
  const CaseMetrics m = rows.compare(DType::bf16);
  EXPECT_EQ(m.rows_compared, (4 + 2) * 2);
  EXPECT_EQ(m.o.errors.count, (4 + 2) * 2 * 4);
  EXPECT_EQ(m.o.census.mismatches, 0);
  EXPECT_EQ(m.lse.census.mismatches, 0);
  EXPECT_EQ(m.lse.errors.count, (4 + 2) * 2);
  EXPECT_EQ(m.o.errors.max_abs, 0x1p-8);
  expect_position(m.o.errors.worst->at, 1, 1, 1, 3);
}

TEST(MetricsTest, OverBoundCountsStrictlyGreaterErrors) {
  RowsPair rows(make_problem(1, 2, 1, 2, 2, 4, DType::bf16));
  rows.fill(1.0, 3.0);
  rows.got_o(0, 0, 1, 2) += 0x1p-10;      // equal to the bound: not over
  rows.got_o(0, 1, 0, 3) += 0x1p-9;       // over, first in (b, h, row, column) order
  rows.got_o(0, 1, 1, 0) -= 0x1p-8;       // over
  rows.got.lse[rows.got.index(0, 1, 1)] = 3.0 + 0x1p-12;  // over the LSE bound
  Bounds bounds;
  bounds.o = 0x1p-10;
  bounds.lse = 0x1p-14;
  const CaseMetrics m = rows.compare(DType::bf16, bounds);
  EXPECT_EQ(m.o.over_bound, 2);
  ASSERT_TRUE(m.o.first_over_bound.has_value());
  expect_position(m.o.first_over_bound->at, 0, 1, 0, 3);
  EXPECT_EQ(m.o.first_over_bound->abs_error, 0x1p-9);
  EXPECT_EQ(m.lse.over_bound, 1);
  expect_position(m.lse.first_over_bound->at, 0, 1, 1, -1);

  const CaseMetrics unbounded = rows.compare(DType::bf16);
  EXPECT_EQ(unbounded.o.over_bound, 0);
  EXPECT_FALSE(unbounded.o.first_over_bound.has_value());
}

// ---- the tolerance rule -----------------------------------------------------------

// Metrics with only the fields the rule reads.
CaseMetrics metrics_of(double max_abs, double rmse, double ref_max_abs, double ref_rms) {
  CaseMetrics m;
  m.o.errors.count = 16;
  m.o.errors.max_abs = max_abs;
  m.o.errors.rmse = rmse;
  m.o.errors.ref_max_abs = ref_max_abs;
  m.o.errors.ref_rms = ref_rms;
  m.has_lse = false;
  return m;
}

void add_lse(CaseMetrics& m, double max_abs, double rmse, double ref_max_abs, double ref_rms) {
  m.has_lse = true;
  m.lse.errors.count = 4;
  m.lse.errors.max_abs = max_abs;
  m.lse.errors.rmse = rmse;
  m.lse.errors.ref_max_abs = ref_max_abs;
  m.lse.errors.ref_rms = ref_rms;
}

TEST(ToleranceTest, NoiseFloorIsTwoRoundingsAtScale) {
  EXPECT_EQ(noise_floor(DType::bf16, 3.0), 2 * 0x1p-8 * 3.0);
  EXPECT_EQ(noise_floor(DType::f16, 3.0), 2 * 0x1p-11 * 3.0);
  EXPECT_EQ(noise_floor(DType::f32, 3.0), 2 * 0x1p-24 * 3.0);
  // Below the normal range a rounding is half the subnormal grid, whatever the size.
  EXPECT_EQ(noise_floor(DType::bf16, 0.0), 0x1p-133);
  EXPECT_EQ(noise_floor(DType::f16, 0.0), 0x1p-24);
  EXPECT_EQ(noise_floor(DType::f32, 1e-40), 0x1p-149);
  EXPECT_EQ(noise_floor(DType::bf16, 1e-39), 0x1p-133);
  EXPECT_EQ(kBaselineFactor, 2.0);
}

TEST(ToleranceTest, PassesAtTheBoundAndFailsJustAbove) {
  const CaseMetrics baseline = metrics_of(1e-3, 1e-4, 0.125, 0.0625);
  const double max_bound = 2 * 1e-3 + 2 * 0x1p-8 * 0.125;
  const double rmse_bound = 2 * 1e-4 + 2 * 0x1p-8 * 0.0625;

  const Verdict at = decide(metrics_of(max_bound, rmse_bound, 0.125, 0.0625), baseline, DType::bf16);
  EXPECT_TRUE(at.pass) << at.rule;
  EXPECT_TRUE(at.census_pass);
  ASSERT_EQ(at.checks.size(), 3u);  // o.max_abs, o.rmse, o.bias
  EXPECT_EQ(at.checks[0].metric, "o.max_abs");
  EXPECT_EQ(at.checks[0].bound, max_bound);
  EXPECT_EQ(at.checks[1].metric, "o.rmse");
  EXPECT_EQ(at.checks[1].bound, rmse_bound);
  EXPECT_DOUBLE_EQ(at.worst_ratio, 1.0);

  const Verdict above = decide(metrics_of(std::nextafter(max_bound, kInf), 0, 0.125, 0.0625), baseline, DType::bf16);
  EXPECT_FALSE(above.pass);
  EXPECT_EQ(above.rule.rfind("o.max_abs", 0), 0u) << above.rule;
  EXPECT_GT(above.worst_ratio, 1.0);

  const Verdict rmse_above =
      decide(metrics_of(0, std::nextafter(rmse_bound, kInf), 0.125, 0.0625), baseline, DType::bf16);
  EXPECT_FALSE(rmse_above.pass);
  EXPECT_EQ(rmse_above.rule.rfind("o.rmse", 0), 0u) << rmse_above.rule;
}

TEST(ToleranceTest, FloorIsInTheOutputDtype) {
  const CaseMetrics baseline = metrics_of(0, 0, 1.0, 1.0);
  // 2^-9 is within the bf16 floor (2 * 2^-8) but beyond the f16 floor (2 * 2^-11).
  const CaseMetrics subject = metrics_of(0x1p-9, 0, 1.0, 1.0);
  EXPECT_TRUE(decide(subject, baseline, DType::bf16).pass);
  EXPECT_FALSE(decide(subject, baseline, DType::f16).pass);
}

TEST(ToleranceTest, ExactBaselineStillToleratesTheFloor) {
  const CaseMetrics baseline = metrics_of(0, 0, 1.0, 0.5);
  const Verdict within = decide(metrics_of(0x1p-8, 0x1p-9, 1.0, 0.5), baseline, DType::bf16);  // floors 2^-7, 2^-8
  EXPECT_TRUE(within.pass) << within.rule;
  const Verdict beyond = decide(metrics_of(0x1p-6, 0x1p-9, 1.0, 0.5), baseline, DType::bf16);
  EXPECT_FALSE(beyond.pass);
  EXPECT_NE(beyond.rule.find("o.max_abs"), std::string::npos) << beyond.rule;
  // Exact baseline with a zero reference: the floor is the output's subnormal
  // grid (two half-steps of 2^-133 in bf16): an error of 1e-30 fails by ten
  // orders of magnitude, one of half a step passes.
  const Verdict zero = decide(metrics_of(1e-30, 0, 0, 0), metrics_of(0, 0, 0, 0), DType::bf16);
  EXPECT_FALSE(zero.pass);
  EXPECT_GT(zero.worst_ratio, 1e10);
  EXPECT_TRUE(decide(metrics_of(0x1p-134, 0, 0, 0), metrics_of(0, 0, 0, 0), DType::bf16).pass);
  EXPECT_TRUE(decide(metrics_of(0, 0, 0, 0), metrics_of(0, 0, 0, 0), DType::bf16).pass);
}

TEST(ToleranceTest, CensusMismatchFails) {
  RowsPair rows(make_problem(1, 1, 1, 2, 2, 4, DType::bf16));
  rows.fill(1.0, 0.5);
  const CaseMetrics baseline = rows.compare(DType::bf16);
  rows.got_o(0, 0, 1, 2) = kNan;
  const CaseMetrics subject = rows.compare(DType::bf16);
  ASSERT_EQ(subject.o.census.mismatches, 1);
  const Verdict v = decide(subject, baseline, DType::bf16);
  EXPECT_FALSE(v.pass);
  EXPECT_FALSE(v.census_pass);
  EXPECT_NE(v.rule.find("census"), std::string::npos) << v.rule;
  EXPECT_NE(v.rule.find("row=1"), std::string::npos) << "the rule should locate the mismatch: " << v.rule;

  // A mismatch in LSE alone fails as well.
  RowsPair lse_rows(make_problem(1, 1, 1, 2, 2, 4, DType::bf16));
  lse_rows.fill(1.0, 0.5);
  lse_rows.got.lse[1] = kInf;
  const Verdict lse_verdict = decide(lse_rows.compare(DType::bf16), baseline, DType::bf16);
  EXPECT_FALSE(lse_verdict.pass);
  EXPECT_FALSE(lse_verdict.census_pass);
  EXPECT_NE(lse_verdict.rule.find("census"), std::string::npos) << lse_verdict.rule;
  EXPECT_NE(lse_verdict.rule.find("lse"), std::string::npos) << lse_verdict.rule;
}

TEST(ToleranceTest, LseChecksOnlyWhenBothHaveLse) {
  CaseMetrics subject = metrics_of(1e-3, 1e-4, 1, 1), baseline = metrics_of(1e-3, 1e-4, 1, 1);
  EXPECT_EQ(decide(subject, baseline, DType::bf16).checks.size(), 3u);  // O's max, RMSE and bias
  add_lse(subject, 1e-6, 1e-7, 5, 5);
  EXPECT_EQ(decide(subject, baseline, DType::bf16).checks.size(), 3u);
  EXPECT_EQ(decide(baseline, subject, DType::bf16).checks.size(), 3u);
  add_lse(baseline, 1e-6, 1e-7, 5, 5);
  const Verdict v = decide(subject, baseline, DType::bf16);
  ASSERT_EQ(v.checks.size(), 5u);
  EXPECT_EQ(v.checks[4].metric, "o.bias");
  EXPECT_EQ(v.checks[2].metric, "lse.max_abs");
  EXPECT_EQ(v.checks[3].metric, "lse.rmse");
  // LSE's floor is in f32 whatever the output dtype.
  EXPECT_EQ(v.checks[2].floor, 2 * 0x1p-24 * 5);
}

TEST(ToleranceTest, RuleNamesTheDecisiveMetric) {
  CaseMetrics baseline = metrics_of(1e-3, 1e-4, 1e-3, 1e-3);
  add_lse(baseline, 1e-6, 1e-7, 1e-3, 1e-3);
  CaseMetrics subject = metrics_of(1e-3, 1e-4, 1e-3, 1e-3);
  add_lse(subject, 1e-6, 1e-3, 1e-3, 1e-3);  // lse.rmse 1e-3 > 2e-7 + floor
  const Verdict v = decide(subject, baseline, DType::bf16);
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.rule.rfind("lse.rmse", 0), 0u) << v.rule;
  EXPECT_FALSE(v.checks[3].pass);
  EXPECT_TRUE(v.checks[0].pass && v.checks[1].pass && v.checks[2].pass);

  // A passing verdict names the closest check.
  CaseMetrics close = metrics_of(0, 1.9e-4, 1e-3, 1e-3);
  add_lse(close, 0, 0, 1e-3, 1e-3);
  const Verdict passing = decide(close, baseline, DType::bf16);
  EXPECT_TRUE(passing.pass) << passing.rule;
  EXPECT_NE(passing.rule.find("o.rmse"), std::string::npos) << passing.rule;
  EXPECT_EQ(passing.rule.find("o.max_abs"), std::string::npos) << passing.rule;
}

TEST(ToleranceTest, WorstRatioIsTheLargestRatio) {
  const CaseMetrics baseline = metrics_of(1.0, 1.0, 0, 0);  // zero floors: bounds are 2 and 2
  const Verdict v = decide(metrics_of(1.0, 1.6, 0, 0), baseline, DType::f32);
  ASSERT_EQ(v.checks.size(), 3u);  // the third, o.bias, has no bias to judge: ratio 0
  EXPECT_DOUBLE_EQ(v.checks[0].ratio, 0.5);
  EXPECT_DOUBLE_EQ(v.checks[1].ratio, 0.8);
  EXPECT_DOUBLE_EQ(v.worst_ratio, 0.8);
  EXPECT_TRUE(v.pass);
}

TEST(ToleranceTest, RuleBoundsMatchTheRule) {
  CaseMetrics baseline = metrics_of(1e-3, 1e-4, 2.0, 1.0);
  Bounds bounds = rule_bounds(baseline, DType::f16);
  ASSERT_TRUE(bounds.o.has_value());
  EXPECT_EQ(*bounds.o, 2 * 1e-3 + 2 * 0x1p-11 * 2.0);
  EXPECT_FALSE(bounds.lse.has_value());
  add_lse(baseline, 1e-6, 1e-7, 8.0, 8.0);
  bounds = rule_bounds(baseline, DType::f16);
  ASSERT_TRUE(bounds.lse.has_value());
  EXPECT_EQ(*bounds.lse, 2 * 1e-6 + 2 * 0x1p-24 * 8.0);
}

// ---- the bias check ---------------------------------------------------------------

// Rows of O whose reference values lean positive (as attention's outputs do
// with V's +0.5 offset): normal(mean, std) per element, deterministic.
RowsPair leaning_rows(double mean, double std) {
  RowsPair rows(make_problem(1, 2, 1, 16, 16, 64, DType::bf16));  // 2048 elements
  const CounterRng rng(20, 11);
  for (std::size_t i = 0; i < rows.want.o.size(); ++i) rows.want.o[i] = mean + std * rng.normal(i);
  rows.got.o = rows.want.o;
  return rows;
}

// bf16 of x rounded toward zero (bf16 is f32's top half) and to nearest.
double toward_zero_bf16(double x) {
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(static_cast<float>(x)) & 0xFFFF0000u);
}

// Subject outputs rounded to bf16 one way or another, against an unbiased
// baseline that rounds to nearest a value a few ulps off (as plain attention
// in bf16 is).
struct BiasCase {
  RowsPair rows = leaning_rows(0.5, 0.5);
  CaseMetrics baseline;
  BiasCase() {
    RowsPair base = rows;
    const CounterRng rng(21, 11);
    for (std::size_t i = 0; i < base.want.o.size(); ++i)
      base.got.o[i] = round_to(DType::bf16, base.want.o[i] * (1 + 0x1p-7 * rng.normal(i)));
    baseline = base.compare(DType::bf16);
  }
  template <typename Round>
  CaseMetrics subject(Round round) {
    for (std::size_t i = 0; i < rows.want.o.size(); ++i) rows.got.o[i] = round(rows.want.o[i]);
    return rows.compare(DType::bf16);
  }
};

const RuleCheck& bias_check(const Verdict& v, std::string_view metric = "o.bias") {
  for (const RuleCheck& c : v.checks)
    if (c.metric == metric) return c;
  throw std::logic_error("no " + std::string(metric) + " check in the verdict");
}

TEST(BiasRuleTest, TruncatingOutputFailsOnBiasAlone) {
  BiasCase bias_case;
  const CaseMetrics truncated = bias_case.subject(toward_zero_bf16);
  ASSERT_LT(truncated.o.errors.bias_t, -kBiasT) << "the truncation should be significant";
  const Verdict v = decide(truncated, bias_case.baseline, DType::bf16);
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.rule.rfind("o.bias", 0), 0u) << v.rule;
  // The max and RMSE checks let it through: the blind spot the bias checks close.
  for (const RuleCheck& c : v.checks)
    if (c.metric.rfind("o.bias", 0) != 0) {
      EXPECT_TRUE(c.pass) << c.metric << " ratio " << c.ratio;
    }
  EXPECT_FALSE(bias_check(v).pass);
  EXPECT_GT(bias_check(v).ratio, 1.0);
  EXPECT_GT(v.worst_ratio, 1.0);
}

TEST(BiasRuleTest, UnbiasedOutputAtTheSameMaxErrorPasses) {
  BiasCase bias_case;
  const CaseMetrics truncated = bias_case.subject(toward_zero_bf16);
  // The truncation's error magnitudes, with alternating signs: the same max
  // error (and RMSE), mean near zero.
  std::vector<double> magnitudes(bias_case.rows.want.o.size());
  for (std::size_t i = 0; i < magnitudes.size(); ++i)
    magnitudes[i] = std::fabs(bias_case.rows.got.o[i] - bias_case.rows.want.o[i]);
  std::size_t i = 0;
  const CaseMetrics alternating = bias_case.subject([&](double want) {
    const double error = i % 2 ? magnitudes[i] : -magnitudes[i];
    ++i;
    return want + error;
  });
  EXPECT_EQ(alternating.o.errors.max_abs, truncated.o.errors.max_abs);
  const Verdict v = decide(alternating, bias_case.baseline, DType::bf16);
  EXPECT_TRUE(v.pass) << v.rule;
  EXPECT_TRUE(bias_check(v).pass);

  // Round to nearest, the correct epilogue, passes too.
  const Verdict nearest =
      decide(bias_case.subject([](double want) { return round_to(DType::bf16, want); }), bias_case.baseline, DType::bf16);
  EXPECT_TRUE(nearest.pass) << nearest.rule;
}

TEST(BiasRuleTest, TheBaselinesOwnBiasIsAllowed) {
  BiasCase bias_case;
  const CaseMetrics truncated = bias_case.subject(toward_zero_bf16);
  // A baseline just as biased (it truncates too): the subject is no worse than
  // plain attention in its precision.
  RowsPair base = bias_case.rows;
  for (std::size_t i = 0; i < base.want.o.size(); ++i)
    base.got.o[i] = toward_zero_bf16(base.want.o[i] * (1 + 0x1p-9 * std::sin(static_cast<double>(i))));
  const CaseMetrics biased_baseline = base.compare(DType::bf16);
  ASSERT_LT(biased_baseline.o.errors.bias_t, -kBiasT);
  const Verdict v = decide(truncated, biased_baseline, DType::bf16);
  EXPECT_TRUE(v.pass) << v.rule;
  EXPECT_DOUBLE_EQ(bias_check(v).baseline, std::fabs(biased_baseline.o.errors.mean_signed));
}

TEST(BiasRuleTest, NeedsASignificantSample) {
  BiasCase bias_case;
  CaseMetrics truncated = bias_case.subject(toward_zero_bf16);
  auto set = [&](double t, std::int64_t count) {
    truncated.o.errors.bias_t = t;
    truncated.o.errors.count = count;
  };
  const std::int64_t all = truncated.o.errors.count;
  // The same mean, but |t| at the threshold: not significant.
  set(-kBiasT, all);
  EXPECT_TRUE(decide(truncated, bias_case.baseline, DType::bf16).pass);
  // A large t on fewer than kBiasMinCount elements: no sample behind it.
  set(-1e3, kBiasMinCount - 1);
  const Verdict few = decide(truncated, bias_case.baseline, DType::bf16);
  EXPECT_TRUE(few.pass) << few.rule;
  EXPECT_EQ(bias_check(few).ratio, 0.0);
  set(-1e3, kBiasMinCount);
  EXPECT_FALSE(decide(truncated, bias_case.baseline, DType::bf16).pass);
}

TEST(BiasRuleTest, TheMagnitudeMeanSeesTruncationOfOutputsOfBothSigns) {
  // Outputs centred on 0: truncation's errors point toward zero, so half are
  // positive and their signed mean is ~0; their mean along sign(ref) is not.
  // (Recorded, not judged: tolerance.hpp says why.)
  BiasCase bias_case;
  bias_case.rows = leaning_rows(0.0, 0.5);
  const CaseMetrics truncated = bias_case.subject(toward_zero_bf16);
  EXPECT_LT(std::fabs(truncated.o.errors.bias_t), kBiasT) << "the signed mean should not see it";
  EXPECT_LT(truncated.o.errors.magnitude_t, -kBiasT);
  EXPECT_LT(truncated.o.errors.mean_magnitude, 0.0);
  const CaseMetrics nearest = bias_case.subject([](double want) { return round_to(DType::bf16, want); });
  EXPECT_LT(std::fabs(nearest.o.errors.magnitude_t), kBiasT);
}

TEST(BiasRuleTest, FloorIsAQuarterRoundingAtTheReferencesScale) {
  BiasCase bias_case;
  const CaseMetrics subject = bias_case.subject([](double want) { return round_to(DType::bf16, want); });
  const Verdict v = decide(subject, bias_case.baseline, DType::bf16);
  const RuleCheck& c = bias_check(v);
  // Plus the ties' slack: these spread references have a few (ErrorStats::tie_slack).
  EXPECT_LT(subject.o.errors.tie_slack, 0.1 * 0x1p-7);
  EXPECT_EQ(c.floor, kBiasFloorRoundings * 0x1p-8 * bias_case.baseline.o.errors.ref_rms + subject.o.errors.tie_slack);
  EXPECT_EQ(c.bound, kBaselineFactor * std::fabs(bias_case.baseline.o.errors.mean_signed) + c.floor);
}

// References crowded around one value round the same way: a correctly rounded
// output then has a mean error far from 0 and a huge t, and is no bias of the
// subject's (the H200 sweep's 262144-key case, where every bf16 kernel and
// cuDNN wrote the same O); a truncating output on the same references is.
TEST(BiasRuleTest, CorrectRoundingOfCrowdedReferencesIsNotABias) {
  RowsPair rows(make_problem(1, 1, 1, 32, 32, 16, DType::bf16));
  rows.fill(0.0);
  const int n = static_cast<int>(rows.want.o.size());
  for (int i = 0; i < n; ++i) rows.want.o[i] = -1.7 + 1e-4 * std::sin(static_cast<double>(i));
  RowsPair base = rows;
  for (int i = 0; i < n; ++i) {
    rows.got.o[i] = round_to(DType::bf16, rows.want.o[i]);
    base.got.o[i] = round_to(DType::bf16, rows.want.o[i] * (1 + 0x1p-7 * std::sin(3.0 * i)));
  }
  const CaseMetrics subject = rows.compare(DType::bf16), baseline = base.compare(DType::bf16);
  ASSERT_GT(std::fabs(subject.o.errors.bias_t), kBiasT);                       // the t gate alone would flag it
  // The baseline rounds values its arithmetic spread by about an ulp: its mean
  // error stays near 0 while correct rounding's is not.
  ASSERT_GT(std::fabs(subject.o.errors.mean_signed),
            kBaselineFactor * std::fabs(baseline.o.errors.mean_signed) + 0.25 * 0x1p-8 * 1.7);  // the old rule failed it
  const Verdict v = decide(subject, baseline, DType::bf16);
  EXPECT_TRUE(v.pass) << v.rule;
  for (int i = 0; i < n; ++i) rows.got.o[i] = toward_zero_bf16(rows.want.o[i]);
  const Verdict truncating = decide(rows.compare(DType::bf16), baseline, DType::bf16);
  EXPECT_FALSE(truncating.pass) << truncating.rule;
}

// References on rounding midpoints (O averaging two bf16 values): an output
// that sends every tie away from zero has a mean error of about half an ulp
// times the tie fraction. It is faithful, and the tie slack lets it pass; on
// the same references a truncating output still fails, and spread references
// give almost no slack.
TEST(BiasRuleTest, TiesBrokenOneWayAreNotABias) {
  RowsPair rows(make_problem(1, 1, 1, 32, 32, 16, DType::bf16));
  rows.fill(0.0);
  const int n = static_cast<int>(rows.want.o.size());
  std::uint64_t state = 7;
  const auto next = [&state] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  std::vector<double> away(static_cast<std::size_t>(n)), nearest(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    // Two bf16 values in [-1.875, -1.5]: their mean is a midpoint when they differ by an odd number of ulps.
    const double a = -1.5 - 0x1p-7 * static_cast<double>(next() % 48);
    const double b = -1.5 - 0x1p-7 * static_cast<double>(next() % 48);
    const double exact = (a + b) / 2 * (1 - 1e-7 * std::sin(static_cast<double>(i)));  // just off the midpoint
    rows.want.o[i] = exact;
    nearest[static_cast<std::size_t>(i)] = round_to(DType::bf16, exact);
    away[static_cast<std::size_t>(i)] = round_to(DType::bf16, exact * (1 + 5e-6));  // ties go away from zero
  }
  RowsPair base = rows;
  for (int i = 0; i < n; ++i) base.got.o[i] = nearest[static_cast<std::size_t>(i)];
  for (int i = 0; i < n; ++i) rows.got.o[i] = away[static_cast<std::size_t>(i)];
  const CaseMetrics subject = rows.compare(DType::bf16), baseline = base.compare(DType::bf16);
  EXPECT_GT(subject.o.errors.tie_slack, 0.3 * 0x1p-7);  // about half the elements are ties, an ulp each
  ASSERT_GT(std::fabs(subject.o.errors.bias_t), kBiasT);
  ASSERT_GT(std::fabs(subject.o.errors.mean_signed - subject.o.errors.rounding_mean), 0.25 * 0x1p-8 * 1.7);
  const Verdict v = decide(subject, baseline, DType::bf16);
  EXPECT_TRUE(v.pass) << v.rule;

  // Spread references: the slack is a few percent of an ulp.
  RowsPair spread(make_problem(1, 1, 1, 32, 32, 16, DType::bf16));
  spread.fill(0.0);
  for (int i = 0; i < n; ++i) spread.want.o[i] = spread.got.o[i] = -1.5 - 0.37 * std::fabs(std::sin(1.3 * i));
  EXPECT_LT(spread.compare(DType::bf16).o.errors.tie_slack, 0.1 * 0x1p-7);
}

TEST(BiasRuleTest, TruncationIsCaughtWhereFewReferencesAreTies) {
  RowsPair rows(make_problem(1, 1, 1, 32, 32, 16, DType::bf16));
  rows.fill(0.0);
  const int n = static_cast<int>(rows.want.o.size());
  for (int i = 0; i < n; ++i) {
    // A quarter of the references are midpoints, the rest spread.
    const double spread = -1.5 - 0.37 * std::fabs(std::sin(1.3 * i));
    rows.want.o[i] = i % 4 == 0 ? round_to(DType::bf16, spread) - 0x1p-8 : spread;
  }
  RowsPair base = rows;
  for (int i = 0; i < n; ++i) {
    base.got.o[i] = round_to(DType::bf16, rows.want.o[i] * (1 + 0x1p-9 * std::sin(3.0 * i)));
    rows.got.o[i] = toward_zero_bf16(rows.want.o[i]);
  }
  const CaseMetrics subject = rows.compare(DType::bf16);
  EXPECT_GT(subject.o.errors.tie_slack, 0.2 * 0x1p-7);
  const Verdict truncating = decide(subject, base.compare(DType::bf16), DType::bf16);
  EXPECT_FALSE(truncating.pass) << truncating.rule;
}

// ---- records ----------------------------------------------------------------------

class RecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ = std::filesystem::temp_directory_path() /
                 ("flashcheck_record_test_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(directory_);
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }

  static std::vector<std::string> lines_of(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  std::filesystem::path directory_;
};

// A sweep's record of a lost case, numbered i (its case key).
CaseRecord numbered(int i) {
  CaseRecord record;
  record.verdict = CaseVerdict::crash;
  record.case_key = std::to_string(i);
  record.message = "line " + std::to_string(i);
  return record;
}

int number_of(const std::string& line) { return std::stoi(std::get<CaseRecord>(parse_record(line)).case_key); }

TEST_F(RecordTest, OneLinePerWrite) {
  const auto path = directory_ / "records.jsonl";
  RecordWriter writer(path.string());
  EXPECT_EQ(writer.path(), path.string());
  for (int i = 0; i < 3; ++i) {
    writer.write(numbered(i));
    EXPECT_EQ(lines_of(path).size(), static_cast<std::size_t>(i + 1)) << "write " << i << " was not flushed as a line";
  }
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    CaseRecord record;
    ASSERT_NO_THROW(record = std::get<CaseRecord>(parse_record(lines[i]))) << lines[i];
    EXPECT_EQ(record.case_key, std::to_string(i));
    EXPECT_EQ(record.message, "line " + std::to_string(i));
  }
}

TEST_F(RecordTest, WritersAppendRatherThanTruncate) {
  const auto path = directory_ / "records.jsonl";
  {
    RecordWriter first(path.string());
    first.write(numbered(0));
    first.write(numbered(1));
  }
  RecordWriter second(path.string());
  second.write(numbered(2));
  RecordWriter third(path.string());  // open at the same time as `second`
  third.write(numbered(3));
  second.write(numbered(4));
  const auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(number_of(lines[i]), i) << lines[i];
}

TEST_F(RecordTest, CreatesMissingFolders) {
  const auto path = directory_ / "not" / "yet" / "there" / "records.jsonl";
  ASSERT_FALSE(std::filesystem::exists(path.parent_path()));
  RecordWriter writer(path.string());
  EXPECT_TRUE(std::filesystem::exists(path));
  writer.write(numbered(0));
  EXPECT_EQ(lines_of(path).size(), 1u);
}

TEST_F(RecordTest, UnopenablePathThrows) {
  const auto path = directory_ / "a_directory";
  std::filesystem::create_directories(path);
  try {
    RecordWriter writer(path.string());
    FAIL() << "opening the directory " << path << " for appending did not throw";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(path.string()), std::string::npos)
        << "the message should name the path: " << error.what();
  }
}

TEST_F(RecordTest, NonFiniteNumbersBecomeStrings) {
  ErrorStats stats;
  stats.count = 3;
  stats.max_abs = kNan;
  stats.rmse = kInf;
  stats.mean_signed = -kInf;
  stats.p50 = 0.25;
  stats.worst = Mismatch{{0, 1, 2, 3}, kNan, 1.0, kInf};
  const nlohmann::json j = nlohmann::json(stats);
  EXPECT_EQ(j["max_abs"], "nan");
  EXPECT_EQ(j["rmse"], "inf");
  EXPECT_EQ(j["mean_signed"], "-inf");
  EXPECT_TRUE(j["p50"].is_number());
  EXPECT_EQ(j["p50"], 0.25);
  EXPECT_EQ(j["worst"]["got"], "nan");
  EXPECT_EQ(j["worst"]["abs_error"], "inf");
  EXPECT_EQ(j["worst"]["column"], 3);
  // The dump is valid JSON that reads back the same.
  EXPECT_EQ(nlohmann::json::parse(j.dump()), j);

  Verdict verdict;
  verdict.worst_ratio = kInf;
  verdict.checks.push_back(RuleCheck{"o.max_abs", 1.0, 0.0, 0.0, 0.0, kInf, false});
  const nlohmann::json v = nlohmann::json(verdict);
  EXPECT_EQ(v["worst_ratio"], "inf");
  EXPECT_EQ(v["checks"][0]["ratio"], "inf");
  EXPECT_EQ(v["checks"][0]["metric"], "o.max_abs");
}

TEST_F(RecordTest, CaseMetricsCarryLseOnlyWhenPresent) {
  RowsPair rows(make_problem(1, 1, 1, 2, 2, 4, DType::bf16));
  rows.fill(1.0, 0.5);
  rows.got_o(0, 0, 0, 0) = kNan;
  CaseMetrics m = rows.compare(DType::bf16);
  nlohmann::json j = nlohmann::json(m);
  EXPECT_TRUE(j.contains("lse"));
  EXPECT_EQ(j["o"]["census"]["mismatches"], 1);
  EXPECT_EQ(j["o"]["census"]["first_mismatch"]["got"], "nan");
  EXPECT_EQ(j["rows_compared"], 2);
  m.has_lse = false;
  EXPECT_FALSE(nlohmann::json(m).contains("lse"));
}

// The coarse product accumulation of fp8 tensor cores (LogitCondition::
// product_unit): O's logit noise takes ceil(d / 32) units of the condition,
// LSE's d; without it both are as before.
TEST(ToleranceTest, ProductUnitAddsStepsToOAndEveryProductToLse) {
  LogitCondition c;
  c.head_dim = 128;
  const double plain_o = logit_noise(c, 1.0), plain_lse = lse_logit_noise(c, 1.0);
  EXPECT_EQ(plain_o, plain_lse);
  c.product_unit = 0x1p-13;
  EXPECT_DOUBLE_EQ(logit_noise(c, 1.0) - plain_o, kLogitRoundings * 4 * 0x1p-13);
  EXPECT_DOUBLE_EQ(lse_logit_noise(c, 1.0) - plain_lse, kLogitRoundings * 128 * 0x1p-13);
  c.head_dim = 33;  // two k32 steps
  LogitCondition no_unit = c;
  no_unit.product_unit = 0;
  EXPECT_DOUBLE_EQ(logit_noise(c, 2.0) - logit_noise(no_unit, 2.0), 2 * kLogitRoundings * 2 * 0x1p-13);
}

}  // namespace
}  // namespace flashcheck
