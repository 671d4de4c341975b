// The cuDNN subject's test seam: a subject with a cache folder of its own, and
// its dynamic-shape path made to fail on demand,
// so that a test can show the fallback to the per-geometry graph (a right
// answer, the reason counted in stats()) without waiting for a cuDNN that
// refuses; and the backward's Stats handed to cuDNN as given, so that a test
// can show what cuDNN does with an LSE of -inf. Production code never calls it.
#pragma once

#include <memory>
#include <string>

#include "flashcheck/core/subject.hpp"

namespace flashcheck::cudnn_testing {

/// A cudnn subject of its own (not the registry's), whose kernel caches and
/// plan files live in `cache_dir` ("" for none), so that a test can show what
/// a second process finds there.
std::unique_ptr<Subject> make_subject(const std::string& cache_dir);

/// Makes the next `builds` builds of a dynamic-shape graph fail as a cuDNN
/// refusal would, and the next `executes` executes of a dynamic-shape graph
/// fail as a failed execute would (without running it, so its outputs stay
/// poisoned). Counts left from an earlier call are replaced.
void fail_dynamic_path(int builds, int executes);

/// Makes later backward calls hand cuDNN the LSE as given, -inf on rows that
/// see no key (fully masked and padding rows), instead of the +inf the subject
/// hands there (true), or restores that (false).
void hand_stats_as_given(bool as_given);

}  // namespace flashcheck::cudnn_testing
