// Value distributions: deterministic, independent of threads and layout, and
// each family has the shape it promises.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

#include "flashcheck/core/values.hpp"

namespace flashcheck {
namespace {

Problem problem_with(ValueFamily family, std::vector<double> params, DType dtype = DType::f32) {
  Problem p = make_problem(2, 4, 2, 64, 96, 32, dtype);
  p.values = ValueDist{family, std::move(params)};
  p.data_seed = 11;
  p.geometry_seed = 5;
  return p;
}

std::vector<double> all_values(const HostTensor& t) {
  std::vector<double> values(static_cast<std::size_t>(t.size()));
  for (std::int64_t i = 0; i < t.size(); ++i) values[i] = t.load(i);
  return values;
}

TEST(ValuesTest, SameSeedsGiveTheSameInputs) {
  const Problem p = problem_with(ValueFamily::outliers, {0.01, 100}, DType::bf16);
  const Inputs a = generate_inputs(p), b = generate_inputs(p);
  EXPECT_TRUE(a.q == b.q && a.k == b.k && a.v == b.v);
  Problem other = p;
  other.data_seed = 12;
  EXPECT_FALSE(generate_inputs(other).q == a.q);
}

TEST(ValuesTest, IndependentOfTheThreadCount) {
  const int threads = omp_get_max_threads();
  for (ValueFamily family : {ValueFamily::normal, ValueFamily::heavy, ValueFamily::ties, ValueFamily::nan_inf}) {
    const Problem p = problem_with(family, default_params(family), DType::f16);
    omp_set_num_threads(1);
    const Inputs one = generate_inputs(p);
    omp_set_num_threads(std::max(2, threads));
    const Inputs many = generate_inputs(p);
    EXPECT_TRUE(one.q == many.q && one.k == many.k && one.v == many.v) << to_string(family);
  }
  omp_set_num_threads(threads);
}

TEST(ValuesTest, TensorEqualityIsBitwise) {
  const Problem p = problem_with(ValueFamily::nan_inf, {0.05}, DType::f32);
  const Inputs a = generate_inputs(p);
  EXPECT_TRUE(a.q == generate_inputs(p).q) << "NaN payloads must compare equal bit for bit";
  HostTensor zero(DType::f32, Layout::bhsd, 1, 1, 1, 1), negative_zero = zero;
  negative_zero.store(0, -0.0);
  EXPECT_FALSE(zero == negative_zero) << "+0 and -0 differ in their bits";
}

TEST(ValuesTest, IndependentOfTheLayout) {
  Problem p = problem_with(ValueFamily::normal, {0.5, 1});
  const Inputs bhsd = generate_inputs(p);
  p.layout = Layout::bshd;
  const Inputs bshd = generate_inputs(p);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t s = 0; s < p.seqlen_q; ++s)
        for (std::int64_t c = 0; c < p.head_dim; ++c) ASSERT_EQ(bhsd.q.get(b, h, s, c), bshd.q.get(b, h, s, c));
}

TEST(ValuesTest, NormalHasItsMeanAndSpread) {
  const Inputs in = generate_inputs(problem_with(ValueFamily::normal, {0.5, 2.0}));
  const auto values = all_values(in.q);
  double sum = 0, sum_sq = 0;
  for (double x : values) sum += x;
  const double mean = sum / values.size();
  for (double x : values) sum_sq += (x - mean) * (x - mean);
  const double std = std::sqrt(sum_sq / values.size());
  EXPECT_NEAR(mean, 0.5, 0.05);
  EXPECT_NEAR(std, 2.0, 0.05);
}

TEST(ValuesTest, SparseIntegersAreSmallExactIntegers) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Inputs in = generate_inputs(problem_with(ValueFamily::sparse_int, {3, 0.25}, dtype));
    const auto values = all_values(in.k);
    std::size_t nonzero = 0;
    for (double x : values) {
      ASSERT_EQ(x, std::round(x));
      ASSERT_LE(std::fabs(x), 3.0);
      nonzero += x != 0;
    }
    EXPECT_NEAR(static_cast<double>(nonzero) / values.size(), 0.25, 0.03);
  }
}

