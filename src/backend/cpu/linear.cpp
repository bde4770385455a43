// out = x W^T for dense BF16/F16/F32 weights and W4A16 (compressed-tensors pack-quantized) weights. Each
// weight row is decoded to fp32 once and dotted with every row of x (fp32 accumulation).
#include <algorithm>
#include <vector>

#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/math.h"
#include "backend/cpu/weight_values.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace qspec::cpu {

namespace {

void check_dense(const LinearWeight& w) {
  require_weight("linear", "weight", w.weight);
  require_shape("linear", "weight", w.weight, w.out_features, w.in_features);
}

void check_w4a16(const LinearWeight& w) {
  if (w.in_features % 8 != 0)
    fail("linear: W4A16 in_features {} is not a multiple of 8 (nibbles per packed word)", w.in_features);
  if (w.group_size <= 0) fail("linear: W4A16 group_size must be positive, got {}", w.group_size);
  require_dtype("linear", "packed weight", w.packed, DType::I32);
  require_shape("linear", "packed weight", w.packed, w.out_features, w.in_features / 8);
  require_weight("linear", "scales", w.scales);
  require_shape("linear", "scales", w.scales, w.out_features,
                (w.in_features + w.group_size - 1) / w.group_size);
}

// Word k/8 holds 8 nibbles along K, lowest nibble first; value = (nibble - 8) * scale[n][k / group_size].
// `scales` is scratch for the row's scales. Codes first, then one scale per group: fewer divisions, same
// values (a code times a scale is exact in fp32).
void dequantize_w4a16_row(const LinearWeight& w, int64_t n, std::vector<float>& scales, float* out) {
  weight_row(w.scales, n, scales.data());
  const auto* words = w.packed.row<uint32_t>(n);
  for (int64_t word = 0; word < w.in_features / 8; ++word)
    for (int i = 0; i < 8; ++i)
      out[word * 8 + i] = static_cast<float>(static_cast<int>((words[word] >> (4 * i)) & 0xFu) - 8);
  for (int64_t group = 0; group < w.scales.cols; ++group) {
    const int64_t end = std::min(w.in_features, (group + 1) * w.group_size);
    for (int64_t k = group * w.group_size; k < end; ++k) out[k] *= scales[group];
  }
}

}  // namespace

void CpuBackend::linear(const Tensor& out, const Tensor& x, const LinearWeight& w) {
  require_activation("linear", "x", x);
  require_activation("linear", "out", out);
  if (x.cols != w.in_features)
    fail("linear: x has {} columns but the weight has in_features {}", x.cols, w.in_features);
  require_shape("linear", "out", out, x.rows, w.out_features);
  if (w.quantized())
    check_w4a16(w);
  else
    check_dense(w);
  ThreadPool::global().parallel_for(static_cast<size_t>(w.out_features), [&](size_t begin, size_t end) {
    std::vector<float> row(static_cast<size_t>(w.in_features));
    std::vector<float> scales(static_cast<size_t>(w.quantized() ? w.scales.cols : 0));
    for (auto n = static_cast<int64_t>(begin); n < static_cast<int64_t>(end); ++n) {
      if (w.quantized())
        dequantize_w4a16_row(w, n, scales, row.data());
      else
        weight_row(w.weight, n, row.data());
      for (int64_t t = 0; t < x.rows; ++t)
        out.row<float>(t)[n] = dot(x.row<float>(t), row.data(), w.in_features);
    }
  });
}

}  // namespace qspec::cpu
