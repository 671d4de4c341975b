// The example's tests: own-attention judged by an installed flashcheck, in
// this project's own GoogleTest main.
//
// main() registers the kernel explicitly (flashcheck/core/registration.hpp; no
// static object that a static library's link could drop), then, where the
// installed flashcheck has its property-suite library (flashcheck::testing),
// adds the whole suite for the kernel before the tests run.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/registration.hpp"
#include "flashcheck/judge/judge.hpp"
#include "own_attention.hpp"
#ifdef OWN_KERNEL_HAVE_FLASHCHECK_TESTING
#include "flashcheck/testing/property_suite.hpp"
#endif

namespace {

flashcheck::Subject& registered(std::string_view name) {
  flashcheck::Subject* subject = flashcheck::Registry::instance().find(name);
  if (subject == nullptr) throw std::logic_error("not registered: " + std::string(name));
  return *subject;
}

// A few problems inside the kernel's domain: GQA, MQA, both causal
// alignments, both layouts, seqlen_q != seqlen_kv, lengths off any tile.
const std::vector<std::string> kProblems = {
    "b=1 hq=2 sq=17 skv=17 d=32 dtype=f32",
    "b=2 hq=4 hkv=2 sq=33 skv=47 d=64 dtype=f32 mask=causal_tl",
    "b=1 hq=4 hkv=1 sq=40 skv=24 d=64 dv=32 dtype=f32 layout=bshd mask=causal_br dseed=3",
    "b=1 hq=1 sq=64 skv=129 d=128 dtype=f32 mask=causal_br values=normal(2,3) dseed=9",
};

TEST(OwnAttention, IsRegisteredExplicitlyAndOnce) {
  flashcheck::Subject& kernel = registered("own-attention");
  EXPECT_EQ(kernel.description(), "the example's own CPU attention loop (examples/own-kernel)");
  // A second subject of the same name would make Registry::find ambiguous.
  EXPECT_THROW(flashcheck::register_subject<own_kernel::OwnAttention>(), std::invalid_argument);
  EXPECT_THROW(flashcheck::register_subject(nullptr), std::invalid_argument);
}

TEST(OwnAttention, PassesTheJudge) {
  flashcheck::Subject& kernel = registered("own-attention");
  for (const std::string& line : kProblems) {
    SCOPED_TRACE(line);
    const flashcheck::CaseResult result = flashcheck::judge(kernel, flashcheck::parse_problem(line));
    ASSERT_TRUE(result.ran()) << result.message;
    EXPECT_GT(result.rows_visible, 0) << "nothing was compared";
    EXPECT_TRUE(result.passed()) << flashcheck::explain(result);
  }
}

TEST(OwnAttention, RefusesWhatItDoesNotDeclare) {
  flashcheck::Subject& kernel = registered("own-attention");
  for (const std::string line : {"b=1 hq=2 sq=16 skv=16 d=32 dtype=bf16",
                                 "b=1 hq=2 sq=16 skv=16 d=32 dtype=f32 mask=window window=4,0"}) {
    SCOPED_TRACE(line);
    const flashcheck::CaseResult result = flashcheck::judge(kernel, flashcheck::parse_problem(line));
    EXPECT_EQ(result.status, flashcheck::Status::unsupported);
  }
}

// The same judge must fail the kernel with a planted flaw: the tests above
// could not pass a kernel that computes something else.
TEST(OwnAttention, TheJudgeCatchesAPlantedFlaw) {
  flashcheck::Subject& flawed = registered("own-attention-scale-twice");
  const flashcheck::CaseResult result = flashcheck::judge(flawed, flashcheck::parse_problem(kProblems[1]));
  ASSERT_TRUE(result.ran()) << result.message;
  EXPECT_TRUE(result.failed()) << "the softmax scale applied twice went unnoticed";
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  own_kernel::OwnAttention& kernel = flashcheck::register_subject<own_kernel::OwnAttention>();
  // Registered as a mutant: found by name, never among the subjects under test.
  flashcheck::register_subject(std::make_unique<own_kernel::OwnAttention>(own_kernel::Flaw::scale_applied_twice),
                               flashcheck::Registry::Kind::mutant);
#ifdef OWN_KERNEL_HAVE_FLASHCHECK_TESTING
  // Every property of flashcheck's subject suite, as tests of this binary.
  flashcheck::testing::add_property_tests(kernel);
#else
  (void)kernel;
#endif
  return RUN_ALL_TESTS();
}
