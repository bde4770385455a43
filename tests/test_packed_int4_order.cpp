// The CUDA backend's order of W4A16 packed words (src/backend/cuda/packed_int4_order.h), checked on the CPU:
// the tensor-core kernels and the uploads both rely on it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/packed_int4_order.h"

namespace qspec::cuda {
namespace {

TEST(PackedInt4Order, WholeChunksAreTransposedQuads) {
  // Word (block u, offset q) of a chunk sits at offset 4q + u: the 16 bytes at word 4q hold offset q of
  // blocks 0..3.
  const int64_t words_per_row = 32;
  for (int64_t chunk = 0; chunk < 2; ++chunk)
    for (int64_t u = 0; u < 4; ++u)
      for (int64_t q = 0; q < 4; ++q)
        EXPECT_EQ(packed_word_position(chunk * 16 + 4 * u + q, words_per_row), chunk * 16 + 4 * q + u)
            << "chunk " << chunk << " block " << u << " offset " << q;
}

TEST(PackedInt4Order, IsAPermutationOfEachRowAndItsOwnInverse) {
  for (int64_t words_per_row : {1, 4, 15, 16, 17, 35, 320, 1152}) {
    std::set<int64_t> positions;
    for (int64_t w = 0; w < words_per_row; ++w) {
      const int64_t p = packed_word_position(w, words_per_row);
      ASSERT_GE(p, 0);
      ASSERT_LT(p, words_per_row) << "word " << w << " of " << words_per_row;
      EXPECT_EQ(packed_word_position(p, words_per_row), w) << "word " << w << " of " << words_per_row;
      positions.insert(p);
    }
    EXPECT_EQ(static_cast<int64_t>(positions.size()), words_per_row);
  }
}

TEST(PackedInt4Order, APartialLastChunkKeepsTheCheckpointOrder) {
  const int64_t words_per_row = 35;  // two whole chunks, then 3 words (K = 280)
  for (int64_t w = 32; w < 35; ++w) EXPECT_EQ(packed_word_position(w, words_per_row), w);
  EXPECT_EQ(packed_word_position(1, words_per_row), 4);  // a whole chunk is reordered
}

// The upload's chunk-at-a-time copy puts every word where packed_word_position says, from unaligned bytes,
// for rows of whole chunks, of a partial chunk only, and of both.
TEST(PackedInt4Order, DeviceOrderCopyMovesEveryWordToItsPosition) {
  std::mt19937 rng(7);
  for (int64_t words_per_row : {1, 15, 16, 35, 320}) {
    const int64_t rows = 3;
    std::vector<uint32_t> words(static_cast<size_t>(rows * words_per_row));
    for (uint32_t& word : words) word = static_cast<uint32_t>(rng());
    std::vector<unsigned char> unaligned(words.size() * 4 + 1);
    std::memcpy(unaligned.data() + 1, words.data(), words.size() * 4);
    std::vector<uint32_t> ordered(words.size(), 0xDEADBEEFu);
    packed_int4_device_order(ordered.data(), unaligned.data() + 1, rows, words_per_row);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t w = 0; w < words_per_row; ++w)
        ASSERT_EQ(ordered[static_cast<size_t>(r * words_per_row + packed_word_position(w, words_per_row))],
                  words[static_cast<size_t>(r * words_per_row + w)])
            << "row " << r << " word " << w << " of " << words_per_row;
  }
}

}  // namespace
}  // namespace qspec::cuda
