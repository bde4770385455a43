// The CUDA backend's order of W4A16 packed words within a row (the checkpoint's: word w holds values 8w ..
// 8w + 7). In each whole 128-value chunk of a row (16 words, four 32-value blocks of four words), the word of
// block u at offset q is stored at offset 4q + u: the tensor-core kernels' lane q then reads its words of all
// four blocks with one 16-byte load, with no transpose across the quad. A partial chunk at the end of a row
// keeps the checkpoint order. The permutation is its own inverse. Kernels that read packed words find them
// with packed_word_position; the backend permutes the rows when it uploads them.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define QSPEC_HOST_DEVICE __host__ __device__
#else
#define QSPEC_HOST_DEVICE
#endif

namespace qspec::cuda {

constexpr int64_t kPackedChunkWords = 16;

// Where checkpoint word `word` of a row of `words_per_row` words is stored (and the reverse).
QSPEC_HOST_DEVICE inline int64_t packed_word_position(int64_t word, int64_t words_per_row) {
  const int64_t chunk_start = word - word % kPackedChunkWords;
  if (chunk_start + kPackedChunkWords > words_per_row) return word;  // the partial chunk
  const int64_t j = word - chunk_start;
  return chunk_start + (j % 4) * 4 + j / 4;
}

}  // namespace qspec::cuda

#undef QSPEC_HOST_DEVICE
