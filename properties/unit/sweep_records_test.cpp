// The sweep's reading of records: JSON has no NaN or infinity, so a NaN or
// infinite worst ratio or time is written as null. A torch backend's case
// with an infinite ratio (a bound of 0 against a nonzero error) did this on
// the H200 on 2026-11-23, and the driver ended on it with a type error
// instead of recording the case. Records are now read by the typed reader
// (core/record.hpp, which writes NaN and infinities as strings and reads an
// older writer's null as NaN: record_test.cpp); detail::number still reads
// the sweep's budget file, and takes null and missing as 0.
#include <gtest/gtest.h>

#include <limits>

#include "flashcheck/fuzz/sweep_parts.hpp"

namespace flashcheck::fuzz::detail {
namespace {

TEST(SweepRecords, NullAndMissingNumbersReadAsZero) {
  nlohmann::json record = {{"worst_ratio", std::numeric_limits<double>::infinity()},  // dumped as null
                           {"timing_ms", {{"subject", 2.5}}}};
  const nlohmann::json parsed = nlohmann::json::parse(record.dump());
  ASSERT_TRUE(parsed["worst_ratio"].is_null());
  EXPECT_EQ(number(parsed, "worst_ratio"), 0.0);
  EXPECT_EQ(number(parsed, "absent"), 0.0);
  EXPECT_EQ(number(parsed["timing_ms"], "subject"), 2.5);
  EXPECT_THROW((void)parsed.value("worst_ratio", 0.0), nlohmann::json::type_error);  // what the driver did before
}

}  // namespace
}  // namespace flashcheck::fuzz::detail
