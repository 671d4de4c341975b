// The property suite's runner and its GoogleTest registration. The only file
// of the library that reaches into RapidCheck's rc::detail: to run a property
// body as a RapidCheck test with a budget of its own, and to count its cases
// per coverage dimension (a TestListener).
#include "flashcheck/testing/property_suite.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/TestListener.h>
#include <rapidcheck/detail/TestParams.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

#include "flashcheck/core/gpu/device_info.hpp"

namespace flashcheck::testing {
namespace {

// Counts a property run's cases: discards, and the passing cases per
// dimension of their tags ("dimension=value").
class CaseTally final : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription& description) override {
    using Type = rc::detail::CaseResult::Type;
    if (description.result.type == Type::Discard) {
      ++discarded_;
      if (discard_reasons_.size() < 3) discard_reasons_.push_back(description.result.description);
      return;
    }
    if (description.result.type != Type::Success) return;
    ++passed_;
    for (std::string tag : description.tags) {
      // RC_TAG shows a string argument quoted.
      if (tag.size() >= 2 && tag.front() == '"' && tag.back() == '"') tag = tag.substr(1, tag.size() - 2);
      const std::size_t equals = tag.find('=');
      if (equals == std::string::npos) ++coverage_["other"][tag];
      else ++coverage_[tag.substr(0, equals)][tag.substr(equals + 1)];
    }
  }
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}

  int passed() const { return passed_; }
  int discarded() const { return discarded_; }
  double discard_share() const { return passed_ + discarded_ ? double(discarded_) / (passed_ + discarded_) : 0.0; }
  std::string report() const {
    std::string text = fmt::format("{} case(s) passed, {} discarded ({:.1f}% of those drawn)\n", passed_, discarded_,
                                   100 * discard_share());
    for (const auto& [dimension, values] : coverage_) {
      text += fmt::format("  {:<14}", dimension);
      for (const auto& [value, count] : values)
        text += fmt::format(" {} {:.0f}%", value, 100.0 * count / std::max(passed_, 1));
      text += "\n";
    }
    for (const std::string& reason : discard_reasons_) text += "  discarded: " + reason.substr(0, 200) + "\n";
    return text;
  }

 private:
  int passed_ = 0, discarded_ = 0;
  std::map<std::string, std::map<std::string, int>> coverage_;
  std::vector<std::string> discard_reasons_;
};

rc::detail::TestParams params_for(const SubjectProperty& property, const Budget& budget) {
  rc::detail::TestParams params =
      budget.ignore_environment ? rc::detail::TestParams() : rc::detail::configuration().testParams;
  if (budget.max_success) params.maxSuccess = *budget.max_success;
  if (budget.seed) params.seed = *budget.seed;
  params.maxSuccess = cases_for(property, params.maxSuccess);
  return params;
}

// The counterexample's problem line(s) and the lines of the failure that say why.
std::string evidence_of(const rc::detail::FailureResult& failure) {
  std::string evidence;
  for (const auto& [type, value] : failure.counterExample)
    if (type.find("Problem") != std::string::npos) evidence += "  problem: " + value + "\n";
  std::istringstream lines(failure.description);
  for (std::string line; std::getline(lines, line);)
    if (line.find("verdict") != std::string::npos || line.find("differ") != std::string::npos ||
        line.find("outside") != std::string::npos || line.find("changed") != std::string::npos)
      evidence += line + "\n";
  return evidence;
}

// Why a GPU subject cannot run here, or empty when it can: its tests are
// then SKIPPED (ctest shows them as not run), never passed.
std::string missing_gpu(const Subject& subject) {
  const auto why = unavailable_reason(subject.capabilities());
  return why ? fmt::format("{} is unavailable here: {}", subject.name(), *why) : std::string();
}

class PropertyTest : public ::testing::Test {
 public:
  PropertyTest(Subject* subject, const SubjectProperty* property) : subject_(subject), property_(property) {}
  void TestBody() override {
    if (const std::string why = missing_gpu(*subject_); !why.empty()) GTEST_SKIP() << why;
    RecordProperty("summary", std::string(property_->summary));
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const PropertyOutcome outcome =
        check_property(*property_, *subject_, std::string(info->test_suite_name()) + "/" + info->name());
    fmt::print("{}", outcome.coverage);
    if (!outcome.passed) FAIL() << outcome.message;
  }

 private:
  Subject* subject_;
  const SubjectProperty* property_;
};

// The default budget, from a fixed seed so that "caught after N cases" is
// reproducible: RapidCheck's own default of 100 successful cases per property.
constexpr Budget kMutantBudget{.max_success = 100, .seed = 20261121, .ignore_environment = true};

// The mutant's control: the registered subject it breaks, found as the
// subject whose name begins the mutant's description ("cpu-plain's backward
// without ...") and whose domain is the mutant's (so that, from one seed,
// both draw the same cases); nullptr when none is registered.
Subject* control_of(const Subject& mutant) {
  Subject* control = nullptr;
  const std::string domain = describe(mutant.capabilities());
  for (Subject* subject : Registry::instance().subjects())
    if (mutant.description().starts_with(subject->name()) && describe(subject->capabilities()) == domain &&
        (!control || subject->name().size() > control->name().size()))
      control = subject;
  return control;
}

