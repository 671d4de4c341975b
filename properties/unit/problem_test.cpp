// The Problem line: its printed form, defaults, and one clear BadInput per
// kind of bad input, naming the field.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "flashcheck/core/problem.hpp"

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

TEST(ProblemTest, ABackwardProblemNamesItsPassAndDoutAndAForwardOneNeither) {
  Problem p = make_problem(1, 4, 2, 33, 17, 64, DType::bf16, MaskKind::causal_br);
  EXPECT_EQ(to_line(p).find("pass="), std::string::npos);  // forward lines read as before
  p.pass = Pass::bwd;
  EXPECT_NE(to_line(p).find(" pass=bwd dout=normal(0,1) "), std::string::npos) << to_line(p);
  p.dout = ValueDist{ValueFamily::outliers, {0.01, 50}};
  EXPECT_EQ(parse_problem(to_line(p)), p) << to_line(p);
  const Problem defaults = parse_problem("b=1 hq=1 sq=3 skv=3 d=8 dtype=f16 pass=bwd");
  EXPECT_EQ(defaults.pass, Pass::bwd);
  EXPECT_EQ(defaults.dout, (ValueDist{ValueFamily::normal, {0.0, 1.0}}));
  EXPECT_EQ(parse_problem("b=1 hq=1 sq=3 skv=3 d=8 dtype=f16 pass=fwd").pass, Pass::fwd);
}

TEST(ProblemTest, SoftcapAndAlibiRoundTripAndAreLeftOutWhenOff) {
  Problem p = make_problem(1, 8, 2, 33, 40, 64, DType::bf16, MaskKind::causal_br);
  EXPECT_EQ(to_line(p).find("softcap"), std::string::npos);
  EXPECT_EQ(to_line(p).find("alibi"), std::string::npos);
  p.softcap = 30;
  p.alibi = true;
  EXPECT_NE(to_line(p).find(" softcap=30 alibi=yes "), std::string::npos) << to_line(p);
  EXPECT_EQ(parse_problem(to_line(p)), p) << to_line(p);
  p.softcap = 0.1234567890123;
  EXPECT_EQ(parse_problem(to_line(p)), p) << to_line(p);
  EXPECT_FALSE(parse_problem("b=1 hq=1 sq=3 skv=3 d=8 dtype=f16 alibi=no").alibi);
}

// The standard ALiBi slopes (Press et al.'s get_slopes): 8 heads 2^-1 ... 2^-8;
// 12 heads: the 8 of 8 heads, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (every
// other slope of 16 heads).
TEST(ProblemTest, AlibiSlopesAreTheStandardOnes) {
  for (std::int64_t h = 0; h < 8; ++h) EXPECT_EQ(alibi_slope(8, h), std::exp2(-static_cast<double>(h + 1))) << h;
  for (std::int64_t h = 0; h < 8; ++h) EXPECT_EQ(alibi_slope(12, h), std::exp2(-static_cast<double>(h + 1))) << h;
  for (std::int64_t h = 8; h < 12; ++h)
    EXPECT_DOUBLE_EQ(alibi_slope(12, h), std::exp2(-0.5 - static_cast<double>(h - 8))) << h;
  EXPECT_EQ(alibi_slope(1, 0), 1.0 / 256);
  EXPECT_DOUBLE_EQ(alibi_slope(16, 0), std::exp2(-0.5));
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
        BadLine{"b=1 hq=8 sq=12 skv=12 d=64 dtype=f16 =3", "line", "no key"},
        // Magnitudes past the type a value becomes are refused, never converted
        // (issue 21: sparse_int(1e19,1) and ties(1e300) died of SIGFPE).
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 values=sparse_int(1e19,1)", "values", "sparse_int's max 1e+19"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 values=sparse_int(-1e19,1)", "values", "2^53"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 values=ties(1e300)", "values", "ties's distinct 1e+300"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 values=late_max(1e300,8)", "values", "late_max's tile"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 values=normal(1e400,1)", "values", "outside the range of a double"},
        BadLine{"b=99999999999999999999 hq=1 sq=4 skv=4 d=16 dtype=f16", "b", "outside the 64-bit integer range"},
        BadLine{"b=1 hq=-9223372036854775809 sq=4 skv=4 d=16 dtype=f16", "hq", "outside the 64-bit integer range"},
        BadLine{"b=1 hq=1 sq=4 skv=4 lens_q=99999999999999999999 d=16 dtype=f16", "lens_q", "64-bit integer range"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 gseed=18446744073709551616", "gseed", "above the 64-bit seed range"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 scale=1e400", "scale", "outside the range of a double"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 scale=inf", "scale", "positive finite"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 mask=window window=9223372036854775807,0", "window", "below 2^31"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 mask=window window=0,4294967296", "window", "below 2^31"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 pass=backward", "pass", "unknown pass 'backward'"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 dout=normal(0,1)", "dout", "pass=bwd only"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 pass=bwd dout=gauss", "dout", "unknown value distribution"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 pass=bwd dout=sparse_int(1e19,1)", "dout", "2^53"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 softcap=0", "softcap", "must be positive"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 softcap=-30", "softcap", "must be positive"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 softcap=inf", "softcap", "positive finite"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 softcap=x", "softcap", "not a number"},
        BadLine{"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 alibi=true", "alibi", "unknown value 'true' (known: yes, no)"}));

