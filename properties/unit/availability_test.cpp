// Unavailable is not unsupported. Whether a subject can run on a machine is
// decided from the machine's GPU inventory (unavailable_reason, a pure
// function, tested here with made-up inventories: the suite's ctest skips rest
// on it), and a GPU subject run where no GPU is usable returns `unavailable`
// without launching anything.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#ifdef FLASHCHECK_HAVE_CUDA
#include <cstdio>
#include <fstream>
#include <iterator>

#include "flashcheck/core/gpu/cublas.hpp"
#include "flashcheck/core/gpu/gpu_subject.hpp"
#endif

namespace flashcheck {
namespace {

constexpr Capabilities kCpu = {.dtypes = {DType::f16}, .masks = {MaskKind::none}};

constexpr Capabilities gpu_domain(int min_compute_capability) {
  Capabilities caps = kCpu;
  caps.needs_gpu = true;
  caps.min_compute_capability = min_compute_capability;
  return caps;
}

// A machine with one device per listed compute capability.
GpuInventory machine(std::vector<int> compute_capabilities, int current = 0) {
  GpuInventory gpus;
  gpus.built_with_cuda = true;
  gpus.current = current;
  for (int i = 0; i < static_cast<int>(compute_capabilities.size()); ++i)
    gpus.devices.push_back({i, "fake sm_" + std::to_string(compute_capabilities[i]), compute_capabilities[i], 100, 80});
  return gpus;
}

TEST(Availability, ACpuSubjectRunsAnywhere) {
  GpuInventory not_built;
  not_built.note = "built without CUDA";
  EXPECT_FALSE(unavailable_reason(kCpu, not_built));
  EXPECT_FALSE(unavailable_reason(kCpu, machine({})));
  EXPECT_FALSE(unavailable_reason(kCpu, machine({70})));
}

TEST(Availability, NoCudaInTheBuildNoDeviceOrNoDriverMakeAGpuSubjectUnavailable) {
  GpuInventory not_built;
  not_built.note = "built without CUDA (FLASHCHECK_CUDA=OFF or no toolkit found)";
  const auto without_cuda = unavailable_reason(gpu_domain(80), not_built);
  ASSERT_TRUE(without_cuda);
  EXPECT_NE(without_cuda->find("needs a GPU; built without CUDA"), std::string::npos) << *without_cuda;

  GpuInventory broken_driver = machine({});
  broken_driver.note = "CUDA driver version is insufficient for CUDA runtime version";
  const auto no_driver = unavailable_reason(gpu_domain(80), broken_driver);
  ASSERT_TRUE(no_driver);
  EXPECT_NE(no_driver->find("none is usable here (CUDA driver version is insufficient"), std::string::npos) << *no_driver;

  const auto no_device = unavailable_reason(gpu_domain(0), machine({}));  // no minimum: still needs a device
  ASSERT_TRUE(no_device);
  EXPECT_NE(no_device->find("no CUDA device"), std::string::npos) << *no_device;
}

TEST(Availability, ADeviceBelowTheSubjectsComputeCapabilitySkipsWithTheReason) {
  const auto hopper_on_ampere = unavailable_reason(gpu_domain(90), machine({80}));
  ASSERT_TRUE(hopper_on_ampere) << "a Hopper subject on an sm_80 machine must be unavailable";
  EXPECT_EQ(*hopper_on_ampere, "needs compute capability sm_90 or newer; GPU 0 (fake sm_80) is sm_80");
  EXPECT_FALSE(unavailable_reason(gpu_domain(90), machine({90})));
  EXPECT_FALSE(unavailable_reason(gpu_domain(80), machine({80})));
  EXPECT_FALSE(unavailable_reason(gpu_domain(80), machine({90})));
  EXPECT_TRUE(unavailable_reason(gpu_domain(80), machine({75})));
}

TEST(Availability, TheDeviceThisProcessUsesDecides) {
  EXPECT_FALSE(unavailable_reason(gpu_domain(90), machine({80, 90}, 1)));
  const auto on_the_older = unavailable_reason(gpu_domain(90), machine({80, 90}, 0));
  ASSERT_TRUE(on_the_older);
  EXPECT_NE(on_the_older->find("GPU 0 (fake sm_80) is sm_80"), std::string::npos) << *on_the_older;
}

#ifdef FLASHCHECK_HAVE_CUDA
std::atomic<bool> launched{false};
void record_launch(const gpu::AttentionArgs&, const gpu::CallSite&) { launched = true; }
constexpr Capabilities kAnyGpu = gpu_domain(0);
#endif

TEST(Availability, AGpuSubjectWithoutAUsableGpuIsUnavailableAndLaunchesNothing) {
#ifndef FLASHCHECK_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: no GpuSubject to run (the inventory cases above still ran)";
#else
  const GpuInventory gpus = gpu_devices();
  if (!gpus.devices.empty()) GTEST_SKIP() << "a GPU is usable here: " << gpus.devices.front().name;
  gpu::KernelSubject subject("test-gpu-subject", "records whether it was launched", kAnyGpu, record_launch);
  const Problem p = parse_problem("b=1 hq=2 sq=16 skv=16 d=8 dtype=f16 dseed=1");
  launched = false;
  const RunResult run = subject.run(p, generate_inputs(p));
  EXPECT_EQ(run.status, Status::unavailable) << to_string(run.status) << ": " << run.message;
  EXPECT_FALSE(run.message.empty());
  EXPECT_FALSE(launched) << "nothing may run where no GPU is usable";
  EXPECT_EQ(run.outputs.o.size(), 0);

  // Outside the domain it is still unsupported (the domain is checked first).
  const RunResult outside = subject.run(parse_problem("b=1 hq=2 sq=16 skv=16 d=8 dtype=f32"), generate_inputs(p));
  EXPECT_EQ(outside.status, Status::unsupported);

  // The judge and its record carry it: the verdict `unavailable`, never pass.
  const CaseResult judged = judge(subject, p);
  EXPECT_EQ(judged.status, Status::unavailable);
  EXPECT_FALSE(judged.passed());
  const nlohmann::json record = nlohmann::json(to_record(judged));
  EXPECT_EQ(record["verdict"], "unavailable");
  EXPECT_EQ(record["status"], "unavailable");
  EXPECT_EQ(record["message"], run.message);
#endif
}

#ifdef FLASHCHECK_HAVE_CUDA
// cuBLAS is loaded on first use, not when a process starts (core/gpu/cublas.hpp:
// linked, its initializers cost every flashcheck process about 0.16 s and 217 MB).
// Each ctest test is a process of its own, so nothing has loaded it before this one.
std::string mapped_files() {
  std::ifstream maps("/proc/self/maps");
  return {std::istreambuf_iterator<char>(maps), std::istreambuf_iterator<char>()};
}

TEST(CublasOnFirstUse, NotLoadedAtStartThenEveryFunctionResolvedWithoutAGpu) {
  EXPECT_EQ(mapped_files().find("libcublas"), std::string::npos) << "cuBLAS was loaded before its first use";
  const gpu::Cublas& table = gpu::cublas();
  EXPECT_NE(mapped_files().find("libcublas"), std::string::npos);
  EXPECT_NE(table.create, nullptr);
  EXPECT_NE(table.destroy, nullptr);
  EXPECT_NE(table.set_stream, nullptr);
  EXPECT_NE(table.set_math_mode, nullptr);
  EXPECT_NE(table.gemm_ex, nullptr);
  EXPECT_NE(table.sgemm_strided_batched, nullptr);
  ASSERT_NE(table.status_name, nullptr);
  ASSERT_NE(table.status_string, nullptr);
  EXPECT_STREQ(table.status_name(CUBLAS_STATUS_ALLOC_FAILED), "CUBLAS_STATUS_ALLOC_FAILED");
  EXPECT_NE(std::string(table.status_string(CUBLAS_STATUS_ALLOC_FAILED)), "");
  EXPECT_EQ(&gpu::cublas(), &table);  // loaded once
}

// The flashcheck binary does not name cuBLAS among the libraries it needs.
TEST(CublasOnFirstUse, TheBinaryDoesNotLinkIt) {
  std::FILE* pipe = ::popen("readelf -d " FLASHCHECK_BINARY " 2>/dev/null", "r");
  ASSERT_NE(pipe, nullptr);
  std::string dynamic;
  char buffer[4096];
  while (const std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) dynamic.append(buffer, n);
  if (::pclose(pipe) != 0 || dynamic.find("NEEDED") == std::string::npos)
    GTEST_SKIP() << "readelf cannot list the binary's needed libraries here";
  EXPECT_NE(dynamic.find("libcudart"), std::string::npos) << dynamic;  // the listing is the real one
  EXPECT_EQ(dynamic.find("libcublas"), std::string::npos) << dynamic;
}
#endif

}  // namespace
}  // namespace flashcheck
