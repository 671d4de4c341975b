// The cuDNN subject's graphs (issue 20): geometries of one topology are built
// with dynamic shapes on one kernel cache, and each still agrees with the
// oracle. Prints stats() so that the build times of the first and the later
// geometries can be compared. Its own binary: the subject's caches live as long
// as the process. GPU only; SKIPPED without one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/gpu/device_info.hpp"
#include "core/subject.hpp"
#include "core/values.hpp"
#include "oracles/judge.hpp"

namespace flashcheck {
namespace {

TEST(GpuCudnnGraphs, GeometriesOfOneTopologyShareAKernelCacheAndAgreeWithTheOracle) {
  unsetenv("FLASHCHECK_CUDNN_KERNEL_CACHE_DIR");  // this process's caches only
  const GpuInventory inventory = gpu_devices();
  if (inventory.devices.empty()) GTEST_SKIP() << "no GPU: " << inventory.note;
  Subject* cudnn = Registry::instance().find("cudnn");
  ASSERT_NE(cudnn, nullptr);
  if (inventory.devices.front().compute_capability < cudnn->capabilities().min_compute_capability)
    GTEST_SKIP() << "cudnn needs compute capability " << cudnn->capabilities().min_compute_capability;
  // One topology (f16, d=64, causal top-left, unpadded), four geometries:
  // batch, heads, GQA, lengths and layout differ.
  const char* lines[] = {
      "b=1 hq=4 sq=64 skv=64 d=64 dtype=f16 mask=causal_tl dseed=1",
      "b=2 hq=4 sq=100 skv=130 d=64 dtype=f16 mask=causal_tl dseed=2",
      "b=1 hq=8 hkv=2 sq=257 skv=300 d=64 dtype=f16 mask=causal_tl dseed=3",
      "b=3 hq=2 sq=33 skv=500 d=64 dtype=f16 mask=causal_tl layout=bshd dseed=4",
  };
  for (const char* line : lines) {
    const Problem p = parse_problem(line);
    const CaseResult result = judge(*cudnn, p);
    ASSERT_EQ(result.status, Status::ok) << line << "\n" << explain(result);
    EXPECT_TRUE(result.passed()) << explain(result);
  }
  // The same geometry again: its graph is reused, nothing is built.
  EXPECT_TRUE(judge(*cudnn, parse_problem(lines[0])).passed());
  const std::string stats = cudnn->stats();
  std::printf("stats: %s\n", stats.c_str());
  EXPECT_NE(stats.find("5 launch(es), 1 reused"), std::string::npos) << stats;
  if (cudnn->version_info().find("dynamic shapes") != std::string::npos) {
    // No fallback: the four geometries were built with dynamic shapes, the
    // first compiled, the other three on the topology's kernel cache.
    EXPECT_NE(stats.find("graphs built: 4 with dynamic shapes (1 first of their topology (1 topology met)"),
              std::string::npos)
        << stats;
    EXPECT_NE(stats.find("3 later geometries of a known topology"), std::string::npos) << stats;
    EXPECT_NE(stats.find("0 per-geometry"), std::string::npos) << stats;
  }
}

}  // namespace
}  // namespace flashcheck
