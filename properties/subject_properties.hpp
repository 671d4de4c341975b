// The properties every subject is held to. Each draws problems from the
// subject's own Capabilities, so a subject is tested the moment it is
// registered, with no per-subject test code.
#pragma once

#include <string_view>
#include <vector>

#include "core/subject.hpp"

namespace flashcheck {

struct SubjectProperty {
  std::string_view name;
  std::string_view summary;
  /// Whether the property means anything for a domain (GQA == MHA needs GQA).
  bool (*applies)(const Capabilities&);
  /// The property body: draws with *rc::gen, fails with RC_ASSERT / RC_FAIL.
  void (*check)(Subject&);
};

/// Every subject property, in a fixed order.
const std::vector<SubjectProperty>& subject_properties();

}  // namespace flashcheck
