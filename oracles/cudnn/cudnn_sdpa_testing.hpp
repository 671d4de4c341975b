// The cuDNN subject's test seam: makes its dynamic-shape path fail on demand,
// so that a test can show the fallback to the per-geometry graph (a right
// answer, the reason counted in stats()) without waiting for a cuDNN that
// refuses. Production code never calls it.
#pragma once

namespace flashcheck::cudnn_testing {

/// Makes the next `builds` builds of a dynamic-shape graph fail as a cuDNN
/// refusal would, and the next `executes` executes of a dynamic-shape graph
/// fail as a failed execute would (without running it, so its outputs stay
/// poisoned). Counts left from an earlier call are replaced.
void fail_dynamic_path(int builds, int executes);

}  // namespace flashcheck::cudnn_testing
