// The properties every subject is held to. Each draws problems from the
// subject's own Capabilities, so a subject is tested the moment it is
// registered, with no per-subject test code.
#pragma once

#include <rapidcheck/detail/TestParams.h>

#include <string>
#include <cstdint>
#include <string_view>
#include <vector>

#include "flashcheck/core/subject.hpp"

namespace flashcheck {

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
};

/// Every subject property, in a fixed order.
const std::vector<SubjectProperty>& subject_properties();

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

/// `params` with the property's share of the budget: max(1, share x max_success) cases.
rc::detail::TestParams budget_for(const SubjectProperty& property, rc::detail::TestParams params);

/// One run of a property on a subject.
struct PropertyOutcome {
  bool passed = false;
  std::string message;   // why it failed: RapidCheck's report, or the discard share
  std::string coverage;  // the passing cases per dimension (dtype, mask, GQA ratio, lengths), the discards
};

/// Runs `property` on `subject` with its share of `params`; it fails when a
/// case fails or when more than kMaxDiscardShare of the cases were discarded.
/// `id` names the run for RC_PARAMS's reproduce map.
PropertyOutcome check_property(const SubjectProperty& property, Subject& subject, const rc::detail::TestParams& params,
                               const std::string& id);

}  // namespace flashcheck
