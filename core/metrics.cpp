#include "flashcheck/core/metrics.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace flashcheck {

namespace {

// The bins' lower edges: 10^(bin - 18) for bins 2..22, each literal the
// double nearest its power of ten. A table, not log10 and pow per element:
// the comparison bins every element, and the two calls were 8% of a CPU
// property test's time (perf, Subject_cpu_plain, 2026-11-27).
constexpr std::array<double, kHistogramBins> kBinFloors = {
    0,     std::numeric_limits<double>::denorm_min(),
    1e-16, 1e-15, 1e-14, 1e-13, 1e-12, 1e-11, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6,
    1e-5,  1e-4,  1e-3,  1e-2,  1e-1,  1e0,   1e1,   1e2,  1e3,  1e4};

}  // namespace

int histogram_bin(double abs_error) {
  if (abs_error == 0) return 0;
  if (!(abs_error < kBinFloors[kHistogramBins - 1])) return kHistogramBins - 1;  // also Inf and NaN
  if (abs_error < kBinFloors[2]) return 1;
  // The last of bins 2..21 whose edge is at or below the error.
  const double* first = kBinFloors.data() + 2;
  const double* last = kBinFloors.data() + kHistogramBins - 1;
  return static_cast<int>(std::upper_bound(first, last, abs_error) - kBinFloors.data()) - 1;
}

double histogram_bin_floor(int bin) { return kBinFloors.at(static_cast<std::size_t>(bin)); }

int ulp_histogram_bin(double ulps) {
  if (ulps == 0) return 0;
  if (!(ulps < 0x1p20)) return kUlpHistogramBins - 1;  // also Inf and NaN
  if (ulps < 0x1p-8) return 1;
  int exponent = 0;
  std::frexp(ulps, &exponent);  // ulps = m * 2^exponent, m in [0.5, 1): ulps in [2^(exponent-1), 2^exponent)
  return std::clamp(exponent - 1 + 10, 2, kUlpHistogramBins - 2);
}

namespace {

enum class ValueClass { finite, nan, pos_inf, neg_inf };

ValueClass classify(double x) {
  if (std::isnan(x)) return ValueClass::nan;
  if (std::isinf(x)) return x > 0 ? ValueClass::pos_inf : ValueClass::neg_inf;
  return ValueClass::finite;
}

// Accumulates one tensor's comparison element by element.
class Accumulator {
 public:
  Accumulator(DType dtype, std::optional<double> bound, MetricDepth depth = MetricDepth::full)
      : dtype_(dtype), bound_(bound), depth_(depth) {}

  /// Room for `count` elements' errors, so that add() does not grow the vectors as it goes.
  void reserve(std::int64_t count) {
    if (depth_ != MetricDepth::full) return;
    abs_errors_.reserve(static_cast<std::size_t>(count));
    ulp_errors_.reserve(static_cast<std::size_t>(count));
  }

  void add(const Position& at, double got, double want) {
    const ValueClass got_class = classify(got), want_class = classify(want);
    count_class(got_class, metrics_.census.got_nan, metrics_.census.got_pos_inf, metrics_.census.got_neg_inf);
    count_class(want_class, metrics_.census.want_nan, metrics_.census.want_pos_inf, metrics_.census.want_neg_inf);
    if (got_class != want_class) {
      ++metrics_.census.mismatches;
      if (!metrics_.census.first_mismatch)
        metrics_.census.first_mismatch = Mismatch{at, got, want, std::numeric_limits<double>::infinity()};
      return;
    }
    if (got_class != ValueClass::finite) return;  // same NaN/Inf class: agreement
    const double error = got - want;
    const double abs_error = std::fabs(error);
    auto& stats = metrics_.errors;
    ++stats.count;
    if (depth_ == MetricDepth::extremes) {
      add_extremes(at, got, want, abs_error);
      return;
    }
    sum_sq_error_ += error * error;
    sum_sq_ref_ += want * want;
    // Welford's update of the signed error's mean and variance: the textbook
    // sum-of-squares formula cancels catastrophically for a constant offset.
    const double delta = error - mean_error_;
    mean_error_ += delta / static_cast<double>(stats.count);
    const double rounded = round_to(dtype_, want);
    rounding_mean_ += (rounded - want - rounding_mean_) / static_cast<double>(stats.count);
    if (std::isfinite(rounded)) {
      const double spacing = ulp_at(dtype_, want);
      if (std::fabs(std::fabs(want - rounded) - spacing / 2) <= kTieBand * spacing) tie_slack_sum_ += spacing;
    }
    m2_error_ += delta * (error - mean_error_);
    if (want != 0) {
      const double outward = want > 0 ? error : -error;
      ++stats.magnitude_count;
      const double step = outward - mean_outward_;
      mean_outward_ += step / static_cast<double>(stats.magnitude_count);
      m2_outward_ += step * (outward - mean_outward_);
    }
    add_extremes(at, got, want, abs_error);
    if (depth_ != MetricDepth::full) return;
    abs_errors_.push_back(abs_error);
    if (want != 0) stats.max_rel = std::max(stats.max_rel, abs_error / std::fabs(want));
    const double ulps = ulp_distance(dtype_, got, want);
    stats.max_ulp = std::max(stats.max_ulp, ulps);
    ulp_errors_.push_back(ulps);
    ++stats.histogram[histogram_bin(abs_error)];
    ++stats.ulp_histogram[ulp_histogram_bin(ulps)];
  }