// A token of 128 KiB is quoted by its first 80 characters at most.
TEST(ProblemTest, AnErrorQuotesAtMost80CharactersOfAToken) {
  const std::string huge(128 * 1024, '7');
  for (const std::string& line :
       {"b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 colour" + huge + "=1", "b=1 hq=1 sq=" + huge + "x skv=4 d=16 dtype=f16",
        "b=1 hq=1 sq=4 skv=4 d=16 dtype=f" + huge, "b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 values=normal(" + huge,
        "b=1 hq=1 sq=4 skv=4 d=16 dtype=f16 " + huge}) {
    try {
      parse_problem(line);
      FAIL() << "accepted a line of " << line.size() << " bytes";
    } catch (const BadInput& error) {
      const std::string message = error.what();
      EXPECT_LT(message.size(), 300u) << message;
      EXPECT_NE(message.find(std::string(kMaxQuotedChars - 8, '7')), std::string::npos) << message;
      EXPECT_EQ(message.find(std::string(kMaxQuotedChars + 1, '7')), std::string::npos) << message;
      EXPECT_NE(message.find("more bytes"), std::string::npos) << message;
    }
  }
}

// Control bytes (a NUL, an escape) are written as \xNN: the message stays one
// printable line that a NUL cannot cut short.
TEST(ProblemTest, AnErrorEscapesControlBytes) {
  const std::string line = std::string("b=1 hq=1 sq=4 skv=4 d=16 dtype=f1") + '\0' + "6\x1b[31m";
  try {
    parse_problem(line);
    FAIL() << "accepted";
  } catch (const BadInput& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.field(), "dtype");
    EXPECT_NE(message.find("'f1\\x006\\x1b[31m'"), std::string::npos) << message;
    for (char c : message) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "byte " << int(c) << " in " << message;
  }
  EXPECT_EQ(printable_excerpt(std::string("a\0b\xff", 4)), "a\\x00b\\xff");
  EXPECT_EQ(printable_excerpt(std::string(80, 'x')), std::string(80, 'x'));
  EXPECT_EQ(printable_excerpt(std::string(81, 'x')), std::string(80, 'x') + "... (1 more bytes)");
  std::string twenty_nuls;  // 20 escapes of 4 characters fill the 80
  for (int i = 0; i < 20; ++i) twenty_nuls += "\\x00";
  EXPECT_EQ(printable_excerpt(std::string(30, '\0')), twenty_nuls + "... (10 more bytes)");
}

// A location goes first, so that a reader (and a truncated terminal) sees
// FILE:LINE before the reason.
TEST(ProblemTest, ALocationComesFirst) {
  const BadInput error("dtype", "unknown dtype 'x'", "problems.txt:4");
  EXPECT_STREQ(error.what(), "problems.txt:4: bad problem: dtype: unknown dtype 'x'");
  EXPECT_EQ(error.location(), "problems.txt:4");
}

// Restores the default memory limit when a test leaves.
struct MemoryLimitGuard {
  ~MemoryLimitGuard() { clear_memory_limit(); }
};

// issue 21: hq=100000000 was accepted and allocated until killed. The estimate
// is made from the shape before anything is allocated, and past the limit the
// problem is refused with the estimate.
TEST(ProblemTest, AProblemPastTheMemoryLimitIsRefusedWithItsEstimate) {
  const MemoryLimitGuard guard;
  const char* line = "b=1 hq=100000000 sq=1 skv=1 d=8 dtype=f16";
  set_memory_limit_bytes(8.0 * (1 << 30));
  try {
    parse_problem(line);
    FAIL() << "accepted under an 8 GiB limit";
  } catch (const BadInput& error) {
    EXPECT_EQ(error.field(), "size");
    const Problem shape = make_problem(1, 100000000, 100000000, 1, 1, 8, DType::f16);
    const std::string estimate = fmt::format("about {:.1f} GiB", estimated_memory_bytes(shape) / (1 << 30));
    EXPECT_NE(std::string(error.what()).find(estimate), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("limit of 8.0 GiB"), std::string::npos) << error.what();
  }
  // The same shape under a limit that holds it is accepted (nothing allocated by parsing).
  set_memory_limit_bytes(1e15);
  EXPECT_EQ(parse_problem(line).heads_q, 100000000);
  EXPECT_THROW(set_memory_limit_bytes(std::nan("")), BadInput);
  EXPECT_THROW(set_memory_limit_bytes(-1), BadInput);
  EXPECT_THROW(set_memory_limit_bytes(std::numeric_limits<double>::infinity()), BadInput);
}

