// The CUDA backend's order of W4A16 packed words within a row (the checkpoint's: word w holds values 8w ..
// 8w + 7). In each whole 128-value chunk of a row (16 words, four 32-value blocks of four words), the word of
// block u at offset q is stored at offset 4q + u: the tensor-core kernels' lane q then reads its words of all
// four blocks with one 16-byte load, with no transpose across the quad. A partial chunk at the end of a row
// keeps the checkpoint order. The permutation is its own inverse. Kernels that read packed words find them
// with packed_word_position; the backend permutes the rows when it uploads them.
#pragma once

#include <cstdint>
#include <cstring>

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

// Rows of checkpoint-order words (`words` may be unaligned: a safetensors mapping) into `out` in the
// backend's order, a chunk of 16 words at a time.
inline void packed_int4_device_order(uint32_t* out, const void* words, int64_t rows, int64_t words_per_row) {
  const auto* bytes = static_cast<const unsigned char*>(words);
  const int64_t whole = words_per_row - words_per_row % kPackedChunkWords;
  for (int64_t r = 0; r < rows; ++r) {
    const unsigned char* row = bytes + r * words_per_row * 4;
    uint32_t* ordered = out + r * words_per_row;
    for (int64_t c = 0; c < whole; c += kPackedChunkWords) {
      uint32_t chunk[kPackedChunkWords];
      std::memcpy(chunk, row + c * 4, sizeof(chunk));
      for (int j = 0; j < kPackedChunkWords; ++j) ordered[c + (j % 4) * 4 + j / 4] = chunk[j];
    }
    std::memcpy(ordered + whole, row + whole * 4, static_cast<size_t>(words_per_row - whole) * 4);
  }
}

}  // namespace qspec::cuda

#undef QSPEC_HOST_DEVICE