  TensorMetrics finish() {
    auto& stats = metrics_.errors;
    const auto n = static_cast<double>(stats.count);
    if (stats.count > 0) stats.max_abs = stats.worst->abs_error;
    if (stats.count > 0 && depth_ != MetricDepth::extremes) {
      stats.rmse = std::sqrt(sum_sq_error_ / n);
      stats.ref_rms = std::sqrt(sum_sq_ref_ / n);
      stats.normwise_rel = sum_sq_ref_ > 0 ? std::sqrt(sum_sq_error_ / sum_sq_ref_)
                                           : (sum_sq_error_ > 0 ? std::numeric_limits<double>::infinity() : 0.0);
      stats.mean_signed = mean_error_;
      stats.rounding_mean = rounding_mean_;
      stats.tie_slack = tie_slack_sum_ / n;
      stats.bias_t = t_statistic(mean_error_, m2_error_, stats.count);
      stats.mean_magnitude = mean_outward_;
      stats.magnitude_t = t_statistic(mean_outward_, m2_outward_, stats.magnitude_count);
    }
    if (stats.count > 0 && depth_ == MetricDepth::full) {
      const std::array<double, 3> p = percentiles<3>(abs_errors_, {0.5, 0.99, 0.999});
      stats.p50 = p[0];
      stats.p99 = p[1];
      stats.p999 = p[2];
      stats.p99_ulp = percentiles<1>(ulp_errors_, {0.99})[0];
    }
    return metrics_;
  }

 private:
  // What both depths keep: the reference's largest magnitude, the worst
  // element and the elements over the bound.
  void add_extremes(const Position& at, double got, double want, double abs_error) {
    auto& stats = metrics_.errors;
    stats.ref_max_abs = std::max(stats.ref_max_abs, std::fabs(want));
    if (!stats.worst || abs_error > stats.worst->abs_error) stats.worst = Mismatch{at, got, want, abs_error};
    if (bound_ && abs_error > *bound_) {
      ++metrics_.over_bound;
      if (!metrics_.first_over_bound) metrics_.first_over_bound = Mismatch{at, got, want, abs_error};
    }
  }

  static void count_class(ValueClass c, std::int64_t& nan, std::int64_t& pos_inf, std::int64_t& neg_inf) {
    if (c == ValueClass::nan) ++nan;
    if (c == ValueClass::pos_inf) ++pos_inf;
    if (c == ValueClass::neg_inf) ++neg_inf;
  }

  // Nearest-rank percentiles, for increasing q: each selection searches only
  // past the one before (nth_element leaves nothing smaller after it), so
  // three cost about 1.5 passes over the values, not 3.
  template <std::size_t N>
  static std::array<double, N> percentiles(std::vector<double>& values, const std::array<double, N>& q) {
    std::array<double, N> result{};
    const auto n = values.size();
    auto from = values.begin();
    for (std::size_t i = 0; i < N; ++i) {
      const auto rank = static_cast<std::size_t>(std::ceil(q[i] * static_cast<double>(n)));
      const auto at = values.begin() + static_cast<std::ptrdiff_t>(std::min(n - 1, rank == 0 ? 0 : rank - 1));
      if (at >= from) {
        std::nth_element(from, at, values.end());
        from = at + 1;
      }
      result[i] = *at;
    }
    return result;
  }

  DType dtype_;
  std::optional<double> bound_;
  MetricDepth depth_;
  TensorMetrics metrics_;
  std::vector<double> abs_errors_, ulp_errors_;
  double sum_sq_error_ = 0, sum_sq_ref_ = 0;
  double rounding_mean_ = 0;
  double tie_slack_sum_ = 0;
  double mean_error_ = 0, m2_error_ = 0;
  double mean_outward_ = 0, m2_outward_ = 0;

  // The t statistic of a mean from Welford's sums over `count` values
  // (infinite for a non-zero mean of identical values; 0 below two values).
  static double t_statistic(double mean, double m2, std::int64_t count) {
    if (count < 2) return 0;
    const auto n = static_cast<double>(count);
    const double standard_error = std::sqrt(m2 / (n - 1) / n);
    if (standard_error > 0) return mean / standard_error;
    return mean != 0 ? std::copysign(std::numeric_limits<double>::infinity(), mean) : 0.0;
  }
};

}  // namespace