TEST(ValuesTest, SubnormalValuesAreSubnormalInEveryDtype) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Inputs in = generate_inputs(problem_with(ValueFamily::subnormal, {}, dtype));
    std::size_t nonzero = 0;
    for (const HostTensor* t : {&in.q, &in.k, &in.v})
      for (double x : all_values(*t)) {
        ASSERT_LT(std::fabs(x), min_normal(dtype)) << to_string(dtype);
        nonzero += x != 0;
      }
    EXPECT_GT(nonzero, 0u);
  }
}

TEST(ValuesTest, TiesRepeatKeyRowsExactly) {
  const Problem p = problem_with(ValueFamily::ties, {3});
  const Inputs in = generate_inputs(p);
  for (std::int64_t h = 0; h < p.heads_kv; ++h) {
    std::set<std::vector<double>> distinct;
    for (std::int64_t j = 0; j < p.seqlen_kv; ++j) {
      std::vector<double> row(static_cast<std::size_t>(p.head_dim));
      in.k.read_row(0, h, j, row.data());
      distinct.insert(row);
    }
    EXPECT_LE(distinct.size(), 3u);
    EXPECT_GE(distinct.size(), 2u);
  }
}

// Logits of one query row against every key.
std::vector<double> logits(const Problem& p, const Inputs& in, std::int64_t b, std::int64_t h, std::int64_t i) {
  std::vector<double> s(static_cast<std::size_t>(p.seqlen_kv));
  for (std::int64_t j = 0; j < p.seqlen_kv; ++j) {
    double dot = 0;
    for (std::int64_t c = 0; c < p.head_dim; ++c) dot += in.q.get(b, h, i, c) * in.k.get(b, h / p.group_size(), j, c);
    s[j] = p.softmax_scale * dot;
  }
  return s;
}

TEST(ValuesTest, DominantKeyWinsEveryRowByTheGap) {
  const Problem p = problem_with(ValueFamily::dominant, {30});
  const Inputs in = generate_inputs(p);
  for (std::int64_t i = 0; i < p.seqlen_q; i += 7) {
    auto s = logits(p, in, 1, 3, i);
    std::sort(s.begin(), s.end());
    EXPECT_NEAR(s.back() - s[s.size() - 2], 30.0, 0.5);
  }
}

TEST(ValuesTest, LateMaximumArrivesInTheLastKeyTile) {
  const Problem p = problem_with(ValueFamily::late_max, {16, 8});
  const Inputs in = generate_inputs(p);
  for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
    const auto s = logits(p, in, 0, 1, i);
    const auto argmax = std::max_element(s.begin(), s.end()) - s.begin();
    EXPECT_GE(argmax, p.seqlen_kv - 16) << "row " << i;
  }
}

TEST(ValuesTest, NanInfInjectsSpecialValues) {
  const Problem p = problem_with(ValueFamily::nan_inf, {0.0});  // only the forced one
  const Inputs in = generate_inputs(p);
  std::size_t special = 0;
  for (double x : all_values(in.v)) special += !std::isfinite(x);
  EXPECT_EQ(special, 1u);
  const Inputs many = generate_inputs(problem_with(ValueFamily::nan_inf, {0.01}));
  std::size_t nans = 0, infs = 0;
  for (const HostTensor* t : {&many.q, &many.k, &many.v})
    for (double x : all_values(*t)) {
      nans += std::isnan(x);
      infs += std::isinf(x);
    }
  EXPECT_GT(nans, 0u);
  EXPECT_GT(infs, 0u);
}

TEST(ValuesTest, NearOverflowValuesApproachTheDtypeMaximum) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Inputs in = generate_inputs(problem_with(ValueFamily::near_overflow, {1000, 0.5}, dtype));
    for (double x : all_values(in.v)) {
      ASSERT_GE(std::fabs(x), 0.24 * max_finite(dtype));
      ASSERT_TRUE(std::isfinite(x));
    }
  }
}

TEST(ValuesTest, OutliersAndHeavyTailsHaveLargeValues) {
  const auto outliers = all_values(generate_inputs(problem_with(ValueFamily::outliers, {0.01, 100})).q);
  double largest = 0;
  for (double x : outliers) largest = std::max(largest, std::fabs(x));
  EXPECT_GT(largest, 20.0);
  const auto heavy = all_values(generate_inputs(problem_with(ValueFamily::heavy, {3})).q);
  double m2 = 0, m4 = 0;
  for (double x : heavy) {
    m2 += x * x;
    m4 += x * x * x * x;
  }
  m2 /= heavy.size();
  m4 /= heavy.size();
  EXPECT_GT(m4 / (m2 * m2), 4.0);  // kurtosis of a normal is 3
}

