// Scalar fp32 helpers of the CPU reference, written the way PyTorch computes them.
#pragma once

#include <cmath>
#include <cstdint>

namespace qspec::cpu {

inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
// F.softplus(x, beta=1, threshold=20)
inline float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

// Dot product with fp32 accumulation in 8 interleaved partial sums (vectorisable; a fixed order, so the
// result does not depend on threads).
inline float dot(const float* a, const float* b, int64_t n) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int lane = 0; lane < 8; ++lane) partial[lane] += a[i + lane] * b[i + lane];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7])) + tail;
}

inline float sum_of_squares(const float* x, int64_t n) {
  return dot(x, x, n);
}

}  // namespace qspec::cpu
