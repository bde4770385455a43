// Helpers of the CPU op tests: host tensors of any dtype with optional row padding, random fills, and the
// error measures the tests state their tolerances in. References are computed in double from the stored
// values.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/half.h"

namespace qspec::cpu_test {

// rows x cols elements with `stride` >= cols elements between rows; F32 padding holds NaN so that an op
// reading outside the view poisons its result.
class TestTensor {
 public:
  TestTensor(DType dtype, int64_t rows, int64_t cols, int64_t stride = 0)
      : storage_(static_cast<size_t>(
            (rows * (stride ? stride : cols) * static_cast<int64_t>(dtype_size(dtype)) + 7) / 8)) {
    tensor_ = Tensor{dtype, rows, cols, stride ? stride : cols, storage_.data()};
    if (dtype == DType::F32) {
      auto* all = reinterpret_cast<float*>(storage_.data());
      std::fill_n(all, rows * tensor_.stride, std::numeric_limits<float>::quiet_NaN());
    }
  }

  const Tensor& view() const { return tensor_; }
  int64_t rows() const { return tensor_.rows; }
  int64_t cols() const { return tensor_.cols; }

  // Stores v rounded to the dtype.
  void set(int64_t r, int64_t c, double v) {
    switch (tensor_.dtype) {
      case DType::F32:
        tensor_.row<float>(r)[c] = static_cast<float>(v);
        break;
      case DType::BF16:
        tensor_.row<uint16_t>(r)[c] = f32_to_bf16(static_cast<float>(v));
        break;
      case DType::F16:
        tensor_.row<uint16_t>(r)[c] = f32_to_f16(static_cast<float>(v));
        break;
      case DType::I32:
        tensor_.row<int32_t>(r)[c] = static_cast<int32_t>(v);
        break;
      default:
        FAIL() << "TestTensor::set: unsupported dtype";
    }
  }

  // The stored value.
  double get(int64_t r, int64_t c) const {
    switch (tensor_.dtype) {
      case DType::F32:
        return tensor_.row<float>(r)[c];
      case DType::BF16:
        return bf16_to_f32(tensor_.row<uint16_t>(r)[c]);
      case DType::F16:
        return f16_to_f32(tensor_.row<uint16_t>(r)[c]);
      case DType::I32:
        return tensor_.row<int32_t>(r)[c];
      default:
        ADD_FAILURE() << "TestTensor::get: unsupported dtype";
        return 0;
    }
  }

  void fill_random(std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> uniform(lo, hi);
    for (int64_t r = 0; r < rows(); ++r)
      for (int64_t c = 0; c < cols(); ++c) set(r, c, uniform(rng));
  }

  // True when every F32 padding element (between cols and stride) still holds NaN.
  bool padding_intact() const {
    for (int64_t r = 0; r < rows(); ++r)
      for (int64_t c = cols(); c < tensor_.stride; ++c)
        if (!std::isnan(tensor_.row<float>(r)[c])) return false;
    return true;
  }

 private:
  std::vector<uint64_t> storage_;
  Tensor tensor_;
};

inline TestTensor random_tensor(std::mt19937& rng, DType dtype, int64_t rows, int64_t cols, double lo = -1.0,
                                double hi = 1.0, int64_t stride = 0) {
  TestTensor t(dtype, rows, cols, stride);
  t.fill_random(rng, lo, hi);
  return t;
}

inline TestTensor index_tensor(const std::vector<int32_t>& values) {
  TestTensor t(DType::I32, static_cast<int64_t>(values.size()), 1);
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), 0, values[i]);
  return t;
}

// The activations of the references, in double.
inline double silu(double x) {
  return x / (1 + std::exp(-x));
}
inline double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

// A row-major double matrix: the reference result.
struct Reference {
  int64_t rows, cols;
  std::vector<double> values;
  Reference(int64_t r, int64_t c) : rows(r), cols(c), values(static_cast<size_t>(r * c)) {}
  double& at(int64_t r, int64_t c) { return values[static_cast<size_t>(r * cols + c)]; }
  double at(int64_t r, int64_t c) const { return values[static_cast<size_t>(r * cols + c)]; }
};

inline Reference reference_of(const TestTensor& t) {
  Reference ref(t.rows(), t.cols());
  for (int64_t r = 0; r < t.rows(); ++r)
    for (int64_t c = 0; c < t.cols(); ++c) ref.at(r, c) = t.get(r, c);
  return ref;
}

// max |got - want| / max |want|: the error measure of most op tests (NaN counts as infinitely wrong).
inline double relative_max_error(const TestTensor& got, const Reference& want) {
  EXPECT_EQ(got.rows(), want.rows);
  EXPECT_EQ(got.cols(), want.cols);
  double max_error = 0, max_value = 0;
  for (int64_t r = 0; r < want.rows; ++r)
    for (int64_t c = 0; c < want.cols; ++c) {
      double error = std::abs(got.get(r, c) - want.at(r, c));
      if (std::isnan(error)) return std::numeric_limits<double>::infinity();
      max_error = std::max(max_error, error);
      max_value = std::max(max_value, std::abs(want.at(r, c)));
    }
  EXPECT_GT(max_value, 0.0) << "reference is all zero: the comparison would be vacuous";
  return max_error / max_value;
}

// Runs fn and expects one qspec::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected qspec::Error mentioning '" << parts.front() << "'";
  } catch (const Error& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' lacks '" << part << "'";
  }
}

}  // namespace qspec::cpu_test