TEST(ProblemTest, TheDefaultMemoryLimitIsHalfThePhysicalMemory) {
  if (std::getenv("FLASHCHECK_MAX_MEMORY")) GTEST_SKIP() << "FLASHCHECK_MAX_MEMORY is set here";
  const MemoryLimitGuard guard;
  clear_memory_limit();
  const double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  ASSERT_GT(physical, 0);
  EXPECT_EQ(physical_memory_bytes(), physical);
  EXPECT_EQ(memory_limit_bytes(), physical / 2);
}

// FLASHCHECK_MAX_MEMORY (GiB) replaces the default, so that a sweep's workers
// inherit --max-memory; a value that is not a positive size is bad input.
TEST(ProblemTest, FlashcheckMaxMemoryInTheEnvironmentSetsTheLimit) {
  if (std::getenv("FLASHCHECK_MAX_MEMORY")) GTEST_SKIP() << "FLASHCHECK_MAX_MEMORY is set here";
  const MemoryLimitGuard guard;
  clear_memory_limit();
  ::setenv("FLASHCHECK_MAX_MEMORY", "0.5", 1);
  EXPECT_EQ(memory_limit_bytes(), 0.5 * (1 << 30));
  for (const char* bad : {"abc", "nan", "-1", "0", "inf", "1e400"}) {
    ::setenv("FLASHCHECK_MAX_MEMORY", bad, 1);
    EXPECT_THROW(memory_limit_bytes(), BadInput) << bad;
  }
  ::setenv("FLASHCHECK_MAX_MEMORY", "0.5", 1);
  set_memory_limit_bytes(1 << 20);  // this process's own setting wins
  EXPECT_EQ(memory_limit_bytes(), 1 << 20);
  ::unsetenv("FLASHCHECK_MAX_MEMORY");
}

// The estimate, by hand for a small shape: Q, K, V in f16; two runs' O (f16)
// and LSE (f32); five f64 copies of every row of O and LSE.
TEST(ProblemTest, TheMemoryEstimateCountsInputsOutputsAndReferenceRows) {
  Problem p = make_problem(2, 4, 2, 8, 16, 32, DType::f16);
  p.head_dim_v = 16;
  const double rows = 2 * 4 * 8, keys = 2 * 2 * 16;
  const double expected = (rows * 32 + keys * (32 + 16)) * 2 + 2 * rows * (16 * 2 + 4) + 5 * rows * 17 * 8;
  EXPECT_EQ(estimated_memory_bytes(p), expected);
  // Past 1024 query rows per sequence the judge samples 1024 rows: the f64
  // rows stop growing, the stored tensors do not.
  p.seqlen_q = 4096;
  const double long_rows = 2 * 4 * 4096, sampled_rows = 2 * 4 * 1024;
  EXPECT_EQ(estimated_memory_bytes(p),
            (long_rows * 32 + keys * (32 + 16)) * 2 + 2 * long_rows * (16 * 2 + 4) + 5 * sampled_rows * 17 * 8);
}

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

TEST(ProblemTest, ABackwardCountsTwoAndAHalfForwardsAndMovesEveryTensorAndItsGradient) {
  Problem p = make_problem(2, 4, 2, 8, 16, 32, DType::bf16);
  p.head_dim_v = 16;
  const double forward_flops = attention_flops(p);
  EXPECT_EQ(forward_flops, 2.0 * (32 + 16) * 2 * 4 * 8 * 16);
  EXPECT_EQ(attention_bytes(p), p.storage_bytes());
  p.pass = Pass::bwd;
  EXPECT_EQ(attention_flops(p), 2.5 * forward_flops);
  // Read Q, K, V, O, dO, LSE; write dQ, dK, dV (2 bytes each, LSE 4).
  const double q = 2 * 4 * 8 * 32, k = 2 * 2 * 16 * 32, v = 2 * 2 * 16 * 16, o = 2 * 4 * 8 * 16, lse = 2 * 4 * 8;
  EXPECT_EQ(attention_bytes(p), 2 * (2 * (q + k + v + o)) + 4 * lse);
}

}  // namespace
}  // namespace flashcheck
