// bench's summary line under each problem (reports/bench.cpp): the fastest
// subject, and every subject's speed over the peer's (issue 24's bench set).
#include <gtest/gtest.h>

#include "flashcheck/reports/bench.hpp"

namespace flashcheck::reports {
namespace {

TEST(BenchSummary, NamesTheFastestAndEverySubjectOverThePeer) {
  const std::vector<TimedSubject> timed = {
      {"cudnn", 0.821, true}, {"hopper", 0.907, false}, {"mma-kv-pipelined", 1.758, false}};
  EXPECT_EQ(problem_summary(timed, "cudnn"),
            "  best: cudnn (peer) 0.821 ms; vs cudnn: hopper 0.91x, mma-kv-pipelined 0.47x");
}

TEST(BenchSummary, ASubjectFasterThanThePeerIsTheBestWithItsRatio) {
  const std::vector<TimedSubject> timed = {{"cudnn", 3.076, true}, {"hopper-bwd", 2.875, false}};
  EXPECT_EQ(problem_summary(timed, "cudnn"), "  best: hopper-bwd 2.875 ms, 1.07x cudnn; vs cudnn: hopper-bwd 1.07x");
}

TEST(BenchSummary, WithoutThePeersTimeItSaysWhyThereIsNoRatio) {
  const std::vector<TimedSubject> timed = {{"decode", 0.712, false}, {"splitkv", 0.9, false}};
  EXPECT_EQ(problem_summary(timed, "cudnn"), "  best: decode 0.712 ms; cudnn not timed on this problem");
  EXPECT_EQ(problem_summary(timed, ""), "  best: decode 0.712 ms; no peer");
  EXPECT_EQ(problem_summary({}, "cudnn"), "");
  EXPECT_EQ(problem_summary({{"cudnn", 1.0, true}}, "cudnn"), "  best: cudnn (peer) 1.000 ms");
  // A ratio below 0.01 keeps two digits, as the table's column does.
  EXPECT_EQ(problem_summary({{"cudnn", 2.706, true}, {"fa2-rowthread-bwd", 1764.283, false}}, "cudnn"),
            "  best: cudnn (peer) 2.706 ms; vs cudnn: fa2-rowthread-bwd 1.5e-03x");
}

}  // namespace
}  // namespace flashcheck::reports
