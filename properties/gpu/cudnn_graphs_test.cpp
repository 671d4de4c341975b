// The cuDNN subject's graphs (issue 20): geometries of one topology are built
// with dynamic shapes on one kernel cache, and each still agrees with the
// oracle; a dynamic-shape path that fails (forced through the subject's test
// seam) falls back to the per-geometry graph, whose answer is right. Prints
// stats() so that the build times of the first and the later geometries can
// be compared. Its own binary: the subject's caches live as long as the
// process (the tests run in this order in one process, or one per process
// under ctest). GPU only; SKIPPED without one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/gpu/device_info.hpp"
#include "core/subject.hpp"
#include "core/values.hpp"
#include "oracles/cudnn/cudnn_sdpa_testing.hpp"
#include "oracles/judge.hpp"

namespace flashcheck {
namespace {

// The cudnn subject, or why this machine cannot run it.
Subject* cudnn_here(std::string* why) {
  unsetenv("FLASHCHECK_CUDNN_KERNEL_CACHE_DIR");  // this process's caches only (read when the subject is made)
  const GpuInventory inventory = gpu_devices();
  if (inventory.devices.empty()) {
    *why = "no GPU: " + inventory.note;
    return nullptr;
  }
  Subject* cudnn = Registry::instance().find("cudnn");
  if (cudnn && inventory.devices.front().compute_capability < cudnn->capabilities().min_compute_capability) {
    *why = "cudnn needs compute capability " + std::to_string(cudnn->capabilities().min_compute_capability);
    return nullptr;
  }
  if (!cudnn) *why = "no cudnn subject in this binary";
  return cudnn;
}

void expect_agreement(Subject& subject, const char* line) {
  const CaseResult result = judge(subject, parse_problem(line));
  ASSERT_EQ(result.status, Status::ok) << line << "\n" << explain(result);
  EXPECT_TRUE(result.passed()) << explain(result);
}

TEST(GpuCudnnGraphs, GeometriesOfOneTopologyShareAKernelCacheAndAgreeWithTheOracle) {
  std::string why;
  Subject* cudnn = cudnn_here(&why);
  if (!cudnn) GTEST_SKIP() << why;
  // One topology (f16, d=64, causal top-left, unpadded), four geometries:
  // batch, heads, GQA, lengths and layout differ.
  const char* lines[] = {
      "b=1 hq=4 sq=64 skv=64 d=64 dtype=f16 mask=causal_tl dseed=1",
      "b=2 hq=4 sq=100 skv=130 d=64 dtype=f16 mask=causal_tl dseed=2",
      "b=1 hq=8 hkv=2 sq=257 skv=300 d=64 dtype=f16 mask=causal_tl dseed=3",
      "b=3 hq=2 sq=33 skv=500 d=64 dtype=f16 mask=causal_tl layout=bshd dseed=4",
  };
  for (const char* line : lines) expect_agreement(*cudnn, line);
  // The same geometry again: its graph is reused, nothing is built.
  EXPECT_TRUE(judge(*cudnn, parse_problem(lines[0])).passed());
  const std::string stats = cudnn->stats();
  std::printf("stats: %s\n", stats.c_str());
  EXPECT_NE(stats.find("5 launch(es), 1 reused"), std::string::npos) << stats;
  // cuDNN 9.14 (the GPU machine's, 2026-11-25) refuses dynamic shapes on its
  // SDPA engines ("This engine currently does not support dynamic shape"):
  // the answers were checked above, the kernel cache cannot be.
  if (stats.find("dynamic shapes: cuDNN refused") != std::string::npos)
    GTEST_SKIP() << "this cuDNN refuses dynamic shapes for SDPA, so its kernel cache is not exercised: " << stats;
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

TEST(GpuCudnnGraphs, AFailedDynamicShapePathFallsBackToThePerGeometryGraph) {
  std::string why;
  Subject* cudnn = cudnn_here(&why);
  if (!cudnn) GTEST_SKIP() << why;
  if (cudnn->version_info().find("dynamic shapes") == std::string::npos)
    GTEST_SKIP() << "dynamic shapes are off here: " << cudnn->version_info();
  // A build refused with dynamic shapes: the per-geometry graph answers, and
  // its topology, which never built with dynamic shapes, keeps to them.
  cudnn_testing::fail_dynamic_path(1, 0);
  expect_agreement(*cudnn, "b=1 hq=2 sq=77 skv=90 d=128 dtype=bf16 mask=none dseed=7");
  expect_agreement(*cudnn, "b=2 hq=2 sq=50 skv=61 d=128 dtype=bf16 mask=none dseed=8");
  std::string stats = cudnn->stats();
  EXPECT_NE(stats.find("fallbacks: 1 at build, 0 at execute"), std::string::npos) << stats;
  EXPECT_NE(stats.find("injected by cudnn_testing"), std::string::npos) << stats;
  // An execute of a dynamic-shape graph that fails (its outputs left
  // poisoned): the per-geometry graph of that geometry writes every output.
  expect_agreement(*cudnn, "b=1 hq=2 sq=40 skv=40 d=96 dtype=f16 mask=causal_br dseed=9");
  if (cudnn->stats().find("dynamic shapes: cuDNN refused (create") != std::string::npos)
    GTEST_SKIP() << "this cuDNN refuses dynamic shapes for SDPA, so a failed dynamic execute cannot be forced "
                    "(the build fallback was checked above): "
                 << cudnn->stats();
  cudnn_testing::fail_dynamic_path(0, 1);
  expect_agreement(*cudnn, "b=2 hq=4 hkv=1 sq=30 skv=45 d=96 dtype=f16 mask=causal_br dseed=10");
  cudnn_testing::fail_dynamic_path(0, 0);
  stats = cudnn->stats();
  std::printf("stats: %s\n", stats.c_str());
  EXPECT_NE(stats.find("fallbacks: 1 at build, 1 at execute"), std::string::npos) << stats;
}

}  // namespace
}  // namespace flashcheck
