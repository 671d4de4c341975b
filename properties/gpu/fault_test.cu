// Sticky CUDA errors: a kernel that writes to an illegal address must come back
// as Status::fault naming the problem, and every later GPU call in the process
// must refuse to touch the poisoned context. Its own binary: the fault ends
// the process's use of the device.
#include <gtest/gtest.h>

#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/gpu/gpu_subject.hpp"
#include "flashcheck/core/values.hpp"

namespace flashcheck {
namespace {

__global__ void write_to_null(float* out) { out[threadIdx.x + (1 << 20)] = 1.0f; }

constexpr Capabilities kCapabilities = {
    .dtypes = {DType::f32},
    .masks = {MaskKind::none},
    .needs_gpu = true,
};

// A deliberately faulting subject, known only to this test.
class IllegalAddress final : public gpu::GpuSubject {
 public:
  std::string_view name() const override { return "test-illegal-address"; }
  std::string_view description() const override { return "writes through a null pointer"; }
  const Capabilities& capabilities() const override { return kCapabilities; }

 private:
  void launch(const Problem&, const gpu::AttentionArgs& args, const gpu::CallSite& site) override {
    write_to_null<<<1, 32, 0, args.stream>>>(nullptr);
    gpu::check_launch("write_to_null", site);
  }
};

TEST(GpuFault, AnIllegalAddressIsAFaultAndPoisonsTheContext) {
  if (gpu_devices().devices.empty()) GTEST_SKIP() << "no GPU: " << gpu_devices().note;
  Subject* good = Registry::instance().find("fa2-rowthread");
  ASSERT_NE(good, nullptr);
  const Problem p = parse_problem("b=1 hq=2 sq=33 skv=40 d=16 dtype=f32 dseed=3");  // inside both domains
  const Inputs in = generate_inputs(p);
  EXPECT_EQ(good->run(p, in).status, Status::ok);

  IllegalAddress bad;
  const RunResult fault = bad.run(p, in);
  EXPECT_EQ(fault.status, Status::fault) << fault.message;
  EXPECT_NE(fault.message.find("illegal"), std::string::npos) << fault.message;
  EXPECT_NE(fault.message.find(to_line(p)), std::string::npos) << "the message names the problem: " << fault.message;
  EXPECT_NE(fault.message.find("test-illegal-address"), std::string::npos) << fault.message;

  const RunResult after = good->run(p, in);
  EXPECT_EQ(after.status, Status::fault) << "a poisoned context must not be used again: " << after.message;
  EXPECT_NE(after.message.find("poisoned"), std::string::npos) << after.message;
}

}  // namespace
}  // namespace flashcheck
