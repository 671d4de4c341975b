// The CTest GPU allocation parser (properties/ctest_resources.hpp).
#include <gtest/gtest.h>

#include "properties/ctest_resources.hpp"

namespace flashcheck {
namespace {

TEST(CtestResources, TheDeviceIdOfAnAllocation) {
  EXPECT_EQ(ctest_gpu_id("id:3,slots:1"), "3");
  EXPECT_EQ(ctest_gpu_id("slots:2,id:0"), "0");
  EXPECT_EQ(ctest_gpu_id("id:GPU-5c1d,slots:1"), "GPU-5c1d");  // a UUID works for CUDA_VISIBLE_DEVICES too
}

TEST(CtestResources, NoIdIsNoAllocation) {
  EXPECT_EQ(ctest_gpu_id(""), std::nullopt);
  EXPECT_EQ(ctest_gpu_id("slots:1"), std::nullopt);
  EXPECT_EQ(ctest_gpu_id("id:,slots:1"), std::nullopt);
}

}  // namespace
}  // namespace flashcheck