CaseMetrics compare(const Problem& p, const AttentionRows& got, const AttentionRows& want, DType out_dtype,
                    const Bounds& bounds, MetricDepth depth) {
  Accumulator o(out_dtype, bounds.o, depth), lse(DType::f32, bounds.lse, depth);
  CaseMetrics metrics;
  metrics.has_lse = got.has_lse && want.has_lse;
  const std::int64_t rows = p.batch * p.heads_q * want.rows.size();
  o.reserve(rows * p.head_dim_v);
  if (metrics.has_lse) lse.reserve(rows);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < want.rows.size(); ++r) {
        const std::int64_t row = want.rows.rows[r];
        if (row >= p.len_q(b)) continue;  // padding
        if (h == 0) ++metrics.rows_compared;
        const double* got_row = got.o_row(b, h, r);
        const double* want_row = want.o_row(b, h, r);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) o.add({b, h, row, c}, got_row[c], want_row[c]);
        if (metrics.has_lse) lse.add({b, h, row, -1}, got.lse[got.index(b, h, r)], want.lse[want.index(b, h, r)]);
      }
  metrics.rows_compared *= p.heads_q;
  metrics.o = o.finish();
  metrics.lse = lse.finish();
  return metrics;
}

GradientMetrics compare_gradients(const Problem& p, const GradientRows& got, const GradientRows& want,
                                  DType out_dtype) {
  Accumulator dq(out_dtype, std::nullopt), dk(out_dtype, std::nullopt), dv(out_dtype, std::nullopt);
  // A gradient past the dtype's range can only be stored as an infinity (a
  // forward's O never leaves V's range; a gradient can): a subject that
  // stores that infinity agrees; one that stores a finite value near the
  // edge is measured against the finite f64 value, by the rule.
  const auto stored = [out_dtype](double got, double want) {
    const double rounded = round_to(out_dtype, want);
    return std::isinf(rounded) && got == rounded ? rounded : want;
  };
  GradientMetrics metrics;
  // Each gradient's elements reach its accumulator in the order they always
  // did (batch, head, row, column), so the three can fill at once: the same
  // metrics, bit for bit, in about half the time where dK and dV hold every
  // key row (two 16.7M-element tensors at 131072 keys, d = 128, two heads).
  // Room for every element first: no allocation inside the parallel region.
  const std::int64_t q_elements = p.batch * p.heads_q * want.q_rows.size() * p.head_dim;
  const std::int64_t kv_rows = p.batch * p.heads_kv * want.kv_rows.size();
  dq.reserve(q_elements);
  dk.reserve(kv_rows * p.head_dim);
  dv.reserve(kv_rows * p.head_dim_v);
  const auto fill_dq = [&] {
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t r = 0; r < want.q_rows.size(); ++r) {
          const std::int64_t row = want.q_rows.rows[r];
          if (row >= p.len_q(b)) continue;  // padding
          ++metrics.q_rows_compared;
          const double* got_row = got.dq_row(b, h, r);
          const double* want_row = want.dq_row(b, h, r);
          for (std::int64_t c = 0; c < p.head_dim; ++c) dq.add({b, h, row, c}, got_row[c], stored(got_row[c], want_row[c]));
        }
  };
  const auto fill_kv = [&](Accumulator& into, bool keys_gradient) {
    const std::int64_t width = keys_gradient ? p.head_dim : p.head_dim_v;
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_kv; ++h)
        for (std::int64_t r = 0; r < want.kv_rows.size(); ++r) {
          const std::int64_t row = want.kv_rows.rows[r];
          if (row >= p.len_kv(b)) continue;
          if (keys_gradient) ++metrics.kv_rows_compared;
          const double* got_row = keys_gradient ? got.dk_row(b, h, r) : got.dv_row(b, h, r);
          const double* want_row = keys_gradient ? want.dk_row(b, h, r) : want.dv_row(b, h, r);
          for (std::int64_t c = 0; c < width; ++c) into.add({b, h, row, c}, got_row[c], stored(got_row[c], want_row[c]));
        }
  };
  // Threads only where there is enough to share (a property's small cases stay on one), and
  // only the ones OMP_NUM_THREADS grants (one under ctest's budget).
  const bool large = kv_rows * (p.head_dim + p.head_dim_v) + q_elements > (std::int64_t{1} << 20);
#pragma omp parallel sections if (large)
  {
#pragma omp section
    fill_dq();
#pragma omp section
    fill_kv(dk, true);
#pragma omp section
    fill_kv(dv, false);
  }
  metrics.dq = dq.finish();
  metrics.dk = dk.finish();
  metrics.dv = dv.finish();
  return metrics;
}

}  // namespace flashcheck
