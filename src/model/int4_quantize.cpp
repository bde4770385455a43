#include "model/int4_quantize.h"

#include <algorithm>
#include <cmath>

#include "core/half.h"

namespace qspec {

void quantize_int4_rows(const float* w, int64_t rows, int64_t cols, int group_size, uint32_t* packed,
                        uint16_t* scales) {
  const int64_t groups = cols / group_size;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    for (int64_t g = 0; g < groups; ++g) {
      const float* group = row + g * group_size;
      float largest = 0.0f;
      for (int i = 0; i < group_size; ++i)
        if (std::isfinite(group[i])) largest = std::max(largest, std::fabs(group[i]));
      const uint16_t scale_bits = f32_to_bf16(largest / 7.0f);
      scales[r * groups + g] = scale_bits;
      const float scale = bf16_to_f32(scale_bits);
      for (int i = 0; i < group_size; i += 8) {
        uint32_t word = 0;
        for (int j = 0; j < 8; ++j) {
          const float v = group[i + j];
          const float q = scale > 0.0f && !std::isnan(v) ? std::nearbyint(v / scale) : 0.0f;
          const auto nibble = static_cast<uint32_t>(std::clamp(q, -8.0f, 7.0f) + 8.0f);
          word |= nibble << (4 * j);
        }
        packed[(r * cols + g * group_size + i) / 8] = word;
      }
    }
  }
}

}  // namespace qspec
