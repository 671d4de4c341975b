// flashcheck::testing as a user's project sees it: its own GoogleTest main,
// its own subject (here the same-precision CPU baseline under a name of its
// own, a kernel that passes every property), the whole suite added with one
// call. Built with only the library's public include paths (no repository
// root), so a header the library needs but does not export fails here.
#include <gtest/gtest.h>

#include <string_view>

#include "flashcheck/oracles/cpu_lowp.hpp"
#include "flashcheck/testing/property_suite.hpp"

namespace {

class MyKernel final : public flashcheck::CpuLowp {
 public:
  std::string_view name() const override { return "my-kernel"; }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  static MyKernel kernel;
  flashcheck::testing::add_property_tests(kernel);  // Subject_my_kernel.<Property>
  return RUN_ALL_TESTS();
}
