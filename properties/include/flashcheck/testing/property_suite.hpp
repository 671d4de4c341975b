// The property suite every subject is held to, for a GoogleTest binary.
// Each property draws its problems from the subject's own Capabilities, so a
// subject is tested the moment it is registered, with no per-subject test
// code. In the user's own main:
//
//   int main(int argc, char** argv) {
//     ::testing::InitGoogleTest(&argc, argv);
//     static MyKernel kernel;                         // a flashcheck::Subject
//     flashcheck::testing::add_property_tests(kernel);  // Subject_<name>.<Property>
//     return RUN_ALL_TESTS();
//   }
//
// The budget is RapidCheck's (RC_PARAMS in the environment: max_success,
// seed, reproduce); each property runs its share of it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashcheck/core/subject.hpp"

namespace flashcheck::testing {

/// Registers every property of subject_properties() whose domain applies to
/// `subject`, as GoogleTest tests Subject_<name>.<Property> (characters of the
/// name other than letters and digits become '_'). Call after
/// ::testing::InitGoogleTest and before RUN_ALL_TESTS; `subject` must outlive
/// the run. Registered explicitly (::testing::RegisterTest), with no static
/// initialisation: nothing is lost when linked from a static library. A
/// subject whose forward is another's (Capabilities::forward_from) gets the
/// backward properties only.
void add_property_tests(Subject& subject);
/// The same, as tests <suite>.<Property>. A GPU subject's tests are SKIPPED
/// where it cannot run (no device, too old an architecture), never passed.
void add_property_tests(Subject& subject, std::string_view suite);
/// Registers <suite>.<name>: the deliberately broken `mutant` must fail some
/// applicable property within the default budget of 100 cases, from a fixed
/// seed (20261121), so that "caught after N cases" is reproducible. The
/// end-to-end properties (SubjectProperty::end_to_end) are tried first, then
/// the others in their order. Where the mutant's control is registered (the
/// subject whose name begins the mutant's description, with the same domain),
/// a failure counts as a catch only if the control passes the same cases. A mutant
/// that survives fails the test, unless the Registry declares why it cannot
/// be observed here (then SKIPPED).
void add_mutant_test(Subject& mutant, std::string_view suite = "Mutants");

/// A GoogleTest-safe name: letters and digits kept, everything else '_'.
std::string test_name(std::string_view name);

struct SubjectProperty {
  std::string_view name;
  std::string_view summary;
  /// Whether the property means anything for a domain (GQA == MHA needs GQA).
  bool (*applies)(const Capabilities&);
  /// The property body: draws with *rc::gen, fails with RC_ASSERT / RC_FAIL.
  void (*check)(Subject&);
  /// The share of the budget (RapidCheck's max_success) the property runs:
  /// 1, or 1/20 for the empty and fully masked shapes, which have one answer.
  double budget_share = 1.0;
  /// The property judges whole cases with the tolerance rule (against the
  /// oracles): the mutant test tries these first, since they catch any flaw
  /// that shows in their pass, and a backward-only flaw would otherwise wait
  /// for every forward property's budget before a backward one draws.
  bool end_to_end = false;
};

/// Every subject property, in a fixed order: the forward's, then the
/// backward's (pass=bwd, for subjects whose Capabilities::backward is true).
const std::vector<SubjectProperty>& subject_properties();
/// The backward's properties alone (backward_properties.cpp).
const std::vector<SubjectProperty>& backward_properties();
/// The serving vocabulary's forward properties (softcap, ALiBi, paged K/V;
/// serving_properties.cpp), part of subject_properties()'s forward half.
const std::vector<SubjectProperty>& serving_properties();

/// The largest share of its drawn cases a property may discard (RC_PRE,
/// RC_DISCARD, a refusal at launch) and still pass. Each property draws only
/// cases it can test (rc::gen::suchThat on its geometry and domain), so
/// discards are rare leftovers (measured: none in 100 cases of each property
/// on cpu-plain and cpu-lowp). Above one in ten, the count of passing cases
/// would overstate what was tested.
/// (RapidCheck's own maxDiscardRatio is discards per success, an integer, and
/// gives up only past 10 per success.)
inline constexpr double kMaxDiscardShare = 0.10;
/// Discards a property may make whatever its budget: a share of a small
/// budget is noise (measured on an H100: the gpu-quick tier's 10 cases a
/// property drew 2 and 3 discards of 12 and 13 on mma kernels, from the
/// generator's own 3% of discards in the mma domain, where 100 cases stay
/// well under 10%).
inline constexpr std::int64_t kDiscardsAlwaysAllowed = 3;

/// A run's budget, before the property's share: RapidCheck's parameters from
/// RC_PARAMS, with what is set here overriding them.
struct Budget {
  std::optional<int> max_success;
  std::optional<std::uint64_t> seed;
  /// Start from RapidCheck's defaults instead of RC_PARAMS (a result that must
  /// not depend on the environment, as the mutants' "caught after N cases").
  bool ignore_environment = false;
};
/// The cases a property runs: max(1, share x max_success).
int cases_for(const SubjectProperty& property, int max_success);

/// One run of a property on a subject.
struct PropertyOutcome {
  bool passed = false;
  /// A case failed (not merely too many discards): the counterexample's
  /// problem line(s) and the lines of the failure that say why are in `evidence`.
  bool counterexample = false;
  int cases = 0;         // with a counterexample: the cases drawn up to the failing one
  std::string message;   // why it failed: RapidCheck's report, or the discard share
  std::string evidence;  // with a counterexample: its problem and the verdict lines
  std::string coverage;  // the passing cases per dimension (dtype, mask, GQA ratio, lengths), the discards
};

/// Runs `property` on `subject` with its share of `budget`; it fails when a
/// case fails or when more than kMaxDiscardShare of the cases were discarded.
/// `id` names the run for RC_PARAMS's reproduce map.
PropertyOutcome check_property(const SubjectProperty& property, Subject& subject, const std::string& id,
                               const Budget& budget = {});

}  // namespace flashcheck::testing
