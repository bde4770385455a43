#include "op_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cuda/cuda_backend.h"
#include "core/half.h"

namespace qspec::cuda_test {

std::vector<CheckResult>& recorded_checks() {
  static std::vector<CheckResult> checks;
  return checks;
}

double relative_error(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  if (gpu.size() != cpu.size()) return std::numeric_limits<double>::infinity();
  double max_difference = 0, max_reference = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!std::isfinite(gpu[i]) || !std::isfinite(cpu[i])) return std::numeric_limits<double>::infinity();
    max_difference = std::max(max_difference, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
    max_reference = std::max(max_reference, std::fabs(static_cast<double>(cpu[i])));
  }
  return max_reference > 0 ? max_difference / max_reference : max_difference;
}

void expect_close(const std::string& op, const std::string& name, const std::vector<float>& gpu,
                  const std::vector<float>& cpu, double tolerance) {
  const CheckResult result{op, name, relative_error(gpu, cpu), tolerance};
  recorded_checks().push_back(result);
  EXPECT_TRUE(result.passed()) << name << ": max |gpu - cpu| / max |cpu| = " << result.error
                               << " > tolerance " << tolerance;
}

double model_tolerance(bool quantized) {
  return quantized ? 1e-2 : 2e-4;
}

float greedy_margin(bool quantized) {
  return quantized ? 1e-2f : 1e-3f;
}

std::vector<float> random_floats(std::mt19937& rng, size_t count, float low, float high) {
  std::uniform_real_distribution<float> distribution(low, high);
  std::vector<float> values(count);
  for (float& v : values) v = distribution(rng);
  return values;
}

std::vector<int32_t> random_ints(std::mt19937& rng, size_t count, int32_t low, int32_t high) {
  std::uniform_int_distribution<int32_t> distribution(low, high);
  std::vector<int32_t> values(count);
  for (int32_t& v : values) v = distribution(rng);
  return values;
}

std::vector<uint8_t> encode(DType dtype, const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(&bytes[i * 4], &values[i], 4);
    } else {
      const uint16_t half = dtype == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      std::memcpy(&bytes[i * 2], &half, 2);
    }
  }
  return bytes;
}

Backends::Backends() : cpu_(make_cpu_backend()), gpu_(make_cuda_backend()) {}

TensorPair Backends::activation(int64_t rows, int64_t cols, const std::vector<float>& values) {
  TensorPair pair{cpu_->alloc(DType::F32, rows, cols), gpu_->alloc(DType::F32, rows, cols)};
  cpu_->write(pair.cpu(), values.data());
  gpu_->write(pair.gpu(), values.data());
  return pair;
}

TensorPair Backends::indices(const std::vector<int32_t>& values) {
  const auto rows = static_cast<int64_t>(values.size());
  TensorPair pair{cpu_->alloc(DType::I32, rows, 1), gpu_->alloc(DType::I32, rows, 1)};
  cpu_->write(pair.cpu(), values.data());
  gpu_->write(pair.gpu(), values.data());
  return pair;
}

TensorPair Backends::poisoned(int64_t rows, int64_t cols) {
  TensorPair pair{cpu_->alloc(DType::F32, rows, cols), gpu_->alloc(DType::F32, rows, cols)};
  poison(pair);
  return pair;
}

void Backends::poison(const TensorPair& pair) {
  const std::vector<float> nan(static_cast<size_t>(pair.cpu().numel()),
                               std::numeric_limits<float>::quiet_NaN());
  cpu_->write(pair.cpu(), nan.data());
  gpu_->write(pair.gpu(), nan.data());
}

namespace {

TensorView keep_view(std::list<std::vector<uint8_t>>& bytes_store, std::list<TensorView>& views, DType dtype,
                     int64_t rows, int64_t cols, std::vector<uint8_t> bytes) {
  const std::vector<uint8_t>& stored = bytes_store.emplace_back(std::move(bytes));
  TensorView& view = views.emplace_back();
  view.name = "test_weight_" + std::to_string(views.size());
  view.dtype = dtype;
  view.shape = {rows, cols};
  view.data = stored.data();
  view.nbytes = stored.size();
  return view;
}

}  // namespace

WeightPair Backends::weight(DType dtype, int64_t rows, int64_t cols, std::vector<uint8_t> bytes) {
  const TensorView view = keep_view(weight_bytes_, weight_views_, dtype, rows, cols, std::move(bytes));
  return WeightPair{cpu_->upload_weight(view, rows, cols), gpu_->upload_weight(view, rows, cols)};
}

WeightPair Backends::packed_int4(int64_t rows, int64_t words, std::vector<uint8_t> bytes) {
  const TensorView view = keep_view(weight_bytes_, weight_views_, DType::I32, rows, words, std::move(bytes));
  return WeightPair{cpu_->upload_packed_int4(view, rows, words), gpu_->upload_packed_int4(view, rows, words)};
}

std::vector<float> Backends::read_cpu(const Tensor& t) {
  std::vector<float> values(static_cast<size_t>(t.numel()));
  cpu_->read(values.data(), t);
  return values;
}

std::vector<float> Backends::read_gpu(const Tensor& t) {
  std::vector<float> values(static_cast<size_t>(t.numel()));
  gpu_->read(values.data(), t);
  return values;
}

}  // namespace qspec::cuda_test
