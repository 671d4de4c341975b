// The Problem line: its printed form, defaults, and one clear BadInput per
// kind of bad input, naming the field.
#include <gtest/gtest.h>

#include <string>

#include "core/problem.hpp"

namespace flashcheck {
namespace {

TEST(ProblemTest, PrintsEveryFieldOnOneLine) {
  Problem p = make_problem(2, 8, 2, 128, 256, 64, DType::bf16, MaskKind::causal_br);
  p.lens_q = {100, 128};
  p.lens_kv = {0, 256};
  p.geometry_seed = 3;
  p.data_seed = 7;
  EXPECT_EQ(to_line(p),
            "b=2 hq=8 hkv=2 sq=128 skv=256 lens_q=100,128 lens_kv=0,256 d=64 dv=64 dtype=bf16 layout=bhsd "
            "mask=causal_br scale=0.125 values=normal(0.5,1) gseed=3 dseed=7");
  EXPECT_EQ(parse_problem(to_line(p)), p);
}

TEST(ProblemTest, WindowAndValuesRoundTrip) {
  Problem p = make_problem(1, 4, 1, 33, 17, 40, DType::f16, MaskKind::window);
  p.head_dim_v = 24;
  p.window_left = 5;
  p.window_right = -1;
  p.layout = Layout::bshd;
  p.softmax_scale = 0.1234567890123;
  p.values = ValueDist{ValueFamily::outliers, {0.001, 100}};
  const Problem parsed = parse_problem(to_line(p));
  EXPECT_EQ(parsed, p) << to_line(p);
  EXPECT_NE(to_line(p).find("window=5,-1"), std::string::npos);
}

TEST(ProblemTest, OptionalFieldsTakeTheirDefaults) {
  const Problem p = parse_problem("b=1 hq=4 sq=10 skv=12 d=16 dtype=f32");
  EXPECT_EQ(p.heads_kv, 4);
  EXPECT_EQ(p.head_dim_v, 16);
  EXPECT_EQ(p.layout, Layout::bhsd);
  EXPECT_EQ(p.mask, MaskKind::none);
  EXPECT_DOUBLE_EQ(p.softmax_scale, 0.25);
  EXPECT_EQ(p.values.family, ValueFamily::normal);
  EXPECT_EQ(p.geometry_seed, 0u);
  EXPECT_EQ(parse_problem("b=1 hq=1 sq=1 skv=1 d=8 dtype=f16 values=dominant").values.params,
            std::vector<double>{30.0});
}

struct BadLine {
  const char* line;
  const char* field;
  const char* reason_fragment;
};

void PrintTo(const BadLine& bad, std::ostream* os) { *os << "'" << bad.line << "'"; }

class ProblemBadInputTest : public testing::TestWithParam<BadLine> {};

TEST_P(ProblemBadInputTest, NamesTheFieldInOneLine) {
  const BadLine& bad = GetParam();
  try {
    parse_problem(bad.line);
    FAIL() << "accepted: " << bad.line;
  } catch (const BadInput& error) {
    EXPECT_EQ(error.field(), bad.field) << error.what();
    const std::string message = error.what();
    EXPECT_NE(message.find(bad.reason_fragment), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Lines, ProblemBadInputTest,
    testing::Values(
        BadLine{"", "b", "missing"},
        BadLine{"b=1 hq=8 hkv=2 sq=12", "skv", "truncated"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf", "dtype", "unknown dtype 'bf'"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 mask=diagonal", "mask", "unknown mask"},
        BadLine{"b=-1 hq=8 sq=12 skv=12 d=64 dtype=bf16", "b", "must be >= 1"},
        BadLine{"b=1 hq=8 sq=-5 skv=12 d=64 dtype=bf16", "sq", "must be >= 0"},
        BadLine{"b=1 hq=8 sq=5 skv=12 d=0 dtype=bf16", "d", "must be >= 1"},
        BadLine{"b=1 hq=8 hkv=3 sq=12 skv=12 d=64 dtype=bf16", "hkv", "not a multiple"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 mask=causal_tl window=4,0", "window", "only valid with mask=window"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 mask=window", "window", "needs window"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 mask=window window=4", "window", "two bounds"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 mask=window window=-3,0", "window", ">= 0"},
        BadLine{"b=1000000 hq=1000 sq=1000000 skv=1000000 d=512 dtype=f32", "size", "GiB"},
        BadLine{"b=1 hq=8 sq=3000000000 skv=12 d=64 dtype=bf16", "sq", "too large"},
        BadLine{"b=2 hq=8 sq=12 skv=12 lens_q=3 d=64 dtype=bf16", "lens_q", "lengths for a batch of 2"},
        BadLine{"b=1 hq=8 sq=12 skv=12 lens_kv=13 d=64 dtype=bf16", "lens_kv", "outside [0, 12]"},
        BadLine{"b=1 b=2 hq=8 sq=12 skv=12 d=64 dtype=bf16", "b", "given twice"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 colour=red", "colour", "unknown field"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 values=gauss(0,1)", "values", "unknown value distribution"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 values=normal(0", "values", "closing parenthesis"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 values=normal(0,1,2)", "values", "takes 2 parameter"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 scale=0", "scale", "positive"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 scale=nan", "scale", "positive finite"},
        BadLine{"b=1 hq=8 sq=12 skv=1x2 d=64 dtype=bf16", "skv", "not an integer"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 gseed=-1", "gseed", "non-negative"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=bf16 dseed=", "dseed", "no value"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 bf16", "bf16", "key=value"},
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=f16 =3", "line", "no key"}));

}  // namespace
}  // namespace flashcheck

namespace flashcheck {
namespace {

TEST(ProblemTest, FlopsCountOnlyVisiblePairs) {
  Problem p = make_problem(2, 3, 3, 4, 4, 8, DType::bf16);
  EXPECT_EQ(visible_pairs(p), 2 * 3 * 16);
  EXPECT_EQ(attention_flops(p), 4.0 * 2 * 3 * 4 * 4 * 8);
  p.mask = MaskKind::causal_tl;
  EXPECT_EQ(visible_pairs(p), 2 * 3 * (1 + 2 + 3 + 4));
  p.seqlen_kv = 6;  // bottom-right: row i sees i + 3 keys
  p.mask = MaskKind::causal_br;
  EXPECT_EQ(visible_pairs(p), 2 * 3 * (3 + 4 + 5 + 6));
  p.mask = MaskKind::window;
  p.window_left = 1;
  p.window_right = 0;  // two keys each (diagonal and one left of it)
  EXPECT_EQ(visible_pairs(p), 2 * 3 * 4 * 2);
  p.lens_q = {4, 0};
  p.lens_kv = {6, 6};
  EXPECT_EQ(visible_pairs(p), 3 * 4 * 2);
  p.head_dim_v = 16;
  EXPECT_EQ(attention_flops(p), 2.0 * (8 + 16) * 3 * 4 * 2);
}

}  // namespace
}  // namespace flashcheck
