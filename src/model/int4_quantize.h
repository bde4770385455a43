// Round-to-nearest INT4 quantization of dense rows into the W4A16 layout the backends read (compressed-
// tensors pack-quantized): word k / 8 of a row holds its values k .. k + 7 as nibbles, lowest first, and a
// value is (nibble - 8) * scale[k / group_size], one BF16 scale per group of the row. No calibration (GPTQ is
// for the tools): for weights whose small errors only move proposals, such as a drafter's copy of the head.
#pragma once

#include <cstdint>

namespace qspec {

// rows x cols values of `w` (row-major) into packed [rows, cols / 8] and scales [rows, cols / group_size]
// (BF16 bits). Each group's scale is bf16(max |w| / 7) over its finite values and each value rounds to the
// nearest step (ties to even), clamped to -8..7; NaN becomes 0 and +-Inf a grid end. cols must be a multiple
// of group_size and group_size of 8 (the caller checks).
void quantize_int4_rows(const float* w, int64_t rows, int64_t cols, int group_size, uint32_t* packed,
                        uint16_t* scales);

}  // namespace qspec
