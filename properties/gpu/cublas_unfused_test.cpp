// cublas-unfused when its cuBLAS handle cannot be created, as may happen while
// eight test processes create their contexts and handles at once (issue 20:
// Gpu_cublas_unfused.AgreesWithTheOracle failed once, 1.88 s into
// `ctest -L gpu -j 8`, and never again). The creation goes through the
// subject's test seam, so the failure is forced, not waited for. A failed
// creation must come back as an error naming every status, must leave no
// half-made handle behind, and a creation that fails once and then succeeds
// must give a right answer. Its own binary: the subject keeps one handle per
// process. GPU only; SKIPPED without one.
#include <gtest/gtest.h>

#include <string>

#include "flashcheck/core/gpu/cublas.hpp"
#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/kernels/fp32/cublas_unfused.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck {
namespace {

int creations_to_fail = 0;  // how many of the next creations fail
int creations_tried = 0;

// Fails the way a creation out of resources does, after writing a non-null
// value to the handle: nothing promises that a failed creation leaves its
// output alone, so the subject must not keep it.
cublasStatus_t flaky_create(cublasHandle_t* handle) {
  ++creations_tried;
  if (creations_to_fail > 0) {
    --creations_to_fail;
    *handle = reinterpret_cast<cublasHandle_t>(0x1);
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  return gpu::cublas().create(handle);
}

// Restores cuBLAS's own creation whatever the test's outcome.
struct SeamInstalled {
  SeamInstalled() { kernels::testing::replace_cublas_create(flaky_create); }
  ~SeamInstalled() { kernels::testing::replace_cublas_create(nullptr); }
};

TEST(GpuCublasUnfused, AFailedHandleCreationIsAClearErrorAndATransientOneIsRetried) {
  const GpuInventory inventory = gpu_devices();
  if (inventory.devices.empty()) GTEST_SKIP() << "no GPU: " << inventory.note;
  Subject* subject = Registry::instance().find("cublas-unfused");
  ASSERT_NE(subject, nullptr);
  if (inventory.devices.front().compute_capability < subject->capabilities().min_compute_capability)
    GTEST_SKIP() << "cublas-unfused needs compute capability " << subject->capabilities().min_compute_capability;
  const SeamInstalled seam;
  const Problem p = parse_problem("b=2 hq=4 hkv=2 sq=33 skv=70 d=24 dtype=f32 mask=causal_br dseed=5");
  ASSERT_FALSE(unsupported_reason(subject->capabilities(), p)) << to_line(p);
  const Inputs inputs = generate_inputs(p);

  // Every creation fails: an error (not a result, not a refusal) that names
  // the call, cuBLAS's status and the problem.
  creations_to_fail = 1000;
  const RunResult failed = subject->run(p, inputs);
  EXPECT_EQ(failed.status, Status::error) << failed.message;
  EXPECT_NE(failed.message.find("cublasCreate"), std::string::npos) << failed.message;
  EXPECT_NE(failed.message.find("CUBLAS_STATUS_ALLOC_FAILED"), std::string::npos) << failed.message;
  EXPECT_NE(failed.message.find(to_line(p)), std::string::npos) << failed.message;
  EXPECT_GE(creations_tried, 1);

  // One creation fails, the next succeeds: the subject retries, keeps no
  // half-made handle, and its answer is right.
  creations_to_fail = 1;
  creations_tried = 0;
  const CaseResult recovered = judge(*subject, p, inputs);
  ASSERT_EQ(recovered.status, Status::ok) << explain(recovered);
  EXPECT_TRUE(recovered.passed()) << explain(recovered);
  EXPECT_EQ(creations_tried, 2);
  // The retry is not silent: stats() tells of the failed attempt.
  EXPECT_NE(subject->stats().find("CUBLAS_STATUS_ALLOC_FAILED"), std::string::npos) << subject->stats();

  // The handle is kept: no creation on the next call.
  const CaseResult again = judge(*subject, p, inputs);
  EXPECT_TRUE(again.passed()) << explain(again);
  EXPECT_EQ(creations_tried, 2);
}

}  // namespace
}  // namespace flashcheck
