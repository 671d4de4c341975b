// The cuDNN subject's graphs (issue 20): geometries of one topology are built
// with dynamic shapes on one kernel cache, and each still agrees with the
// oracle; a dynamic-shape path that fails (forced through the subject's test
// seam) falls back to the per-geometry graph, whose answer is right. Prints
// stats() so that the build times of the first and the later geometries can
// be compared. Its own binary: the subject's caches live as long as the
// process (the tests run in this order in one process, or one per process
// under ctest). GPU only; SKIPPED without one.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/oracles/cudnn/cudnn_sdpa_testing.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck {
namespace {

// The cudnn subject, or why this machine cannot run it.
Subject* cudnn_here(std::string* why) {
  unsetenv("FLASHCHECK_CUDNN_CACHE_DIR");  // this process's caches only (read when the subject is made)
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
  if (cudnn->version_info().find("dynamic shapes with a kernel cache") != std::string::npos) {
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
  // version_info() names the graphs it builds: "dynamic shapes with a kernel
  // cache per topology", or "per-geometry graphs (why)" once they are off.
  if (cudnn->version_info().find("dynamic shapes with a kernel cache") == std::string::npos)
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

// The count in stats() after `label` ("plan files: 2 read"), or -1.
long stat_count(const std::string& stats, const std::string& label) {
  const std::size_t at = stats.find(label);
  if (at == std::string::npos) return -1;
  std::size_t begin = at + label.size();
  return std::strtol(stats.c_str() + begin, nullptr, 10);
}

TEST(GpuCudnnGraphs, APlanFileWrittenByOneProcessIsLoadedByTheNextInsteadOfCompiled) {
  std::string why;
  if (!cudnn_here(&why)) GTEST_SKIP() << why;
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / ("flashcheck-cudnn-plans-" + std::to_string(getpid()));
  std::filesystem::remove_all(folder);
  // Two geometries the dynamic path cannot take (plain graphs wherever cuDNN
  // refuses dynamic shapes): a window mask and a padded batch.
  const char* lines[] = {
      "b=2 hq=4 hkv=2 sq=70 skv=90 d=64 dtype=bf16 mask=window window=20,0 dseed=11",
      "b=3 hq=2 sq=40 skv=64 lens_q=40,17,3 lens_kv=64,30,9 d=128 dtype=f16 mask=none dseed=12",
  };
  JudgeOptions keep;
  keep.keep_outputs = true;
  std::vector<CaseResult> first;
  {
    const auto writer = cudnn_testing::make_subject(folder.string());
    for (const char* line : lines) {
      first.push_back(judge(*writer, parse_problem(line), keep));
      ASSERT_TRUE(first.back().passed()) << explain(first.back());
    }
    std::printf("first process: %s\n", writer->stats().c_str());
    if (writer->stats().find("with dynamic shapes (0 first") == std::string::npos)
      GTEST_SKIP() << "this cuDNN built these with dynamic shapes; plan files hold plain graphs only: "
                   << writer->stats();
    EXPECT_EQ(stat_count(writer->stats(), "instead of compiled, "), 2) << writer->stats();
  }
  {
    // The next process: both plans loaded, nothing compiled, the same bits.
    const auto reader = cudnn_testing::make_subject(folder.string());
    for (std::size_t n = 0; n < 2; ++n) {
      const CaseResult again = judge(*reader, parse_problem(lines[n]), keep);
      ASSERT_TRUE(again.passed()) << explain(again);
      EXPECT_EQ(again.outputs.o, first[n].outputs.o) << lines[n];
      ASSERT_EQ(again.outputs.lse.size(), first[n].outputs.lse.size());
      EXPECT_EQ(std::memcmp(again.outputs.lse.data(), first[n].outputs.lse.data(),
                            again.outputs.lse.size() * sizeof(float)),
                0)
          << lines[n];
    }
    const std::string stats = reader->stats();
    std::printf("second process: %s\n", stats.c_str());
    EXPECT_EQ(stat_count(stats, "plan files: "), 2) << stats;
    EXPECT_NE(stats.find("0 per-geometry"), std::string::npos) << stats;
  }
  {
    // A plan file cuDNN cannot load (its blob truncated): rebuilt, rewritten, right.
    for (const auto& entry : std::filesystem::recursive_directory_iterator(folder))
      if (entry.path().extension() == ".plan") {
        const auto size = std::filesystem::file_size(entry.path());
        std::filesystem::resize_file(entry.path(), size / 2);
      }
    const auto damaged = cudnn_testing::make_subject(folder.string());
    for (const char* line : lines) {
      const CaseResult result = judge(*damaged, parse_problem(line), keep);
      EXPECT_TRUE(result.passed()) << explain(result);
    }
    const std::string stats = damaged->stats();
    std::printf("damaged files: %s\n", stats.c_str());
    EXPECT_EQ(stat_count(stats, "plan files: "), 0) << stats;
    EXPECT_NE(stats.find("2 rejected"), std::string::npos) << stats;
    EXPECT_NE(stats.find("2 per-geometry"), std::string::npos) << stats;
  }
  std::filesystem::remove_all(folder);
}

}  // namespace
}  // namespace flashcheck
