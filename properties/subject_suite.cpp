// The subject property suite: every property of subject_properties() on every
// registered subject whose domain it applies to (tests Subject_<name>.<Property>),
// and every mutant caught (tests Mutants.<name>).
//
// Tests are registered at run time, after the static registrations of the
// subjects have run, so a new subject is tested the moment it is linked in.
//
// FLASHCHECK_SUBJECTS=name,name,... in the environment runs the properties on
// just those subjects, mutants included (to see what a mutant's failure looks
// like, or to focus on one kernel).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/subject.hpp"
#include "properties/ctest_resources.hpp"
#include "properties/subject_properties.hpp"

namespace flashcheck {
namespace {

std::string test_name(std::string_view name) {
  std::string out(name);
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return out;
}

// GPU subjects are tested only where they can run: a device of at least their
// declared compute capability. Elsewhere their tests are reported SKIPPED
// (ctest shows them as not run), never passed.
// Why a subject cannot run here, or empty when it can.
std::string missing_gpu(const Subject& subject) {
  const auto why = unavailable_reason(subject.capabilities());
  return why ? fmt::format("{} is unavailable here: {}", subject.name(), *why) : std::string();
}

class PropertyTest : public testing::Test {
 public:
  PropertyTest(Subject* subject, const SubjectProperty* property) : subject_(subject), property_(property) {}
  void TestBody() override {
    if (const std::string why = missing_gpu(*subject_); !why.empty()) GTEST_SKIP() << why;
    RecordProperty("summary", std::string(property_->summary));
    const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
    const PropertyOutcome outcome = check_property(*property_, *subject_, rc::detail::configuration().testParams,
                                                   std::string(info->test_suite_name()) + "/" + info->name());
    fmt::print("{}", outcome.coverage);
    if (!outcome.passed) FAIL() << outcome.message;
  }

 private:
  Subject* subject_;
  const SubjectProperty* property_;
};

// The default budget, with a fixed seed so that "caught after N cases" is
// reproducible: RapidCheck's own default of 100 successful cases per property.
rc::detail::TestParams mutant_budget() {
  rc::detail::TestParams params;
  params.seed = 20261121;
  params.maxSuccess = 100;
  return params;
}

class MutantTest : public testing::Test {
 public:
  explicit MutantTest(Subject* mutant) : mutant_(mutant) {}
  void TestBody() override {
    if (const std::string why = missing_gpu(*mutant_); !why.empty()) GTEST_SKIP() << why;
    for (const SubjectProperty& property : subject_properties()) {
      if (!property.applies(mutant_->capabilities())) continue;
      rc::detail::TestMetadata metadata;
      metadata.id = fmt::format("Mutants/{}/{}", mutant_->name(), property.name);
      metadata.description = std::string(property.name);
      const auto result =
          rc::detail::checkTestable([this, &property] { property.check(*mutant_); }, metadata,
                                    budget_for(property, mutant_budget()));
      if (result.template is<rc::detail::FailureResult>()) {
        const auto& failure = result.template get<rc::detail::FailureResult>();
        const int cases = failure.numSuccess + 1;
        // The counterexample's problem line and the verdict, from the failure's description.
        std::string evidence;
        for (const auto& [type, value] : failure.counterExample)
          if (type.find("Problem") != std::string::npos) evidence += "  problem: " + value + "\n";
        std::size_t start = 0;
        while (start < failure.description.size()) {
          const std::size_t end = failure.description.find('\n', start);
          const std::string line = failure.description.substr(start, end - start);
          if (line.find("verdict") != std::string::npos || line.find("differ") != std::string::npos ||
              line.find("outside") != std::string::npos || line.find("changed") != std::string::npos)
            evidence += line + "\n";
          if (end == std::string::npos) break;
          start = end + 1;
        }
        fmt::print("MUTANT CAUGHT: {} by {} after {} case(s)\n{}", mutant_->name(), property.name, cases, evidence);
        RecordProperty("caught_by", std::string(property.name));
        RecordProperty("cases_to_catch", cases);
        return;
      }
    }
    if (const std::string why = Registry::instance().unobservable(mutant_->name()); !why.empty())
      GTEST_SKIP() << "mutant " << mutant_->name() << " survived every property within the default budget, "
                   << "as expected here: " << why;
    FAIL() << "mutant " << mutant_->name() << " (" << mutant_->description()
           << ") survived every property within the default budget";
  }

 private:
  Subject* mutant_;
};

}  // namespace
}  // namespace flashcheck

int main(int argc, char** argv) {
  using namespace flashcheck;
  use_ctest_gpu();
  testing::InitGoogleTest(&argc, argv);
  std::vector<Subject*> under_test = Registry::instance().subjects();
  if (const char* names = std::getenv("FLASHCHECK_SUBJECTS")) {
    under_test.clear();
    std::string list = names;
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
  for (Subject* subject : under_test)
    for (const SubjectProperty& property : subject_properties()) {
      if (!property.applies(subject->capabilities())) continue;
      const std::string suite = (subject->capabilities().needs_gpu ? "Gpu_" : "Subject_") + test_name(subject->name());
      testing::RegisterTest(suite.c_str(), std::string(property.name).c_str(), nullptr, nullptr, __FILE__, __LINE__,
                            [subject, &property]() -> testing::Test* { return new PropertyTest(subject, &property); });
    }
  for (Subject* mutant : Registry::instance().mutants())
    testing::RegisterTest(mutant->capabilities().needs_gpu ? "GpuMutants" : "Mutants", test_name(mutant->name()).c_str(),
                          nullptr, nullptr, __FILE__, __LINE__,
                          [mutant]() -> testing::Test* { return new MutantTest(mutant); });
  const int failed = RUN_ALL_TESTS();
  // The cuDNN subject's graph-cache and kernel-cache counters, say.
  for (Subject* subject : under_test)
    if (const std::string line = subject->stats(); !line.empty()) fmt::print("stats: {}\n", line);
  return failed;
}
