#include "backend/cpu/weight_values.h"

#include "core/error.h"
#include "core/half.h"

namespace qspec::cpu {

namespace {

template <typename Convert>
void convert_row(const uint16_t* src, int64_t n, float* out, Convert convert) {
  for (int64_t i = 0; i < n; ++i) out[i] = convert(src[i]);
}

}  // namespace

void weight_row(const Tensor& w, int64_t row, float* out) {
  switch (w.dtype) {
    case DType::BF16:
      convert_row(w.row<uint16_t>(row), w.cols, out, bf16_to_f32);
      return;
    case DType::F16:
      convert_row(w.row<uint16_t>(row), w.cols, out, f16_to_f32);
      return;
    case DType::F32: {
      const float* src = w.row<float>(row);
      for (int64_t i = 0; i < w.cols; ++i) out[i] = src[i];
      return;
    }
    default:
      fail("weight of dtype {} cannot be read as fp32", dtype_name(w.dtype));
  }
}

std::vector<float> weight_vector(const Tensor& w) {
  std::vector<float> values(static_cast<size_t>(w.numel()));
  for (int64_t r = 0; r < w.rows; ++r) weight_row(w, r, values.data() + r * w.cols);
  return values;
}

}  // namespace qspec::cpu
