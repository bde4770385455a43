#include "backend/cpu/checks.h"

#include "core/error.h"

namespace qspec::cpu {

namespace {

void require_data(std::string_view op, std::string_view arg, const Tensor& t) {
  if (t.empty() && t.numel() > 0) fail("{}: {} has no data", op, arg);
  if (t.rows < 0 || t.cols < 0) fail("{}: {} has a negative shape [{}, {}]", op, arg, t.rows, t.cols);
  if (t.rows > 1 && t.stride < t.cols)
    fail("{}: {} has row stride {} smaller than its {} columns", op, arg, t.stride, t.cols);
}

}  // namespace

void require_dtype(std::string_view op, std::string_view arg, const Tensor& t, DType dtype) {
  if (t.dtype != dtype) fail("{}: {} must be {}, got {}", op, arg, dtype_name(dtype), dtype_name(t.dtype));
  require_data(op, arg, t);
}

void require_activation(std::string_view op, std::string_view arg, const Tensor& t) {
  require_dtype(op, arg, t, DType::F32);
}

void require_weight(std::string_view op, std::string_view arg, const Tensor& t) {
  if (t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F32)
    fail("{}: weight {} must be BF16, F16 or F32, got {}", op, arg, dtype_name(t.dtype));
  require_data(op, arg, t);
}

void require_shape(std::string_view op, std::string_view arg, const Tensor& t, int64_t rows, int64_t cols) {
  if (t.rows != rows || t.cols != cols)
    fail("{}: {} has shape [{}, {}], expected [{}, {}]", op, arg, t.rows, t.cols, rows, cols);
}

void require_indices(std::string_view op, std::string_view arg, const Tensor& t, int64_t rows) {
  require_dtype(op, arg, t, DType::I32);
  require_shape(op, arg, t, rows, 1);
}

}  // namespace qspec::cpu