class MutantTest : public ::testing::Test {
 public:
  explicit MutantTest(Subject* mutant) : mutant_(mutant) {}
  void TestBody() override {
    if (const std::string why = missing_gpu(*mutant_); !why.empty()) GTEST_SKIP() << why;
    std::vector<const SubjectProperty*> order;
    for (const SubjectProperty& property : subject_properties())
      if (property.end_to_end) order.push_back(&property);
    for (const SubjectProperty& property : subject_properties())
      if (!property.end_to_end) order.push_back(&property);
    for (const SubjectProperty* tried : order) {
      const SubjectProperty& property = *tried;
      if (!property.applies(mutant_->capabilities())) continue;
      const PropertyOutcome outcome =
          check_property(property, *mutant_, fmt::format("Mutants/{}/{}", mutant_->name(), property.name), kMutantBudget);
      if (!outcome.counterexample) continue;
      // A catch counts only where the control passes the same cases (the same
      // seed and domain draw them): a property that fails the unbroken kernel
      // too (a rule too tight for it, a bug of the control's own) tells the
      // mutant from nothing.
      if (Subject* control = control_of(*mutant_); control && !missing_gpu(*control).empty()) {
        fmt::print("{} failed {}, but its control {} cannot run here to confirm the catch\n", mutant_->name(),
                   property.name, control->name());
        continue;
      } else if (control) {
        // The same budget, not just the first N cases: RapidCheck sizes case i
        // from i / max_success, so only the same budget replays the same cases.
        const PropertyOutcome control_outcome = check_property(
            property, *control, fmt::format("Mutants/{}/{}/control", mutant_->name(), property.name), kMutantBudget);
        if (control_outcome.counterexample && control_outcome.cases <= outcome.cases) {
          fmt::print("{} failed {} after {} case(s), but so did its control {} (after {}): not a catch\n{}",
                     mutant_->name(), property.name, outcome.cases, control->name(), control_outcome.cases,
                     control_outcome.evidence);
          continue;
        }
      }
      fmt::print("MUTANT CAUGHT: {} by {} after {} case(s)\n{}", mutant_->name(), property.name, outcome.cases,
                 outcome.evidence);
      RecordProperty("caught_by", std::string(property.name));
      RecordProperty("cases_to_catch", outcome.cases);
      return;
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

std::string test_name(std::string_view name) {
  std::string out(name);
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return out;
}

int cases_for(const SubjectProperty& property, int max_success) {
  return std::max(1, static_cast<int>(property.budget_share * max_success));
}

PropertyOutcome check_property(const SubjectProperty& property, Subject& subject, const std::string& id,
                               const Budget& budget) {
  rc::detail::TestMetadata metadata;
  metadata.id = id;
  metadata.description = std::string(property.name);
  CaseTally tally;
  const rc::detail::TestResult result = rc::detail::checkTestable([&] { property.check(subject); }, metadata,
                                                                  params_for(property, budget), tally);
  PropertyOutcome outcome;
  outcome.coverage = tally.report();
  std::ostringstream message;
  rc::detail::printResultMessage(result, message);
  outcome.message = message.str();
  outcome.passed = result.template is<rc::detail::SuccessResult>();
  if (result.template is<rc::detail::FailureResult>()) {
    const auto& failure = result.template get<rc::detail::FailureResult>();
    outcome.counterexample = true;
    outcome.cases = failure.numSuccess + 1;
    outcome.evidence = evidence_of(failure);
  }
  if (outcome.passed && tally.discard_share() > kMaxDiscardShare && tally.discarded() > kDiscardsAlwaysAllowed) {
    outcome.passed = false;
    outcome.message = fmt::format("{} discarded {} of {} drawn cases ({:.1f}%), more than the {:.0f}% allowed "
                                  "(kMaxDiscardShare): the passing count overstates what was tested\n{}",
                                  property.name, tally.discarded(), tally.passed() + tally.discarded(),
                                  100 * tally.discard_share(), 100 * kMaxDiscardShare, outcome.coverage);
  }
  return outcome;
}

void add_property_tests(Subject& subject) { add_property_tests(subject, "Subject_" + test_name(subject.name())); }

void add_property_tests(Subject& subject, std::string_view suite) {
  const std::string suite_name(suite);
  // A forward borrowed from another subject (Capabilities::forward_from) is
  // tested there: only the backward properties run here.
  const bool forward_borrowed = !subject.capabilities().forward_from.empty();
  const auto is_backward = [](const SubjectProperty& property) {
    for (const SubjectProperty& backward : backward_properties())
      if (backward.name == property.name) return true;
    return false;
  };
  for (const SubjectProperty& property : subject_properties()) {
    if (!property.applies(subject.capabilities())) continue;
    if (forward_borrowed && !is_backward(property)) continue;
    Subject* under_test = &subject;
    const SubjectProperty* checked = &property;
    ::testing::RegisterTest(suite_name.c_str(), std::string(property.name).c_str(), nullptr, nullptr, __FILE__,
                            __LINE__, [under_test, checked]() -> ::testing::Test* {
                              return new PropertyTest(under_test, checked);
                            });
  }
}

void add_mutant_test(Subject& mutant, std::string_view suite) {
  Subject* under_test = &mutant;
  ::testing::RegisterTest(std::string(suite).c_str(), test_name(mutant.name()).c_str(), nullptr, nullptr, __FILE__,
                          __LINE__, [under_test]() -> ::testing::Test* { return new MutantTest(under_test); });
}

}  // namespace flashcheck::testing
