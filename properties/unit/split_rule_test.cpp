// splitkv's split count (kernels/include/flashcheck/kernels/splitkv/split_rule.hpp),
// on the H100's and H200's 132 SMs x 3 resident split blocks (396 slots).
#include <gtest/gtest.h>

#include "flashcheck/kernels/splitkv/split_rule.hpp"

namespace flashcheck::kernels {
namespace {

constexpr int kSlots = 132 * 3;

TEST(SplitRuleTest, AGridThatFillsTheSlotsIsNotSplit) {
  EXPECT_EQ(splitkv_split_count(400, 32768, kSlots), 1);
  EXPECT_EQ(splitkv_split_count(317, 32768, kSlots), 1);  // 0.8 of the slots
}

TEST(SplitRuleTest, BatchDecodeFillsItsLastWave) {
  // b=16 hkv=8, 4 query rows a K/V head: 128 blocks a split; 3 splits fill 384 of 396 slots.
  EXPECT_EQ(splitkv_split_count(128, 32768, kSlots), 3);
}

TEST(SplitRuleTest, OneLongSequenceGetsTheWaveRulesCount) {
  // b=1 hq=8 hkv=1 sq=1 skv=131072: 2 blocks a split. The rule's best among
  // 1..128 is 128 (256 of 396 slots), and the fewest within 85% of it is 109
  // (FlashAttention-3's choice on this shape); the old cap of 64 gave 55.
  EXPECT_EQ(splitkv_split_count(2, 131072, kSlots), 109);
  // b=1 hq=32 hkv=8: 8 blocks a split; 99 splits would fill two waves
  // exactly, and 43 is the first within 85% of that.
  EXPECT_EQ(splitkv_split_count(8, 32768, kSlots), 43);
}

TEST(SplitRuleTest, TheTensorCorePathMaySplitUpToOneWave) {
  // splitkv v4's tensor-core block: 2 resident a SM (264 slots), one block a
  // split for b=1 hkv=1 (16 rows), the cap one wave of the slots: the best
  // is 264 splits (a full wave), and the fewest within 85% of it is 225.
  constexpr int kMmaSlots = 132 * 2;
  EXPECT_EQ(splitkv_split_count(1, 131072, kMmaSlots, kMmaSlots), 225);
  // The same shape under FlashAttention's cap of 128: 128 is the best (0.48 of
  // a wave), and 109 the first within 85% of it.
  EXPECT_EQ(splitkv_split_count(1, 131072, kMmaSlots), 109);
  // The keys still bound it: 32768 keys allow at most 128 splits of 256, and
  // 109 is again the first within 85% of 128.
  EXPECT_EQ(splitkv_split_count(1, 32768, kMmaSlots, kMmaSlots), 109);
}

TEST(SplitRuleTest, EverySplitKeepsItsKeys) {
  EXPECT_EQ(splitkv_split_count(2, 300, kSlots), 1);    // under 2 x 256 keys: one split
  EXPECT_EQ(splitkv_split_count(2, 1024, kSlots), 4);   // at most 1024 / 256
  for (int keys : {1, 255, 256, 4096, 131072, 1 << 24})
    for (std::int64_t blocks : {1, 2, 7, 64, 200}) {
      const int splits = splitkv_split_count(blocks, keys, kSlots);
      EXPECT_GE(splits, 1);
      EXPECT_LE(splits, std::max(1, std::min(kSplitKvRuleMostSplits, keys / kSplitKvMinKeys))) << keys << " " << blocks;
    }
}

}  // namespace
}  // namespace flashcheck::kernels
