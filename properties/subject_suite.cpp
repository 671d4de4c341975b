// The repository's subject property suite: flashcheck::testing's properties
// on every registered subject whose domain they apply to (tests
// Subject_<name>.<Property>, Gpu_<name>.<Property> for GPU subjects), and
// every mutant caught (tests Mutants.<name>, GpuMutants.<name>).
//
// Tests are registered at run time, after the static registrations of the
// subjects have run, so a new subject is tested the moment it is linked in.
//
// FLASHCHECK_SUBJECTS=name,name,... in the environment runs the properties on
// just those subjects, mutants included (to see what a mutant's failure looks
// like, or to focus on one kernel).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "flashcheck/core/subject.hpp"
#include "flashcheck/testing/property_suite.hpp"
#include "flashcheck/testing/reference_cache.hpp"
#include "properties/ctest_resources.hpp"

int main(int argc, char** argv) {
  using namespace flashcheck;
  use_ctest_gpu();
  ::testing::InitGoogleTest(&argc, argv);
  std::vector<Subject*> under_test = Registry::instance().subjects();
  if (const char* names = std::getenv("FLASHCHECK_SUBJECTS")) {
    under_test.clear();
    const std::string list = names;
    for (std::size_t start = 0; start <= list.size();) {
      const std::size_t end = std::min(list.find(',', start), list.size());
      const std::string name = list.substr(start, end - start);
      Subject* subject = Registry::instance().find(name);
      if (!subject) {
        fmt::print(stderr, "FLASHCHECK_SUBJECTS: unknown subject '{}'\n", name);
        return 2;
      }
      under_test.push_back(subject);
      start = end + 1;
    }
  }
  // Subject_<name>.<Property>, as in a user's own main; GPU subjects in
  // Gpu_<name> suites, which ctest labels apart (gpu, gpu-quick).
  for (Subject* subject : under_test)
    if (subject->capabilities().needs_gpu)
      flashcheck::testing::add_property_tests(*subject, "Gpu_" + flashcheck::testing::test_name(subject->name()));
    else
      flashcheck::testing::add_property_tests(*subject);
  for (Subject* mutant : Registry::instance().mutants())
    flashcheck::testing::add_mutant_test(*mutant, mutant->capabilities().needs_gpu ? "GpuMutants" : "Mutants");
  const int failed = RUN_ALL_TESTS();
  // The mutation score of the mutant tests this process ran (a passed
  // Mutants.<name> is a mutant caught; skipped ones could not run or be
  // observed here).
  int caught = 0, survived = 0, skipped = 0;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    if (std::string(suite.name()) != "Mutants" && std::string(suite.name()) != "GpuMutants") continue;
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const ::testing::TestInfo& test = *suite.GetTestInfo(t);
      if (!test.should_run()) continue;
      const ::testing::TestResult& result = *test.result();
      if (result.Skipped()) ++skipped;
      else if (result.Passed()) ++caught;
      else ++survived;
    }
  }
  if (caught + survived + skipped > 0)
    fmt::print("mutation score: {}/{} caught ({} skipped: cannot run or be observed here)\n", caught, caught + survived,
               skipped);
  // The cuDNN subject's graph-cache and kernel-cache counters, say.
  for (Subject* subject : under_test)
    if (const std::string line = subject->stats(); !line.empty()) fmt::print("stats: {}\n", line);
  // How often a base case's oracle was judged again (shrinking, properties
  // that share a seed), when a property ran (ctest reads the listing).
  if (const auto cache = flashcheck::testing::ReferenceCache::instance().stats(); cache.hits + cache.misses > 0)
    fmt::print("reference cache: {} hits, {} misses, {} evictions, {} entries, {:.1f} MiB\n", cache.hits,
               cache.misses, cache.evictions, cache.entries, cache.bytes / 1048576.0);
  return failed;
}
