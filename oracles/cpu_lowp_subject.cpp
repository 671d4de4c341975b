// Registers the cpu_lowp baseline as the smoke test `smoke-cpu-lowp`, so that
// the whole pipeline runs on a machine without a GPU. A smoke test, not a
// subject under test: judged, it is its own baseline, so it is never in `all`.
#include "flashcheck/oracles/cpu_lowp.hpp"

namespace flashcheck {
namespace {
SubjectRegistration<CpuLowp> registration(Registry::Kind::smoke);
}
}  // namespace flashcheck
