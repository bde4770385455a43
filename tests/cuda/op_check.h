// Shared by the CUDA test programs: random data, weights on both backends, and the comparison of a CUDA
// result with the CPU reference (error measure max |gpu - cpu| / max |cpu|, NaN or Inf never passes),
// recorded for the summary that scripts/gpu.sh prints.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "io/safetensors.h"

namespace qspec::cuda_test {

struct CheckResult {
  std::string op;    // the op family ("linear")
  std::string name;  // the case ("linear W4A16 g32 BF16 scales M=3 N=9216 K=2592")
  double error = 0;  // max |gpu - cpu| / max |cpu|; infinity when a value is NaN/Inf or sizes differ
  double tolerance = 0;
  bool passed() const { return error <= tolerance; }
};

// Every comparison made so far, in order.
std::vector<CheckResult>& recorded_checks();

// max |gpu - cpu| / max |cpu| (max |gpu - cpu| when cpu is all zeros); infinity on any non-finite value.
double relative_error(const std::vector<float>& gpu, const std::vector<float>& cpu);

// Records the comparison and adds a gtest failure when it does not pass.
void expect_close(const std::string& op, const std::string& name, const std::vector<float>& gpu,
                  const std::vector<float>& cpu, double tolerance);

// Whole-model comparisons of logits and states (decode, verify, short prompts): both backends compute in fp32
// from the same weights, summing in other orders (relative logit differences around 1e-6..1e-5 after a few
// layers; the CPU reference itself is held to 2e-4 against HF, tests/test_qwen35_oracle.cpp), except that a
// W4A16 model's linears take x in FP16 on the GPU (2-3e-4 of the largest output per linear, amplified over
// the random fixture models' layers: logits up to 6e-3 and GDN states after a commit up to 3.3e-3 of their
// largest value, measured on the H200). Greedy tokens may differ only where the CPU's top-1 / top-2 margin is
// below the model's greedy margin: fp32 models are held tighter than the 1e-2.
double model_tolerance(bool quantized);
float greedy_margin(bool quantized);

std::vector<float> random_floats(std::mt19937& rng, size_t count, float low, float high);
std::vector<int32_t> random_ints(std::mt19937& rng, size_t count, int32_t low, int32_t high);  // [low, high]

// Little-endian bytes of `values` in a BF16, F16 or F32 tensor.
std::vector<uint8_t> encode(DType dtype, const std::vector<float>& values);

// The same tensor on the CPU and the CUDA backend.
struct TensorPair {
  std::unique_ptr<Buffer> cpu_buffer, gpu_buffer;
  const Tensor& cpu() const { return cpu_buffer->tensor(); }
  const Tensor& gpu() const { return gpu_buffer->tensor(); }
};

struct WeightPair {
  Tensor cpu, gpu;
};

class Backends {
 public:
  Backends();
  Backend& cpu() { return *cpu_; }
  Backend& gpu() { return *gpu_; }

  // F32 activations [rows, cols] with these values on both backends.
  TensorPair activation(int64_t rows, int64_t cols, const std::vector<float>& values);
  // I32 [rows, 1] indices.
  TensorPair indices(const std::vector<int32_t>& values);
  // An output [rows, cols] F32 poisoned with NaN on both backends.
  TensorPair poisoned(int64_t rows, int64_t cols);
  // Refills an existing F32 tensor pair with NaN.
  void poison(const TensorPair& pair);
  // A checkpoint-like weight [rows, cols] of raw bytes (kept alive here), uploaded to both backends.
  WeightPair weight(DType dtype, int64_t rows, int64_t cols, std::vector<uint8_t> bytes);
  WeightPair weight(DType dtype, int64_t rows, int64_t cols, const std::vector<float>& values) {
    return weight(dtype, rows, cols, encode(dtype, values));
  }
  // W4A16 packed words (I32 [rows, words], checkpoint order) as the model loader uploads them
  // (Backend::upload_packed_int4: the CUDA backend reorders the words of each row).
  WeightPair packed_int4(int64_t rows, int64_t words, std::vector<uint8_t> bytes);

  std::vector<float> read_cpu(const Tensor& t);
  std::vector<float> read_gpu(const Tensor& t);

 private:
  std::unique_ptr<Backend> cpu_, gpu_;
  std::list<std::vector<uint8_t>> weight_bytes_;  // the CPU backend's weights are views of these
  std::list<TensorView> weight_views_;
};

}  // namespace qspec::cuda_test
