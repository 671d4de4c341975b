// The oracle's vectorized exp against libm's, over the softmax domain and the
// special values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "flashcheck/core/random.hpp"
#include "flashcheck/oracles/exp_f64.hpp"

namespace flashcheck {
namespace {

// |a - b| in units of the spacing of doubles at b.
double ulps(double a, double b) {
  if (a == b) return 0;
  return std::fabs(a - b) / (std::nextafter(std::fabs(b), std::numeric_limits<double>::infinity()) - std::fabs(b));
}

TEST(ExpTest, WithinOneUlpOfLibmOnTheSoftmaxDomain) {
  const CounterRng rng(42, 1);
  std::vector<double> x;
  for (std::uint64_t i = 0; i < 1'000'000; ++i) {
    const double u = rng.uniform(i);
    // Mostly the range that matters (-40, 0], plus the whole finite range down to underflow.
    x.push_back(i % 4 == 0 ? -745.0 * u : -40.0 * u);
  }
  for (double edge : {0.0, -0.0, -1e-300, -0x1p-60, -0.34657359027997264, -0.34657359027997270, -708.0, -708.0001,
                      -709.0, -744.4, -745.2, -746.0, -1000.0, 1.0, 700.0, 709.0, 709.5, 710.0, 1e10})
    x.push_back(edge);
  std::vector<double> y = x;
  exp_in_place(y.data(), static_cast<std::int64_t>(y.size()));
  double worst = 0;
  std::size_t worst_at = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double error = ulps(y[i], std::exp(x[i]));
    if (error > worst) {
      worst = error;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, 1.0) << "at x = " << x[worst_at] << ": " << y[worst_at] << " vs " << std::exp(x[worst_at]);
}

TEST(ExpTest, SpecialValuesFollowIeee) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x = {-inf, inf, std::nan(""), 0.0, -800.0, 800.0};
  exp_in_place(x.data(), static_cast<std::int64_t>(x.size()));
  EXPECT_EQ(x[0], 0.0);
  EXPECT_EQ(x[1], inf);
  EXPECT_TRUE(std::isnan(x[2]));
  EXPECT_EQ(x[3], 1.0);
  EXPECT_EQ(x[4], 0.0);
  EXPECT_EQ(x[5], inf);
}

TEST(ExpTest, EveryLengthIsHandled) {
  for (std::int64_t n : {0, 1, 3, 255, 256, 257, 1000}) {
    std::vector<double> x(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) x[i] = -0.01 * static_cast<double>(i);
    exp_in_place(x.data(), n);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_LE(ulps(x[i], std::exp(-0.01 * static_cast<double>(i))), 1.0) << n;
  }
}

}  // namespace
}  // namespace flashcheck
