// Argument checks shared by the CPU ops. Each throws one Error "OP: ARG ..." that names the op, the argument
// and what was expected.
#pragma once

#include <cstdint>
#include <string_view>

#include "backend/tensor.h"

namespace qspec::cpu {

// An F32 activation with data (strided views allowed).
void require_activation(std::string_view op, std::string_view arg, const Tensor& t);
// A weight the CPU reads as fp32: BF16, F16 or F32.
void require_weight(std::string_view op, std::string_view arg, const Tensor& t);
void require_dtype(std::string_view op, std::string_view arg, const Tensor& t, DType dtype);
void require_shape(std::string_view op, std::string_view arg, const Tensor& t, int64_t rows, int64_t cols);
// positions / ids: I32 [rows, 1].
void require_indices(std::string_view op, std::string_view arg, const Tensor& t, int64_t rows);

}  // namespace qspec::cpu
