// The rule that splits K over the W4A16 prefill kernel's blocks (src/backend/cuda/split_by_waves.h), checked
// on the CPU with the H200's numbers: 132 SMs, one block an SM, and clusters of s blocks that a GPC of 16 or
// 18 SMs holds floor(16 / s) or floor(18 / s) of (six and two GPCs).
#include <gtest/gtest.h>

#include <cstdint>

#include "backend/cuda/split_by_waves.h"

namespace qspec::cuda {
namespace {

constexpr int64_t kMinChunks = 4, kCostChunks = 4, kMaxSplits = 8;

int64_t h200_concurrent(int64_t splits) {
  if (splits == 1) return 132;
  return 6 * (16 / splits) + 2 * (18 / splits);
}

int64_t h200_splits(int64_t tiles, int64_t chunks) {
  return splits_by_waves(tiles, chunks, kMaxSplits, kMinChunks, kCostChunks, h200_concurrent);
}

TEST(SplitByWaves, SplitKGivesWholeSplits) {
  EXPECT_EQ(split_k(20, 1).splits, 1);
  EXPECT_EQ(split_k(20, 1).chunks_per_split, 20);
  EXPECT_EQ(split_k(72, 5).splits, 5);
  EXPECT_EQ(split_k(72, 5).chunks_per_split, 15);  // 4 of 15 and one of 12
  EXPECT_EQ(split_k(7, 6).splits, 4);              // 2 chunks a split: 4 splits, not 6
  EXPECT_EQ(split_k(7, 6).chunks_per_split, 2);
}

TEST(SplitByWaves, EnoughTilesAreNotSplit) {
  // 2,048 rows of gate|up in 128-feature, 128-row blocks: 2,304 tiles, 17.5 waves unsplit.
  EXPECT_EQ(h200_splits(2304, 20), 1);
  EXPECT_EQ(h200_splits(132, 72), 1);
}

TEST(SplitByWaves, FewTilesFillOneWave) {
  // 64 rows of down (2560 x 9216): 10 tiles, 72 chunks. Clusters of 8: 16 at once, one wave of 9 chunks.
  EXPECT_EQ(h200_splits(10, 72), 8);
  // 20 tiles of 32 chunks (out_proj at 128 rows, 64-row blocks): 8 ways would take two waves (16 clusters of
  // 8 at once), 5 ways one wave of 7 chunks (24 clusters of 5 at once).
  EXPECT_EQ(h200_concurrent(5), 6 * 3 + 2 * 3);
  EXPECT_EQ(h200_splits(20, 32), 5);
}

TEST(SplitByWaves, ClustersThatDoNotTileAGpcCostAWave) {
  // 40 tiles of 72 chunks: 3 ways is one wave only if 40 clusters of 3 fit (they do: 6 x 5 + 2 x 6 = 42);
  // with a GPU that holds only 32 of them it takes two waves and loses to 2 ways (one wave of 36 chunks is
  // 40 units; two waves of 24 are 56).
  EXPECT_EQ(h200_splits(40, 72), 3);
  const auto fewer_threes = [](int64_t splits) {
    return splits == 3 ? int64_t{32} : h200_concurrent(splits);
  };
  const int64_t chosen = splits_by_waves(40, 72, 4, kMinChunks, kCostChunks, fewer_threes);
  EXPECT_EQ(chosen, 2);
}

TEST(SplitByWaves, ShortSplitsAndImpossibleCountsAreSkipped) {
  // 8 chunks: 3 ways would leave splits of 3 chunks (below 4), 4 ways of 2; only 1 and 2 are allowed.
  for (int64_t tiles : {1, 10, 60}) EXPECT_LE(h200_splits(tiles, 8), 2) << tiles;
  // A count no tile can run at (0 at once) is never chosen, even where it would be cheapest.
  const auto no_eights = [](int64_t splits) { return splits == 8 ? int64_t{0} : h200_concurrent(splits); };
  EXPECT_NE(splits_by_waves(10, 72, kMaxSplits, kMinChunks, kCostChunks, no_eights), 8);
}

TEST(SplitByWaves, TiesGoToFewerSplits) {
  // 10 tiles of 8 chunks, no fixed cost: unsplit, all 10 at once, one wave of 8; split 2 ways, 5 at once,
  // two waves of 4. Equal: the unsplit one.
  const auto half_as_many = [](int64_t splits) { return splits == 1 ? int64_t{10} : int64_t{5}; };
  EXPECT_EQ(splits_by_waves(10, 8, 2, 1, 0, half_as_many), 1);
  // One more tile at once for the split makes it one wave of 4: cheaper, so chosen.
  const auto enough = [](int64_t splits) { return splits == 1 ? int64_t{10} : int64_t{10}; };
  EXPECT_EQ(splits_by_waves(10, 8, 2, 1, 0, enough), 2);
}

}  // namespace
}  // namespace qspec::cuda
