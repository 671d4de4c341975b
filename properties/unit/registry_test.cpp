// The registry's note on mutants the hardware cannot expose: the reason given
// is the one returned, and an unmarked name has none (the mutant suite then
// fails a surviving mutant instead of skipping it).
#include <gtest/gtest.h>

#include <algorithm>

#include "flashcheck/core/subject.hpp"

namespace flashcheck {
namespace {

TEST(RegistryTest, UnobservableReasonIsKeptPerMutant) {
  Registry& registry = Registry::instance();
  EXPECT_EQ(registry.unobservable("registry-test-unmarked"), "");
  registry.mark_unobservable("registry-test-marked", "the flaw needs a memory model this machine does not have");
  EXPECT_EQ(registry.unobservable("registry-test-marked"), "the flaw needs a memory model this machine does not have");
  EXPECT_EQ(registry.unobservable("registry-test-unmarked"), "");
  EXPECT_EQ(registry.unobservable("registry-test-marke"), "");
}

// The same-precision baseline judged against itself cannot fail on accuracy:
// it is a smoke test, found by name but not among the subjects under test
// (what `all` takes; cli_test checks that `all` runs cpu-plain, the control).
TEST(RegistryTest, TheSmokeTestIsFoundByNameButIsNoSubjectUnderTest) {
  Registry& registry = Registry::instance();
  Subject* smoke = registry.find("smoke-cpu-lowp");
  ASSERT_NE(smoke, nullptr);
  const auto& subjects = registry.subjects();
  EXPECT_EQ(std::find(subjects.begin(), subjects.end(), smoke), subjects.end());
  const auto& smoke_tests = registry.smoke_tests();
  EXPECT_NE(std::find(smoke_tests.begin(), smoke_tests.end(), smoke), smoke_tests.end());
  EXPECT_EQ(registry.find("cpu-lowp"), nullptr) << "the old name is gone";
}

}  // namespace
}  // namespace flashcheck
