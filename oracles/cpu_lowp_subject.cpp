// Registers the cpu-lowp baseline as a subject, so that the whole pipeline runs
// on a machine without a GPU.
#include "oracles/cpu_lowp.hpp"

namespace flashcheck {
namespace {
SubjectRegistration<CpuLowp> registration;
}
}  // namespace flashcheck
