// Weights of any floating checkpoint dtype (BF16, F16, F32) read as fp32, converted on the fly.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/tensor.h"

namespace qspec::cpu {

// Row `row` of w (w.cols values) into out.
void weight_row(const Tensor& w, int64_t row, float* out);
// All elements of a [1, n] weight (a norm weight, a per-head parameter).
std::vector<float> weight_vector(const Tensor& w);

}  // namespace qspec::cpu
