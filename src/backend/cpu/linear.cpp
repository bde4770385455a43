// out = x W^T for dense BF16/F16/F32 weights and W4A16 (compressed-tensors pack-quantized) weights. Each
// weight row is decoded to fp32 once and dotted with every row of x (fp32 accumulation).
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/math.h"
#include "backend/cpu/weight_values.h"
#include "backend/op_checks.h"
#include "core/thread_pool.h"

namespace qspec::cpu {

namespace {

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
  check_linear_args(out, x, w);
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
