// The registry's note on mutants the hardware cannot expose: the reason given
// is the one returned, and an unmarked name has none (the mutant suite then
// fails a surviving mutant instead of skipping it).
#include <gtest/gtest.h>

#include "core/subject.hpp"

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

}  // namespace
}  // namespace flashcheck
