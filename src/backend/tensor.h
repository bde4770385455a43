// A non-owning 2-D view of backend memory: rows x cols elements with `stride` elements between row starts.
// Multi-head layouts are flattened into columns; ops take the head counts as arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace qspec {

struct Tensor {
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
  void* data = nullptr;

  static Tensor make(DType dtype, int64_t rows, int64_t cols, void* data) {
    return Tensor{dtype, rows, cols, cols, data};
  }

  bool empty() const { return data == nullptr; }
  bool contiguous() const { return stride == cols || rows <= 1; }
  int64_t numel() const { return rows * cols; }
  // Bytes of the elements (not counting the padding up to the stride).
  int64_t element_bytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype)); }
  // Bytes of one row's elements (not counting the padding up to the stride).
  size_t row_bytes() const { return static_cast<size_t>(cols) * dtype_size(dtype); }

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  template <typename T>
  T* row(int64_t r) const {
    return static_cast<T*>(data) + r * stride;
  }

  // Whether the two views share any byte (spanning first row start to last row end; empty views share none).
  bool overlaps(const Tensor& other) const {
    if (numel() == 0 || other.numel() == 0) return false;
    return first_byte() < other.end_byte() && other.first_byte() < end_byte();
  }
  uintptr_t first_byte() const { return reinterpret_cast<uintptr_t>(data); }
  uintptr_t end_byte() const {
    return first_byte() + static_cast<uintptr_t>((rows - 1) * stride + cols) * dtype_size(dtype);
  }

  Tensor rows_view(int64_t first, int64_t count) const {
    Tensor t = *this;
    t.rows = count;
    t.data = static_cast<char*>(data) + first * stride * static_cast<int64_t>(dtype_size(dtype));
    return t;
  }
  Tensor cols_view(int64_t first, int64_t count) const {
    Tensor t = *this;
    t.cols = count;
    t.data = static_cast<char*>(data) + first * static_cast<int64_t>(dtype_size(dtype));
    return t;
  }
};

// The tensor whose columns are `parts` side by side, when they are adjacent column views of one tensor (same
// dtype, rows and, beyond one row, stride; each starting where the one before ends); an empty tensor
// otherwise.
inline Tensor concatenated_columns(std::span<const Tensor> parts) {
  if (parts.empty()) return {};
  Tensor whole = parts.front();
  for (const Tensor& part : parts.subspan(1)) {
    const bool adjacent = part.dtype == whole.dtype && part.rows == whole.rows &&
                          (part.rows <= 1 || part.stride == whole.stride) &&
                          part.first_byte() == whole.first_byte() + whole.row_bytes();
    if (!adjacent) return {};
    whole.cols += part.cols;
  }
  if (whole.rows <= 1) whole.stride = whole.cols;
  return whole.cols <= whole.stride ? whole : Tensor{};
}

// y = x W^T for W [out_features, in_features]: dense (BF16/F16/F32) or W4A16 (compressed-tensors
// pack-quantized: int32 words of 8 nibbles along K, lowest nibble first, value = nibble - 8, times
// scale[n][k / group_size]).
struct LinearWeight {
  int64_t out_features = 0;
  int64_t in_features = 0;
  Tensor weight;  // dense [N, K]; empty when quantized
  Tensor packed;  // I32 [N, K/8]
  Tensor scales;  // BF16/F16 [N, K/group_size]
  int group_size = 0;
  // Optional, W4A16 only: the weight dequantized to BF16 [N, K] (Backend::dequantized_copy), read by products
  // of many rows of x instead of dequantizing again; the same values as the dequantization makes.
  Tensor dequantized;

  bool quantized() const { return !packed.empty(); }
};

}  // namespace qspec
