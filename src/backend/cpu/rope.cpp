// Rotary position embedding, NeoX (rotate-half) pairing over the first rotary_dim dims of each head, computed
// in fp32 the way HF's default rope does: inv_freq[i] = 1 / theta^(2i / rotary_dim), angle = float(pos) *
// inv_freq.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"

namespace qspec::cpu {

void CpuBackend::rope(const Tensor& x, const Tensor& positions, int head_dim, int rotary_dim, double theta) {
  check_rope_args(x, positions, head_dim, rotary_dim);
  check_rope_theta(theta);
  const int half = rotary_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta),
                                  static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
  std::vector<float> cos_table(static_cast<size_t>(half)), sin_table(static_cast<size_t>(half));
  for (int64_t t = 0; t < x.rows; ++t) {
    auto position = static_cast<float>(positions.row<int32_t>(t)[0]);
    for (int i = 0; i < half; ++i) {
      float angle = position * inv_freq[i];
      cos_table[i] = std::cos(angle);
      sin_table[i] = std::sin(angle);
    }
    for (int64_t head = 0; head < x.cols / head_dim; ++head) {
      float* v = x.row<float>(t) + head * head_dim;
      for (int i = 0; i < half; ++i) {
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * cos_table[i] - x2 * sin_table[i];
        v[i + half] = x2 * cos_table[i] + x1 * sin_table[i];
      }
    }
  }
}

}  // namespace qspec::cpu