TEST(ValuesTest, ValuesAreRepresentableInTheDtype) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Inputs in = generate_inputs(problem_with(ValueFamily::normal, {0.5, 1}, dtype));
    for (double x : all_values(in.q)) ASSERT_EQ(round_to(dtype, x), x);
  }
}

// fp8 inputs: each tensor's descale is the power of two that puts its largest
// |x| in the format's top binade, every value is stored x descale exactly,
// and a paged pool (and the logical K/V read back from it) keeps the factor.
TEST(ValuesTest, Fp8InputsCarryAPowerOfTwoDescale) {
  for (DType dtype : {DType::e4m3, DType::e5m2}) {
    Problem p = make_problem(2, 4, 2, 40, 70, 32, dtype, MaskKind::causal_br);
    p.values = {ValueFamily::normal, {0.5, 3.0}};
    const Inputs in = generate_inputs(p);
    for (const HostTensor* t : {&in.q, &in.k, &in.v}) {
      ASSERT_EQ(t->dtype(), dtype);
      ASSERT_EQ(t->bytes(), t->size());
      int exponent = 0;
      EXPECT_EQ(std::frexp(t->descale(), &exponent), 0.5) << "not a power of two: " << t->descale();
      const double amax = max_abs_finite(*t);
      EXPECT_GT(amax, max_finite(dtype) / 2 * t->descale());
      EXPECT_LE(amax, max_finite(dtype) * t->descale());
      for (std::int64_t n = 0; n < t->size(); n += 7) {
        EXPECT_EQ(t->load(n), t->stored(n) * t->descale());
        EXPECT_EQ(round_to(dtype, t->stored(n)), t->stored(n));
      }
    }
    EXPECT_NE(in.q.descale(), 1.0);  // normal(0.5, 3) reaches past 1: not left at 1 by accident
    Problem paged = p;
    paged.page_size = 16;
    const Inputs pool = generate_inputs(paged);
    EXPECT_EQ(pool.k.descale(), in.k.descale());
    EXPECT_EQ(pool.v.descale(), in.v.descale());
    const Inputs logical = logical_inputs(paged, pool);
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t j = 0; j < p.len_kv(b); ++j)
        for (std::int64_t c = 0; c < p.head_dim; c += 5) EXPECT_EQ(logical.k.get(b, 1, j, c), in.k.get(b, 1, j, c));
  }
}

// set_descale refuses a factor on a non-fp8 tensor and a non-positive one.
TEST(ValuesTest, DescaleIsForFp8TensorsOnly) {
  HostTensor bf16(DType::bf16, Layout::bhsd, 1, 1, 2, 2);
  EXPECT_THROW(bf16.set_descale(2.0), std::invalid_argument);
  EXPECT_NO_THROW(bf16.set_descale(1.0));
  HostTensor e4m3(DType::e4m3, Layout::bhsd, 1, 1, 2, 2);
  EXPECT_THROW(e4m3.set_descale(0.0), std::invalid_argument);
  EXPECT_THROW(e4m3.set_descale(NAN), std::invalid_argument);
  e4m3.set_descale(0.25);
  e4m3.set(0, 0, 1, 1, 104.0);  // 416 stored: 104 exactly
  EXPECT_EQ(e4m3.get(0, 0, 1, 1), 104.0);
  EXPECT_EQ(e4m3.stored(e4m3.offset(0, 0, 1, 1)), 416.0);
  e4m3.set(0, 0, 1, 0, 100.0);  // 400 rounds to 384 (the spacing is 32 above 256): 96
  EXPECT_EQ(e4m3.get(0, 0, 1, 0), 96.0);
  e4m3.set(0, 0, 0, 0, 1000.0);  // 4000 saturates at 448: 112
  EXPECT_EQ(e4m3.get(0, 0, 0, 0), 112.0);
}

}  // namespace
}  // namespace flashcheck
