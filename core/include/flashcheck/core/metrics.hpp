// Error metrics of one case: per element (absolute, relative, ULP in the output
// dtype), per case (max, RMSE, percentiles, normwise, bias, histogram) and a
// NaN/Inf census position by position.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "flashcheck/core/dtype.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

/// Log-scale histogram of |error|: bin 0 holds exact zeros, bin 1 errors in
/// (0, 1e-16), bin 2+i errors in [1e(i-16), 1e(i-15)) for i = 0..19, and the
/// last bin errors >= 1e4.
inline constexpr int kHistogramBins = 23;
int histogram_bin(double abs_error);
/// Lower edge of a histogram bin (0 for bin 0).
double histogram_bin_floor(int bin);

/// Log-scale histogram of the ULP distance in the output dtype: bin 0 holds 0
/// ulp, bin 1 (0, 2^-8), bin 2+i [2^(i-8), 2^(i-7)) for i = 0..27, and the
/// last bin 2^20 ulp or more (a sign flip near 0 included).
inline constexpr int kUlpHistogramBins = 31;
int ulp_histogram_bin(double ulps);

/// Where an element sits: (batch, head, query row, column); column -1 for LSE.
struct Position {
  std::int64_t b = -1, h = -1, row = -1, column = -1;
  friend bool operator==(const Position&, const Position&) = default;
};

struct Mismatch {
  Position at;
  double got = 0, want = 0, abs_error = 0;
  friend bool operator==(const Mismatch&, const Mismatch&) = default;
};

/// Statistics of the element errors of one tensor over the finite pairs.
struct ErrorStats {
  std::int64_t count = 0;  // finite pairs compared
  double max_abs = 0;
  double max_rel = 0;      // |err| / |ref| over non-zero references
  double rmse = 0;
  double p50 = 0, p99 = 0, p999 = 0;  // percentiles of |err|
  double normwise_rel = 0;            // ||got - ref||_2 / ||ref||_2
  double max_ulp = 0;                 // in the output dtype (a sign flip near 0 is +inf)
  double p99_ulp = 0;                 // the typical worst case, robust to such flips
  double mean_signed = 0;             // mean of got - ref
  double bias_t = 0;                  // t statistic of mean_signed (|t| > 4: biased)
  /// The mean signed error a correctly rounded output would have: mean of
  /// round(ref) - ref in the output dtype. Far from 0 where the references
  /// crowd around one value, so that every element rounds the same way; the
  /// bias check measures the subject's mean error from it (tolerance.hpp).
  double rounding_mean = 0;
  /// How far a faithful output may move the mean error from rounding_mean at
  /// ties: the mean over elements of ulp(ref) where ref lies within
  /// kTieBand ulp of a midpoint between two neighbours of the output grid (0
  /// elsewhere). There either neighbour is what a correct kernel's sub-ulp
  /// arithmetic gives, and a consistent choice moves the mean by up to an ulp
  /// per such element. Where O averages a few grid values, most elements are
  /// ties (tolerance.hpp, the bias check).
  double tie_slack = 0;
  // The same over the pairs whose reference is not 0, of (got - ref) sign(ref):
  // negative where outputs shrink toward zero (a truncating epilogue), whatever
  // the signs of the outputs, which mean_signed averages away.
  std::int64_t magnitude_count = 0;
  double mean_magnitude = 0;
  double magnitude_t = 0;
  double ref_max_abs = 0;             // scale of the reference, for the noise floor
  double ref_rms = 0;
  std::array<std::int64_t, kHistogramBins> histogram{};
  std::array<std::int64_t, kUlpHistogramBins> ulp_histogram{};
  std::optional<Mismatch> worst;
  friend bool operator==(const ErrorStats&, const ErrorStats&) = default;
};

/// NaN/Inf agreement: every element must be of the same class (finite, NaN,
/// +Inf, -Inf) in subject and reference.
struct Census {
  std::int64_t got_nan = 0, got_pos_inf = 0, got_neg_inf = 0;
  std::int64_t want_nan = 0, want_pos_inf = 0, want_neg_inf = 0;
  std::int64_t mismatches = 0;
  std::optional<Mismatch> first_mismatch;
  friend bool operator==(const Census&, const Census&) = default;
};

struct TensorMetrics {
  ErrorStats errors;
  Census census;
  /// Elements whose |err| exceeds `bound` (when one was given), and the first.
  std::int64_t over_bound = 0;
  std::optional<Mismatch> first_over_bound;
  friend bool operator==(const TensorMetrics&, const TensorMetrics&) = default;
};

struct CaseMetrics {
  TensorMetrics o;
  TensorMetrics lse;
  bool has_lse = false;
  std::int64_t rows_compared = 0;
  friend bool operator==(const CaseMetrics&, const CaseMetrics&) = default;
};

/// Bounds to count elements against (see TensorMetrics::over_bound).
struct Bounds {
  std::optional<double> o, lse;
};

/// Half the width, in ulps of the output dtype, of the band around a rounding
/// midpoint in which a reference counts as a tie (ErrorStats::tie_slack).
/// Random references fall in it with probability 2^-5, so the slack is about
/// 3% of an ulp in the mean; a flat softmax over a few keys puts O on midpoints.
inline constexpr double kTieBand = 0x1p-6;

/// What compare() measures. `full` is everything, for records and reports.
/// `rule` is what the tolerance rule and the verdict read (rule_bounds and
/// decide: the extremes below, the moments, RMS, the bias statistics and the
/// tie slack); the percentiles, both histograms, max_ulp and max_rel stay 0.
/// It is the properties' judgement (Testbed), whose failures print the
/// verdict's checks, not the distributions. `extremes` is what the rule reads
/// of a baseline (rule_bounds: max_abs and ref_max_abs) with the NaN/Inf
/// census, the worst element and the count over a bound; every other
/// statistic stays 0, for a property's second baseline (Testbed::baseline_bound).
enum class MetricDepth { full, rule, extremes };

/// Compares `got` with the reference `want` on the rows both hold (the same
/// RowSet). Padding rows are skipped. O errors are measured in `out_dtype`
/// ULPs, LSE in f32 ULPs.
CaseMetrics compare(const Problem& problem, const AttentionRows& got, const AttentionRows& want, DType out_dtype,
                    const Bounds& bounds = {}, MetricDepth depth = MetricDepth::full);

/// The backward's metrics: one TensorMetrics per gradient. Positions are
/// (batch, head, row, column) with the query head and row for dQ, the K/V
/// head and key row for dK and dV.
struct GradientMetrics {
  TensorMetrics dq, dk, dv;
  std::int64_t q_rows_compared = 0;   // valid query rows, over batch and query heads
  std::int64_t kv_rows_compared = 0;  // valid key rows, over batch and K/V heads
  friend bool operator==(const GradientMetrics&, const GradientMetrics&) = default;
};

/// Compares a subject's gradients with the reference on the rows both hold
/// (the same RowSets); padding rows are skipped; ULPs in `out_dtype`.
GradientMetrics compare_gradients(const Problem& problem, const GradientRows& got, const GradientRows& want,
                                  DType out_dtype);

}  // namespace flashcheck
