// Every op of the CUDA backend against the CPU reference, on random data (never zeros) of the Qwen3.5-4B
// shapes (H 2560, FF 9216, conv_dim 8192, GDN nv 32 / nk 16 / dk = dv 128, attention 16 / 4 heads of 256,
// rotary 64) and odd ones (M = 1, 3, 16, 65; K not a multiple of 256; T = 1, 63, 65; positions with offsets;
// strided views). Every output is poisoned with NaN before each run. Error measure: max |gpu - cpu| / max
// |cpu|; each op states its tolerance and why.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <string_view>
#include <tuple>

#include <fmt/format.h>
#include "backend/cpu/gated_delta_rule.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_linear.h"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"
#include "core/half.h"
#include "linear_mma_workspace.h"
#include "model/weight_upload.h"
#include "op_check.h"

namespace qspec::cuda_test {
namespace {

// Pure data movement: bit-exact.
constexpr double kExact = 0.0;
// One fp32 expression per element with expf/log1pf (CUDA: within 2 ulp of the correctly rounded value).
constexpr double kElementwiseTolerance = 1e-6;
// Sums in fp32 over up to a few thousand terms in another order: relative differences ~1e-7 * sqrt(n).
constexpr double kReductionTolerance = 1e-5;
// Dot products over K up to 9216 in another order (warp-strided partial sums vs 8 interleaved sums; the
// tensor-core path with BF16 weights also splits x into two BF16 parts, leaving ~2^-17 of each value out).
constexpr double kLinearTolerance = 5e-5;
// The tensor-core path with W4A16 weights rounds x (scaled by a power of two per 128-k chunk) to FP16: up to
// 2^-11 of each value, errors of random sign (bench/x_precision.py: 2-3e-4 of the largest output; measured
// on the H200 at most 2.5e-4).
constexpr double kFp16LinearTolerance = 5e-4;
// The same BF16 products summed in FP32 in another order (the W4A16 prefill kernel against cuBLAS on the BF16
// copy), over up to 9216 terms: ~1e-6 of the largest output.
constexpr double kSumOrderTolerance = 1e-5;
// More than kLinearMmaMaxRows rows of x with BF16 or W4A16 weights: one cuBLAS BF16 product, x and the
// dequantized weights rounded to BF16 (8 significant bits): ~2^-9 relative per term.
constexpr double kGemmLinearTolerance = 1e-2;
// The recurrence over up to 63 tokens, summation order differing per token, against the CPU recurrence.
constexpr double kRecurrentGdnTolerance = 5e-5;
// One algorithm against the other (HF's chunked form on the CPU beyond 16 tokens, the CUDA chunked kernels
// from 64), up to 3,000 tokens: the same math in another form and order.
constexpr double kChunkedGdnTolerance = 2e-4;
// The CUDA chunked kernels beyond kGdnChunkedSplitMaxTokens tokens, with BF16 operands (~2^-9 relative each):
// measured on the H200 2.0e-3..5.8e-3 of the largest output or state value (200 to 8,200 tokens).
constexpr double kChunkedBf16GdnTolerance = 2e-2;

Backends& backends() {
  static Backends instance;
  return instance;
}

// One backend and the accessor of its half of a tensor pair.
struct Side {
  Backend& backend;
  bool gpu;
  const Tensor& operator()(const TensorPair& pair) const { return gpu ? pair.gpu() : pair.cpu(); }
  const Tensor& operator()(const WeightPair& pair) const { return gpu ? pair.gpu : pair.cpu; }
};

void on_both(const std::function<void(const Side&)>& run) {
  run(Side{backends().cpu(), false});
  run(Side{backends().gpu(), true});
  backends().gpu().synchronize();
}

// Reads a result from both sides and compares it.
void compare(const std::string& op, const std::string& name, const TensorPair& result, double tolerance) {
  expect_close(op, name, backends().read_gpu(result.gpu()), backends().read_cpu(result.cpu()), tolerance);
}

// Reads a (possibly strided) view of a pair through a contiguous copy.
void compare_view(const std::string& op, const std::string& name, const TensorPair& base,
                  const std::function<Tensor(const Tensor&)>& view, double tolerance) {
  const Tensor cpu_view = view(base.cpu()), gpu_view = view(base.gpu());
  TensorPair copy = backends().poisoned(cpu_view.rows, cpu_view.cols);
  backends().cpu().copy(copy.cpu(), cpu_view);
  backends().gpu().copy(copy.gpu(), gpu_view);
  compare(op, name, copy, tolerance);
}

std::vector<int32_t> consecutive_positions(int count, int first) {
  std::vector<int32_t> positions(static_cast<size_t>(count));
  std::iota(positions.begin(), positions.end(), first);
  return positions;
}

std::string dtype_label(DType dtype) {
  return std::string(dtype_name(dtype));
}

// W4A16 packed words [n, k / 8] of random bytes, uploaded to both backends as the model loader does.
WeightPair random_packed_int4(std::mt19937& rng, int64_t n, int64_t k) {
  std::vector<uint8_t> packed_bytes(static_cast<size_t>(n * k / 8) * 4);
  for (uint8_t& byte : packed_bytes) byte = static_cast<uint8_t>(rng());
  return backends().packed_int4(n, k / 8, std::move(packed_bytes));
}

TEST(CudaOps, MemoryWriteReadCopyFillZero) {
  std::mt19937 rng(1);
  auto& b = backends();
  const std::vector<float> values = random_floats(rng, 16 * 2576, -1.0f, 1.0f);
  TensorPair wide = b.activation(16, 2576, values);
  expect_close("memory", "write/read round trip [16, 2576]", b.read_gpu(wide.gpu()), values, kExact);

  // copy between strided views: columns 8..2568 of the wide tensor into a contiguous one and back into a
  // view.
  TensorPair narrow = b.poisoned(16, 2560);
  on_both([&](const Side& s) { s.backend.copy(s(narrow), s(wide).cols_view(8, 2560)); });
  compare("memory", "copy strided -> contiguous [16, 2560]", narrow, kExact);
  TensorPair target = b.poisoned(16, 2576);
  on_both([&](const Side& s) { s.backend.copy(s(target).cols_view(16, 2560), s(narrow)); });
  compare_view(
      "memory", "copy contiguous -> strided [16, 2560]", target,
      [](const Tensor& t) { return t.cols_view(16, 2560); }, kExact);

  // fill_zero on a strided view leaves the other columns alone (still NaN -> compared through a view).
  TensorPair filled = b.activation(16, 2576, values);
  on_both([&](const Side& s) { s.backend.fill_zero(s(filled).cols_view(100, 1000)); });
  compare("memory", "fill_zero strided view [16, 1000] of [16, 2576]", filled, kExact);
}

TEST(CudaOps, Embed) {
  std::mt19937 rng(2);
  auto& b = backends();
  constexpr int64_t kVocab = 4096, kHidden = 2560;
  const std::vector<float> table_values = random_floats(rng, kVocab * kHidden, -1.0f, 1.0f);
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    const WeightPair table = b.weight(dtype, kVocab, kHidden, table_values);
    for (int tokens : {1, 3, 16}) {
      std::vector<int32_t> ids = random_ints(rng, static_cast<size_t>(tokens), 0, kVocab - 1);
      ids.front() = tokens > 1 ? 0 : static_cast<int32_t>(kVocab - 1);
      ids.back() = static_cast<int32_t>(kVocab - 1);
      const TensorPair id_pair = b.indices(ids);
      TensorPair out = b.poisoned(tokens, kHidden);
      on_both([&](const Side& s) { s.backend.embed(s(out), s(table), s(id_pair)); });
      compare("embed",
              fmt::format("embed {} table [{}, {}] T={}", dtype_label(dtype), kVocab, kHidden, tokens), out,
              kExact);
    }
  }
}

TEST(CudaOps, RmsNorm) {
  std::mt19937 rng(3);
  auto& b = backends();
  struct Case {
    int64_t cols, group;
    DType weight_dtype;
    bool unit_offset;
  };
  // Groups of up to 128 columns take a warp each, 8 to a block: 32 groups, 5 (a block part empty), 7 of 64.
  for (const Case& c : {Case{2560, 2560, DType::BF16, true}, Case{4096, 256, DType::F32, true},
                        Case{1024, 256, DType::BF16, true}, Case{4096, 128, DType::F16, false},
                        Case{640, 128, DType::BF16, true}, Case{448, 64, DType::F32, false}}) {
    const WeightPair weight = b.weight(c.weight_dtype, 1, c.group, random_floats(rng, c.group, -0.5f, 0.5f));
    for (int tokens : {1, 3, 16}) {
      const TensorPair x = b.activation(tokens, c.cols, random_floats(rng, tokens * c.cols, -3.0f, 3.0f));
      TensorPair out = b.poisoned(tokens, c.cols);
      on_both([&](const Side& s) { s.backend.rmsnorm(s(out), s(x), s(weight), 1e-6f, c.unit_offset); });
      compare("rmsnorm",
              fmt::format("rmsnorm [{}, {}] group {} weight {}{}", tokens, c.cols, c.group,
                          dtype_label(c.weight_dtype), c.unit_offset ? " (1 + w)" : ""),
              out, kReductionTolerance);
    }
  }
  // Strided input and output: the first 2560 columns of [16, 2576] tensors.
  const WeightPair weight = b.weight(DType::BF16, 1, 2560, random_floats(rng, 2560, -0.5f, 0.5f));
  const TensorPair x = b.activation(16, 2576, random_floats(rng, 16 * 2576, -3.0f, 3.0f));
  TensorPair out = b.poisoned(16, 2576);
  on_both([&](const Side& s) {
    s.backend.rmsnorm(s(out).cols_view(0, 2560), s(x).cols_view(0, 2560), s(weight), 1e-6f, true);
  });
  compare_view(
      "rmsnorm", "rmsnorm strided views [16, 2560] of [16, 2576]", out,
      [](const Tensor& t) { return t.cols_view(0, 2560); }, kReductionTolerance);
}

// x += delta; out = rmsnorm(x): both outputs against the CPU (residual exact: one fp32 add per element).
TEST(CudaOps, AddRmsNorm) {
  std::mt19937 rng(31);
  auto& b = backends();
  const WeightPair weight = b.weight(DType::BF16, 1, 2560, random_floats(rng, 2560, -0.5f, 0.5f));
  for (int tokens : {1, 3, 16, 65}) {
    const TensorPair x = b.activation(tokens, 2560, random_floats(rng, tokens * 2560, -3.0f, 3.0f));
    const TensorPair delta = b.activation(tokens, 2560, random_floats(rng, tokens * 2560, -1.0f, 1.0f));
    TensorPair out = b.poisoned(tokens, 2560);
    on_both([&](const Side& s) { s.backend.add_rmsnorm(s(out), s(x), s(delta), s(weight), 1e-6f, true); });
    compare("add_rmsnorm", fmt::format("add_rmsnorm [{}, 2560] residual", tokens), x, kExact);
    compare("add_rmsnorm", fmt::format("add_rmsnorm [{}, 2560] norm (1 + w)", tokens), out,
            kReductionTolerance);
  }
}

TEST(CudaOps, GatedRmsNorm) {
  std::mt19937 rng(4);
  auto& b = backends();
  for (DType dtype : {DType::F32, DType::BF16}) {
    const WeightPair weight = b.weight(dtype, 1, 128, random_floats(rng, 128, 0.5f, 1.5f));
    for (int tokens : {1, 3, 16}) {
      const int64_t cols = 32 * 128;
      const TensorPair x = b.activation(tokens, cols, random_floats(rng, tokens * cols, -2.0f, 2.0f));
      const TensorPair z = b.activation(tokens, cols, random_floats(rng, tokens * cols, -4.0f, 4.0f));
      TensorPair out = b.poisoned(tokens, cols);
      on_both([&](const Side& s) { s.backend.gated_rmsnorm(s(out), s(x), s(weight), s(z), 1e-6f); });
      compare("gated_rmsnorm",
              fmt::format("gated_rmsnorm [{}, {}] group 128 weight {}", tokens, cols, dtype_label(dtype)),
              out, kReductionTolerance);
    }
  }
}

// The tolerance of the path the CUDA backend takes for x and w.
double linear_tolerance(const Tensor& x, const LinearWeight& w) {
  if (x.rows > cuda::kLinearMmaMaxRows && cuda::GemmLinear::supports(w)) return kGemmLinearTolerance;
  return w.quantized() && cuda::linear_mma_supports(x, w) ? kFp16LinearTolerance : kLinearTolerance;
}

void check_linear(const std::string& label, const LinearWeight& cpu_weight, const LinearWeight& gpu_weight,
                  const std::vector<int>& row_counts, std::mt19937& rng) {
  auto& b = backends();
  const int64_t n = cpu_weight.out_features, k = cpu_weight.in_features;
  for (int rows : row_counts) {
    const TensorPair x = b.activation(rows, k, random_floats(rng, rows * k, -1.0f, 1.0f));
    TensorPair out = b.poisoned(rows, n);
    on_both([&](const Side& s) { s.backend.linear(s(out), s(x), s.gpu ? gpu_weight : cpu_weight); });
    compare("linear", fmt::format("{} M={} N={} K={}", label, rows, n, k), out,
            linear_tolerance(x.gpu(), gpu_weight));
  }
}

TEST(CudaOps, LinearDense) {
  std::mt19937 rng(5);
  auto& b = backends();
  struct Case {
    DType dtype;
    int64_t n, k;
    std::vector<int> rows;
  };
  const std::vector<Case> cases = {
      {DType::BF16, 9216, 2560, {1, 3, 16}},        // mlp gate/up
      {DType::BF16, 2560, 9216, {1, 16, 65}},       // mlp down
      {DType::F16, 32, 2560, {1, 3}},               // in_proj_b / in_proj_a
      {DType::F32, 1024, 2560, {1, 16}},            // k_proj in F32
      {DType::BF16, 1000, 2568, {3}},               // K a multiple of 8, not of 256
      {DType::BF16, 333, 2561, {1, 3}},             // odd K: the element-wise path
      {DType::BF16, 4000, 2560, {1, 9, 64, 2048}},  // tensor cores: the head's shape, fewer rows; cuBLAS
      {DType::F16, 512, 2560, {200}},               // many rows, F16: the general kernel
  };
  for (const Case& c : cases) {
    const WeightPair weight = b.weight(c.dtype, c.n, c.k, random_floats(rng, c.n * c.k, -0.05f, 0.05f));
    LinearWeight cpu_weight{c.n, c.k, weight.cpu, {}, {}, 0, {}};
    LinearWeight gpu_weight{c.n, c.k, weight.gpu, {}, {}, 0, {}};
    check_linear(fmt::format("linear dense {}", dtype_label(c.dtype)), cpu_weight, gpu_weight, c.rows, rng);
  }
  // x as a strided view (16-byte aligned rows) and as a misaligned one (element-wise x loads).
  const WeightPair weight = b.weight(DType::BF16, 512, 2560, random_floats(rng, 512 * 2560, -0.05f, 0.05f));
  const LinearWeight cpu_weight{512, 2560, weight.cpu, {}, {}, 0, {}};
  const LinearWeight gpu_weight{512, 2560, weight.gpu, {}, {}, 0, {}};
  const TensorPair wide = b.activation(5, 2576, random_floats(rng, 5 * 2576, -1.0f, 1.0f));
  for (int64_t offset : {4, 1}) {
    TensorPair out = b.poisoned(5, 512);
    on_both([&](const Side& s) {
      s.backend.linear(s(out), s(wide).cols_view(offset, 2560), s.gpu ? gpu_weight : cpu_weight);
    });
    compare("linear", fmt::format("linear dense BF16 x = columns {}.. of [5, 2576], N=512 K=2560", offset),
            out, kLinearTolerance);
  }
}

// Packed words reach the CUDA backend through upload_packed_int4 (which reorders them); anything but I32 is
// refused with the tensor's name, before a byte is uploaded.
TEST(CudaOps, UploadPackedInt4RefusesOtherDtypes) {
  std::vector<uint8_t> bytes(4 * 16 * 4, 0x5a);
  TensorView view;
  view.name = "layers.0.mlp.down_proj.weight_packed";
  view.dtype = DType::F32;
  view.shape = {4, 16};
  view.data = bytes.data();
  view.nbytes = bytes.size();
  try {
    backends().gpu().upload_packed_int4(view, 4, 16);
    FAIL() << "an F32 tensor was uploaded as packed words";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("upload_packed_int4: tensor layers.0.mlp.down_proj.weight_packed is F32, "
                                   "expected I32"),
        std::string::npos)
        << e.what();
  }
}

// The stacked-modules path (write_packed_int4 into rows of a tensor from alloc) refuses anything but I32, and
// leaves the destination as it was.
TEST(CudaOps, WritePackedInt4RefusesOtherDtypes) {
  auto& b = backends();
  const TensorPair dst = b.poisoned(4, 16);
  const std::vector<uint32_t> words(4 * 16, 0x12345678u);
  try {
    b.gpu().write_packed_int4(dst.gpu(), words.data());
    FAIL() << "packed words were written into an F32 tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("write_packed_int4: dst is F32, expected I32"), std::string::npos)
        << e.what();
  }
  for (float v : b.read_gpu(dst.gpu())) EXPECT_TRUE(std::isnan(v));
}

TEST(CudaOps, LinearW4A16) {
  std::mt19937 rng(6);
  auto& b = backends();
  struct Case {
    int64_t n, k;
    int group;
    DType scale_dtype;
    std::vector<int> rows;
  };
  const std::vector<Case> cases = {
      {9216, 2560, 32, DType::BF16, {1, 3, 16}},  // mlp gate/up, g32
      {2560, 9216, 128, DType::BF16, {1, 16}},    // mlp down, g128
      {2560, 2592, 32, DType::F16, {1, 3, 65}},   // K a multiple of 32, not of 256
      {1000, 2592, 12, DType::BF16, {1, 3}},      // a group that splits packed words
      {700, 2600, 8, DType::BF16, {1, 16}},       // K not a multiple of 32: one packed word per load
      // tensor cores: row halves, passes, split K; cuBLAS
      {2560, 9216, 32, DType::BF16, {8, 9, 32, 64, 300}},
      // From 4096 rows the GEMM dequantizes in slices that stay within L2: 21M values in two slices.
      {8192, 2560, 32, DType::BF16, {4100}},
      {1000, 4096, 128, DType::F16, {2, 17, 129}},  // features not a multiple of the 16-feature tile
      // K not a multiple of the 128-k chunk, N not of the 16-feature tile, split K
      {1000, 2624, 32, DType::F16, {1, 3, 8, 9, 16, 17, 64}},
      {1000, 4352, 128, DType::BF16, {1, 3, 8, 9, 16, 17, 64}},
      {9728, 2560, 128, DType::BF16, {1, 8, 9, 16}},  // the drafter's g128 shape
      {640, 2688, 64, DType::BF16, {1, 9, 16}},       // g64: two groups per 128-k chunk
      {1000, 2688, 128, DType::BF16, {3, 16}},        // odd scale rows: no 4-byte scale copies
  };
  for (const Case& c : cases) {
    const int64_t groups = (c.k + c.group - 1) / c.group;
    std::uniform_int_distribution<uint32_t> words(0, std::numeric_limits<uint32_t>::max());
    std::vector<uint8_t> packed_bytes(static_cast<size_t>(c.n * c.k / 8) * 4);
    for (size_t i = 0; i < packed_bytes.size(); i += 4) {
      const uint32_t word = words(rng);
      std::memcpy(&packed_bytes[i], &word, 4);
    }
    const WeightPair packed = b.packed_int4(c.n, c.k / 8, std::move(packed_bytes));
    const WeightPair scales =
        b.weight(c.scale_dtype, c.n, groups, random_floats(rng, c.n * groups, 0.002f, 0.02f));
    const LinearWeight cpu_weight{c.n, c.k, {}, packed.cpu, scales.cpu, c.group, {}};
    const LinearWeight gpu_weight{c.n, c.k, {}, packed.gpu, scales.gpu, c.group, {}};
    check_linear(fmt::format("linear W4A16 g{} {} scales", c.group, dtype_label(c.scale_dtype)), cpu_weight,
                 gpu_weight, c.rows, rng);
  }
}

// FP16 x keeps 11 significant bits whatever the range of x: rows scaled from 2^-60 to 2^60 (FP16 alone
// would give zeros and infinities), on the one-row and the many-row kernels (g32 and g128, K not a multiple
// of the chunk), each row against the CPU on its own scale. A chunk of zeros (the scale's clamp) changes
// nothing; an infinite or NaN x gives non-finite outputs exactly where the CPU's are.
TEST(CudaOps, LinearW4A16XOfAnyRange) {
  std::mt19937 rng(64);
  auto& b = backends();
  struct Case {
    int rows, lowest, highest;  // row r of x scaled by 2^(lowest + (highest - lowest) r / (rows - 1))
  };
  const int64_t n = 1000;
  // K not a multiple of the chunk (the register-held kernel) and one that is (the ring kernel at 16 rows).
  for (const int64_t k : {int64_t{2624}, int64_t{2560}})
    for (const int group : {32, 128}) {
      const WeightPair packed = random_packed_int4(rng, n, k);
      const int64_t groups = (k + group - 1) / group;
      const WeightPair scales =
          b.weight(DType::BF16, n, groups, random_floats(rng, n * groups, 0.002f, 0.02f));
      const LinearWeight cpu_weight{n, k, {}, packed.cpu, scales.cpu, group, {}};
      const LinearWeight gpu_weight{n, k, {}, packed.gpu, scales.gpu, group, {}};
      for (const Case& c : {Case{1, 60, 60}, Case{1, -60, -60}, Case{3, -60, 60}, Case{16, -60, 60}}) {
        auto row_exponent = [&](int r) {
          return c.rows == 1 ? c.lowest : c.lowest + (c.highest - c.lowest) * r / (c.rows - 1);
        };
        std::vector<float> values = random_floats(rng, c.rows * k, -1.0f, 1.0f);
        for (int r = 0; r < c.rows; ++r)
          for (int64_t i = 0; i < k; ++i) values[r * k + i] = std::ldexp(values[r * k + i], row_exponent(r));
        const TensorPair x = b.activation(c.rows, k, values);
        TensorPair out = b.poisoned(c.rows, n);
        on_both([&](const Side& s) { s.backend.linear(s(out), s(x), s.gpu ? gpu_weight : cpu_weight); });
        const std::vector<float> gpu = b.read_gpu(out.gpu()), cpu = b.read_cpu(out.cpu());
        for (int r = 0; r < c.rows; ++r)
          expect_close("linear",
                       fmt::format("linear W4A16 g{} M={} N={} K={} row {} of x scaled by 2^{}", group,
                                   c.rows, n, k, r, row_exponent(r)),
                       std::vector<float>(gpu.begin() + r * n, gpu.begin() + (r + 1) * n),
                       std::vector<float>(cpu.begin() + r * n, cpu.begin() + (r + 1) * n),
                       kFp16LinearTolerance);
      }
      for (int rows : {1, 16}) {
        // Row 0: its second chunk zeros; row 1: one infinite value; row 2: one NaN.
        std::vector<float> values = random_floats(rng, rows * k, -1.0f, 1.0f);
        std::fill(values.begin() + 128, values.begin() + 256, 0.0f);
        if (rows > 1) {
          values[k + 300] = std::numeric_limits<float>::infinity();
          values[2 * k + 700] = std::numeric_limits<float>::quiet_NaN();
        }
        const TensorPair x = b.activation(rows, k, values);
        TensorPair out = b.poisoned(rows, n);
        on_both([&](const Side& s) { s.backend.linear(s(out), s(x), s.gpu ? gpu_weight : cpu_weight); });
        const std::vector<float> gpu = b.read_gpu(out.gpu()), cpu = b.read_cpu(out.cpu());
        expect_close("linear",
                     fmt::format("linear W4A16 g{} M={} K={} row 0 with a chunk of zeros", group, rows, k),
                     std::vector<float>(gpu.begin(), gpu.begin() + n),
                     std::vector<float>(cpu.begin(), cpu.begin() + n), kFp16LinearTolerance);
        int mismatched = 0, non_finite = 0;
        for (size_t i = static_cast<size_t>(n); i < gpu.size(); ++i) {
          if (!std::isfinite(cpu[i])) ++non_finite;
          if (std::isfinite(gpu[i]) != std::isfinite(cpu[i])) ++mismatched;
        }
        if (rows > 1) {
          recorded_checks().push_back(
              CheckResult{"linear",
                          fmt::format("linear W4A16 g{} M=16 K={} rows with inf / NaN x: outputs finite "
                                      "where the CPU's are (of {} "
                                      "non-finite)",
                                      group, k, non_finite),
                          static_cast<double>(mismatched), 0.0});
          EXPECT_EQ(mismatched, 0) << "outputs finite on one side only";
          EXPECT_GE(non_finite, 2 * n)
              << "the inf and NaN rows should make every output of theirs non-finite";
        }
      }
    }
}

// The GEMM's x operand (rows_to_bf16 of linear_gemm.cu), bit-exact against round-to-nearest-even on the host:
// float4 rows (16-byte aligned, columns a multiple of 4) and element-wise ones (odd column counts, a view
// starting one column in), 1 to 70,000 rows (beyond grid.y's 65,535).
TEST(CudaOps, RowsToBf16) {
  std::mt19937 rng(122);
  auto& b = backends();
  struct Case {
    int64_t rows, cols, row_cols, first_col;
  };
  for (const Case& c :
       {Case{1, 2560, 2560, 0}, Case{3, 2561, 2561, 0}, Case{63, 9216, 9216, 0}, Case{65, 1003, 1003, 0},
        Case{3000, 12, 16, 4}, Case{129, 2560, 2576, 1}, Case{129, 2560, 2576, 16}, Case{70000, 4, 4, 0}}) {
    const std::vector<float> values = random_floats(rng, c.rows * c.row_cols, -3.0f, 3.0f);
    const TensorPair x = b.activation(c.rows, c.row_cols, values);
    const std::unique_ptr<Buffer> out = b.gpu().alloc(DType::BF16, c.rows, c.cols);
    const size_t count = static_cast<size_t>(c.rows * c.cols);
    const std::vector<uint16_t> poison(count, 0xFFFF);  // BF16 NaN
    b.gpu().write(out->tensor(), poison.data());
    b.gpu().synchronize();
    ASSERT_EQ(cuda::launch_rows_to_bf16(out->tensor().data, x.gpu().cols_view(c.first_col, c.cols), nullptr,
                                        cuda::RowGate::None, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    std::vector<uint16_t> bits(count);
    b.gpu().read(bits.data(), out->tensor());
    std::vector<float> gpu(count), expected(count);
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t col = 0; col < c.cols; ++col) {
        const auto i = static_cast<size_t>(r * c.cols + col);
        gpu[i] = bf16_to_f32(bits[i]);
        expected[i] =
            bf16_to_f32(f32_to_bf16(values[static_cast<size_t>(r * c.row_cols + c.first_col + col)]));
      }
    }
    expect_close("rows_to_bf16",
                 fmt::format("rows_to_bf16 [{}, {}] from columns {}.. of rows of {}", c.rows, c.cols,
                             c.first_col, c.row_cols),
                 gpu, expected, kExact);
  }
}

// The many-row W4A16 linear (cuBLAS on dequantized BF16) at > kLinearMmaMaxRows rows, K not a multiple of
// 256, groups that split packed words (g12) or are smaller than a word's span (g8): through the backend (the
// whole weight in one slice) and through a GemmLinear bounded to 1 Mi values (slices of 256 rows, the last
// one shorter).
TEST(CudaOps, GemmLinearW4A16Slices) {
  std::mt19937 rng(123);
  auto& b = backends();
  struct Case {
    int64_t n, k;
    int group;
    DType scale_dtype;
  };
  cuda::GemmLinear sliced(int64_t{1} << 20);
  for (const Case& c : {Case{1000, 2592, 12, DType::BF16}, Case{700, 2600, 8, DType::BF16},
                        Case{2560, 2560, 32, DType::F16}, Case{1030, 4096, 128, DType::BF16}}) {
    const int64_t groups = (c.k + c.group - 1) / c.group;
    const WeightPair packed = random_packed_int4(rng, c.n, c.k);
    const WeightPair scales =
        b.weight(c.scale_dtype, c.n, groups, random_floats(rng, c.n * groups, 0.002f, 0.02f));
    const LinearWeight cpu_weight{c.n, c.k, {}, packed.cpu, scales.cpu, c.group, {}};
    const LinearWeight gpu_weight{c.n, c.k, {}, packed.gpu, scales.gpu, c.group, {}};
    for (int rows : {129, 300}) {
      const TensorPair x = b.activation(rows, c.k, random_floats(rng, rows * c.k, -1.0f, 1.0f));
      const std::string label = fmt::format("linear W4A16 g{} {} scales M={} N={} K={}", c.group,
                                            dtype_label(c.scale_dtype), rows, c.n, c.k);
      TensorPair out = b.poisoned(rows, c.n);
      on_both([&](const Side& s) { s.backend.linear(s(out), s(x), s.gpu ? gpu_weight : cpu_weight); });
      compare("linear", label + " (one slice)", out, kGemmLinearTolerance);
      b.poison(out);
      b.cpu().linear(out.cpu(), x.cpu(), cpu_weight);
      b.gpu().synchronize();
      sliced.run(out.gpu(), x.gpu(), nullptr, cuda::RowGate::None, gpu_weight, nullptr);
      ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
      compare("linear", label + " (slices of 256 rows)", out, kGemmLinearTolerance);
    }
  }
}

// The W4A16 many-row kernel (launch_w4a16_gemm, taken by GemmLinear below kW4a16MaxRows rows without a BF16
// copy; here at every row count) against cuBLAS on the BF16 copy of the same weight (GemmLinear::dequantize)
// with the same BF16 x: both multiply the same BF16 numbers exactly into FP32, so only the order of the sums
// differs (measure: max |kernel - cuBLAS| / max |cuBLAS|; over up to 9216 terms ~1e-6). A wrong nibble, pair
// or scale is an error of the weights' size. Groups 32, 64 (2 scales a chunk), 128 and 256 (one a chunk), K
// split over blocks (9216, 4096) or not, K 2688 (not a multiple of 256), N 1000 (the last block past N), 2560
// and 9216, rows 33 (most of a row block empty), 64, 65, 300 and 2048; at 65 rows also K unsplit, split in 3
// and 16 (clusters of 3 and 16 blocks) and split in 5 with the partials added by the sums kernel (GPUs before
// sm_90), each by wgmma (the H200's path: the build makes sm_90a code, so an sm_90 GPU must take it) and by
// mma.sync (the path of the GPUs before sm_90).
TEST(CudaOps, W4a16GemmEqualsCublasOnBf16Copy) {
  std::mt19937 rng(77);
  auto& b = backends();
  struct Case {
    int64_t n, k;
    int group;
  };
  cuda::GemmLinear gemm(cuda::GemmLinear::kDefaultSliceElements, int64_t{1} << 30);  // the kernel at any M
  cudaDeviceProp properties{};
  ASSERT_EQ(cudaGetDeviceProperties(&properties, 0), cudaSuccess);
  if (properties.major == 9 && properties.minor == 0) {
    EXPECT_TRUE(cuda::w4a16_gemm_uses_wgmma()) << "an sm_90 GPU runs the kernel's sm_90a code (wgmma)";
  }
  for (const Case& c : {Case{2560, 9216, 32}, Case{1000, 2688, 64}, Case{2560, 4096, 128},
                        Case{1000, 2560, 256}, Case{9216, 2560, 32}}) {
    const int64_t groups = c.k / c.group;
    const WeightPair packed = random_packed_int4(rng, c.n, c.k);
    const WeightPair scales =
        b.weight(DType::BF16, c.n, groups, random_floats(rng, c.n * groups, -0.02f, 0.02f));
    const LinearWeight quantized{c.n, c.k, {}, packed.gpu, scales.gpu, c.group, {}};
    ASSERT_TRUE(cuda::w4a16_gemm_supports(quantized)) << c.group;
    cuda::DeviceMemory copy(static_cast<size_t>(c.n * c.k) * 2);
    cuda::GemmLinear::dequantize(copy.data(), quantized, nullptr);
    const LinearWeight dense{c.n, c.k, Tensor::make(DType::BF16, c.n, c.k, copy.data()), {}, {}, 0, {}};
    for (int rows : {33, 64, 65, 300, 2048}) {
      if (rows == 2048 && c.n != 2560) continue;  // one long case is enough
      const TensorPair x = b.activation(rows, c.k, random_floats(rng, rows * c.k, -1.0f, 1.0f));
      TensorPair kernel = b.poisoned(rows, c.n), reference = b.poisoned(rows, c.n);
      b.gpu().synchronize();
      gemm.run(kernel.gpu(), x.gpu(), nullptr, cuda::RowGate::None, quantized, nullptr);
      gemm.run(reference.gpu(), x.gpu(), nullptr, cuda::RowGate::None, dense, nullptr);
      ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
      const std::string label =
          fmt::format("W4A16 kernel vs cuBLAS on the BF16 copy g{} M={} N={} K={}", c.group, rows, c.n, c.k);
      const std::vector<float> expected = b.read_gpu(reference.gpu());
      expect_close("linear", label, b.read_gpu(kernel.gpu()), expected, kSumOrderTolerance);
      if (rows != 65) continue;
      // Other splits of K: none, 3 and 16 (the largest cluster), and partials added by the sums kernel;
      // blocks of 64 rows (two here) and of 128 (one, 63 rows past the end).
      cuda::DeviceMemory x_bf16(static_cast<size_t>(rows * c.k) * 2);
      cuda::check_cuda(
          cuda::launch_rows_to_bf16(x_bf16.data(), x.gpu(), nullptr, cuda::RowGate::None, nullptr),
          "x to BF16");
      for (const int block_rows : {64, 128, 256})
        for (cuda::W4a16GemmTuning tuning :
             {cuda::W4a16GemmTuning{1, true, true}, cuda::W4a16GemmTuning{3, true, true},
              cuda::W4a16GemmTuning{16, true, true}, cuda::W4a16GemmTuning{5, false, true},
              cuda::W4a16GemmTuning{0, true, false}, cuda::W4a16GemmTuning{16, true, false},
              cuda::W4a16GemmTuning{5, false, false}}) {
          tuning.block_rows = block_rows;
          if (block_rows == 256 && !(tuning.wgmma && cuda::w4a16_gemm_uses_wgmma())) continue;  // wgmma only
          b.poison(kernel);
          b.gpu().synchronize();  // the poison goes on the backend's stream, the kernel on the default one
          // The workspace (x's images for wgmma, split partials) poisoned too: a fresh allocation may get the
          // previous tuning's memory back, with the same images in it.
          const size_t workspace_bytes = cuda::w4a16_gemm_workspace_bytes(rows, quantized, tuning);
          cuda::DeviceMemory workspace(std::max<size_t>(1, workspace_bytes));
          ASSERT_EQ(cudaMemset(workspace.data(), 0xFF, workspace.bytes()), cudaSuccess);
          cuda::check_cuda(cuda::launch_w4a16_gemm(kernel.gpu(), x_bf16.data(), quantized, workspace.data(),
                                                   nullptr, tuning),
                           "W4A16 kernel");
          ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
          expect_close("linear",
                       fmt::format("{} ({} splits, {} where the GPU allows, {}, {} rows a block)", label,
                                   cuda::w4a16_gemm_splits(rows, quantized, tuning),
                                   tuning.cluster_sums ? "cluster sums" : "sums kernel",
                                   tuning.wgmma ? "wgmma where built" : "mma.sync", tuning.block_rows),
                       b.read_gpu(kernel.gpu()), expected, kSumOrderTolerance);
        }
    }
  }
}

// Speculative decoding needs a row's result not to depend on the other rows of the call: the verify step's
// rows must equal the decode steps' exactly, although one row goes through the one-row kernel and 16 through
// the many-row one (the same split of K and the same sums in both). 16 rows at once vs each row alone: W4A16
// g32 and g128 with split K (K 9216), N 9216 at K 2560, a last tile past N (1000) with K 2560 at g32 (the
// ring kernel's rows past N) and with K 2624 (a partial last chunk) at g32, g64 (per-block scales) and g128
// (a partial last group), K 4096 and 3072 (16 and 12 splits:
// clusters of 16 and 12 parts at one split a part), and BF16 (K 9216 and 2624), with x rows 16-byte aligned
// and not (a view one column in).
TEST(CudaOps, LinearRowsIndependentOfBatch) {
  std::mt19937 rng(61);
  auto& b = backends();
  constexpr int64_t kRows = 16;
  struct Case {
    int64_t n, k;
    int group;  // 0: BF16 weights
  };
  for (const Case& c :
       {Case{2560, 9216, 32}, Case{2560, 9216, 128}, Case{9216, 2560, 32}, Case{1000, 2560, 32},
        Case{1000, 2624, 32}, Case{1000, 2624, 64}, Case{1000, 2624, 128}, Case{1000, 2560, 128},
        Case{2560, 4096, 32}, Case{2560, 3072, 32}, Case{2560, 9216, 0}, Case{1000, 2624, 0}}) {
    LinearWeight w{c.n, c.k, {}, {}, {}, c.group, {}};
    WeightPair weight, packed, scales;
    if (c.group == 0) {
      weight = b.weight(DType::BF16, c.n, c.k, random_floats(rng, c.n * c.k, -0.05f, 0.05f));
      w.weight = weight.gpu;
    } else {
      packed = random_packed_int4(rng, c.n, c.k);
      const int64_t groups = (c.k + c.group - 1) / c.group;  // the last group partial when K is not whole
      scales = b.weight(DType::BF16, c.n, groups, random_floats(rng, c.n * groups, 0.002f, 0.02f));
      w.packed = packed.gpu;
      w.scales = scales.gpu;
    }
    // Rows of magnitudes 2^-30 .. 2^30: every row has its own chunk scales.
    std::vector<float> wide_values = random_floats(rng, kRows * (c.k + 4), -1.0f, 1.0f);
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t i = 0; i < c.k + 4; ++i)
        wide_values[r * (c.k + 4) + i] =
            std::ldexp(wide_values[r * (c.k + 4) + i], static_cast<int>(4 * r - 30));
    const TensorPair wide = b.activation(kRows, c.k + 4, wide_values);
    for (int64_t offset : {4, 1}) {
      const Tensor x = wide.gpu().cols_view(offset, c.k);
      TensorPair together = b.poisoned(kRows, c.n), alone = b.poisoned(kRows, c.n);
      b.gpu().linear(together.gpu(), x, w);
      for (int64_t r = 0; r < kRows; ++r) b.gpu().linear(alone.gpu().rows_view(r, 1), x.rows_view(r, 1), w);
      const std::vector<float> batch = b.read_gpu(together.gpu()), single = b.read_gpu(alone.gpu());
      expect_close("linear",
                   fmt::format("linear {} M=16 rows vs M=1 each, N={} K={}, x at column {}",
                               c.group == 0 ? "BF16" : fmt::format("W4A16 g{}", c.group), c.n, c.k, offset),
                   batch, single, kExact);
      // The ring kernel fed by tensor copies (sm_90, groups 32 and 128) adds what its per-lane copies do.
      {
        EXPECT_TRUE(cuda::linear_tensor_copies_supported())
            << "the H200 build feeds the ring kernel by tensor copies (else this compares a path with "
               "itself)";
        TensorPair per_lane = b.poisoned(kRows, c.n);
        const LinearMmaWorkspaceBuffers workspace(b.gpu(), kRows, c.n, c.k);
        cuda::LinearMmaTuning tuning;
        tuning.ring_tma = false;
        cuda::check_cuda(cuda::launch_linear_mma(per_lane.gpu(), x, w, workspace.get(), nullptr, tuning),
                         "linear without tensor copies");
        cuda::check_cuda(cudaDeviceSynchronize(), "linear without tensor copies");
        expect_close("linear",
                     fmt::format("linear {} M=16 with and without tensor copies, N={} K={}, x at column {}",
                                 c.group == 0 ? "BF16" : fmt::format("W4A16 g{}", c.group), c.n, c.k, offset),
                     batch, b.read_gpu(per_lane.gpu()), kExact);
      }
      // The one-row kernel's units of one split, of several (LinearMmaTuning::row_splits_per_part), and of
      // the whole of K add the same sums, in a cluster (sm_90+, up to 16 parts) or by the sums kernel.
      const int64_t splits = static_cast<int64_t>(cuda::linear_mma_partial_floats(1, c.n, c.k)) / c.n;
      if (splits < 2) continue;
      const LinearMmaWorkspaceBuffers workspace(b.gpu(), 1, c.n, c.k);
      for (const int64_t splits_per_part : {int64_t{1}, int64_t{2}, int64_t{3}, splits})
        for (const bool cluster_sums : {true, false}) {
          TensorPair parts = b.poisoned(kRows, c.n);
          b.gpu().synchronize();
          const cuda::LinearMmaTuning tuning{0, 0, true, splits_per_part, true, cluster_sums};
          for (int64_t r = 0; r < kRows; ++r)
            cuda::check_cuda(cuda::launch_linear_mma(parts.gpu().rows_view(r, 1), x.rows_view(r, 1), w,
                                                     workspace.get(), nullptr, tuning),
                             "linear with several splits per unit");
          cuda::check_cuda(cudaDeviceSynchronize(), "linear with several splits per unit");
          expect_close("linear",
                       fmt::format("linear {} M=16 rows vs M=1 each with {} of {} splits per unit (cluster "
                                   "sums {}), N={} K={}, x at column {}",
                                   c.group == 0 ? "BF16" : fmt::format("W4A16 g{}", c.group), splits_per_part,
                                   splits, cluster_sums ? "allowed" : "off", c.n, c.k, offset),
                       batch, b.read_gpu(parts.gpu()), kExact);
        }
    }
  }
}

// The same for 8 rows (one half of 8 rows in the many-row kernel), 9 and 16 (two halves) on the gate/up
// shape without split K.
TEST(CudaOps, LinearRowsIndependentOfRowHalves) {
  std::mt19937 rng(62);
  auto& b = backends();
  const int64_t n = 9216, k = 2560;
  const WeightPair packed = random_packed_int4(rng, n, k);
  const WeightPair scales = b.weight(DType::BF16, n, k / 32, random_floats(rng, n * k / 32, 0.002f, 0.02f));
  const LinearWeight quantized{n, k, {}, packed.gpu, scales.gpu, 32, {}};
  for (int64_t rows : {8, 9, 16}) {
    const TensorPair x = b.activation(rows, k, random_floats(rng, rows * k, -1.0f, 1.0f));
    TensorPair together = b.poisoned(rows, n), alone = b.poisoned(rows, n);
    b.gpu().linear(together.gpu(), x.gpu(), quantized);
    for (int64_t r = 0; r < rows; ++r)
      b.gpu().linear(alone.gpu().rows_view(r, 1), x.gpu().rows_view(r, 1), quantized);
    const std::vector<float> batch = b.read_gpu(together.gpu()), single = b.read_gpu(alone.gpu());
    expect_close("linear", fmt::format("linear W4A16 g32 M={} rows vs M=1 each, N={} K={}", rows, n, k),
                 batch, single, kExact);
  }
}

// Many rows of x (cuBLAS) with the W4A16 weight's kept BF16 copy (Backend::dequantized_copy, as the model
// loader makes it) give the products of the dequantization every call makes without one, bit for bit: the
// copy is that dequantization's output (300 rows). Below kW4a16MaxRows rows (33) a call without the copy
// takes the W4A16 kernel: the same products of the same BF16 numbers, summed in another order. g32 and g128,
// a stacked weight's row view.
TEST(CudaOps, LinearWithKeptDequantizedCopy) {
  std::mt19937 rng(64);
  auto& b = backends();
  for (const int group : {32, 128}) {
    const int64_t n = 1000, k = 2560;
    const WeightPair packed = random_packed_int4(rng, n, k);
    const WeightPair scales =
        b.weight(DType::BF16, n, k / group, random_floats(rng, n * k / group, 0.002f, 0.02f));
    LinearWeight w{n, k, {}, packed.gpu, scales.gpu, group, {}};
    const std::unique_ptr<Buffer> copy = b.gpu().dequantized_copy(w);
    ASSERT_NE(copy, nullptr) << "the H200 keeps BF16 copies (BackendOptions::bf16_copies on by default)";
    LinearWeight kept = w;
    kept.dequantized = copy->tensor();
    // Rows 200..999 of the weight: a view of the second of two modules stacked in it.
    auto second_module = [](LinearWeight v) {
      v.out_features -= 200;
      v.packed = v.packed.rows_view(200, v.out_features);
      v.scales = v.scales.rows_view(200, v.out_features);
      if (!v.dequantized.empty()) v.dequantized = v.dequantized.rows_view(200, v.out_features);
      return v;
    };
    for (const auto& [without, with] : {std::pair{w, kept}, std::pair{second_module(w), second_module(kept)}})
      for (const int64_t rows : {33, 300}) {
        const TensorPair x = b.activation(rows, k, random_floats(rng, rows * k, -1.0f, 1.0f));
        TensorPair plain = b.poisoned(rows, without.out_features),
                   from_copy = b.poisoned(rows, with.out_features);
        b.gpu().linear(plain.gpu(), x.gpu(), without);
        b.gpu().linear(from_copy.gpu(), x.gpu(), with);
        const bool kernel = rows < cuda::GemmLinear::kW4a16MaxRows;
        expect_close("linear",
                     fmt::format("linear W4A16 g{} M={} N={} K={}: kept BF16 copy vs {}", group, rows,
                                 with.out_features, k, kernel ? "the W4A16 kernel" : "dequantized per call"),
                     b.read_gpu(from_copy.gpu()), b.read_gpu(plain.gpu()),
                     kernel ? kSumOrderTolerance : kExact);
      }
  }
}

// The tensor-core W4A16 kernels address a weight's rows by 32-bit offsets (PackedInt4Weights::Rows): a weight
// whose packed words or scales reach 2^32 elements must go to the general kernels. Only the shapes are
// read, so the views point at a small aligned buffer.
TEST(CudaOps, LinearMmaDeclinesWeightsPast32BitOffsets) {
  alignas(16) static uint32_t words[4];
  const Tensor x = Tensor::make(DType::F32, 1, 4096, words);
  auto weight = [&](int64_t n) {
    LinearWeight w;
    w.out_features = n;
    w.in_features = 4096;
    w.group_size = 32;
    w.packed = Tensor::make(DType::I32, n, 4096 / 8, words);
    w.scales = Tensor::make(DType::BF16, n, 4096 / 32, words);
    return w;
  };
  EXPECT_TRUE(cuda::linear_mma_supports(x, weight(int64_t{1} << 20)));
  EXPECT_FALSE(cuda::linear_mma_supports(x, weight((int64_t{1} << 32) / 512)));
  EXPECT_FALSE(cuda::linear_mma_supports(x, weight(int64_t{1} << 24)));
}

// The shared-memory ring kernel (W4A16 of several rows) makes the register-held many-row kernel's sums bit
// for bit: the same items and arithmetic, only the loads differ. Rows in one pass (2, 3, 8, 16) and two (17,
// 32); g32 (vector scales) and g128, BF16 and F16 scales; the default splits of K and chosen ones
// (chunks_per_split: a short last split, one split, 8 chunks a split at 2 and 8 rows); features past the last
// tile; x rows 16-byte aligned and not. The register kernel also on a grid of two blocks that walk every item
// (LinearMmaTuning::grid_blocks): their partials, then the split sums, make the same outputs.
TEST(CudaOps, LinearRingKernelEqualsRegisterKernel) {
  std::mt19937 rng(63);
  auto& b = backends();
  struct Case {
    int64_t n, k;
    int group;
    DType scale_dtype;
    int64_t chunks_per_split;  // 0: mma_split's
    std::vector<int64_t> rows;
  };
  const std::vector<Case> cases = {
      {2560, 9216, 32, DType::BF16, 0, {2, 3, 16, 17, 32}},
      {9216, 2560, 32, DType::BF16, 0, {2, 3, 16, 17, 32}},
      {1000, 4096, 128, DType::F16, 0, {2, 3, 16, 17, 32}},
      {2560, 9216, 128, DType::BF16, 0, {2, 16, 32}},
      {1000, 2560, 32, DType::F16, 3, {3, 16, 17}},  // 7 splits, the last of 2 chunks
      {1000, 512, 32, DType::BF16, 4, {16}},         // one split: the sums go straight out
      {1000, 2560, 128, DType::BF16, 8, {2, 8}},     // 8 chunks a split (the last 4), rows in one half
  };
  for (const Case& c : cases) {
    const WeightPair packed = random_packed_int4(rng, c.n, c.k);
    const int64_t groups = c.k / c.group;
    const WeightPair scales =
        b.weight(c.scale_dtype, c.n, groups, random_floats(rng, c.n * groups, 0.002f, 0.02f));
    const LinearWeight w{c.n, c.k, {}, packed.gpu, scales.gpu, c.group, {}};
    for (int64_t rows : c.rows) {
      const TensorPair wide = b.activation(rows, c.k + 4, random_floats(rng, rows * (c.k + 4), -1.0f, 1.0f));
      const LinearMmaWorkspaceBuffers workspace_buffers(b.gpu(), rows, c.n, c.k, c.chunks_per_split);
      const cuda::LinearMmaWorkspace workspace = workspace_buffers.get();
      cuda::LinearMmaTuning ring_kernel, register_kernel;
      ring_kernel.chunks_per_split = register_kernel.chunks_per_split = c.chunks_per_split;
      register_kernel.ring_kernel = false;
      cuda::LinearMmaTuning walking_register_kernel = register_kernel;
      walking_register_kernel.grid_blocks = 2;
      for (int64_t offset : {4, 1}) {
        const Tensor x = wide.gpu().cols_view(offset, c.k);
        TensorPair ring = b.poisoned(rows, c.n), registers = b.poisoned(rows, c.n),
                   walking = b.poisoned(rows, c.n);
        b.gpu().synchronize();
        cuda::check_cuda(cuda::launch_linear_mma(ring.gpu(), x, w, workspace, nullptr, ring_kernel),
                         "ring kernel");
        cuda::check_cuda(cuda::launch_linear_mma(registers.gpu(), x, w, workspace, nullptr, register_kernel),
                         "register-held kernel");
        cuda::check_cuda(
            cuda::launch_linear_mma(walking.gpu(), x, w, workspace, nullptr, walking_register_kernel),
            "register-held kernel on two walking blocks");
        cuda::check_cuda(cudaDeviceSynchronize(), "linear kernels");
        const std::vector<float> ring_values = b.read_gpu(ring.gpu());
        const std::string shape =
            fmt::format("linear W4A16 g{} {} scales M={} N={} K={} chunks/split {}, x at column {}", c.group,
                        dtype_label(c.scale_dtype), rows, c.n, c.k, c.chunks_per_split, offset);
        expect_close("linear", shape + ": ring vs register-held kernel", ring_values,
                     b.read_gpu(registers.gpu()), kExact);
        expect_close("linear", shape + ": ring vs register-held kernel on two walking blocks", ring_values,
                     b.read_gpu(walking.gpu()), kExact);
      }
    }
  }
}

// An MLP weight [n, k] on both backends: BF16 (group 0) or W4A16 g`group` with scales of scale_dtype; the
// buffers stay in `keep`.
std::pair<LinearWeight, LinearWeight> random_mlp_weight(std::mt19937& rng, int64_t n, int64_t k, int group,
                                                        DType scale_dtype, std::vector<WeightPair>& keep) {
  auto& b = backends();
  LinearWeight cpu{n, k, {}, {}, {}, group, {}}, gpu = cpu;
  if (group == 0) {
    keep.push_back(b.weight(DType::BF16, n, k, random_floats(rng, n * k, -0.05f, 0.05f)));
    cpu.weight = keep.back().cpu, gpu.weight = keep.back().gpu;
    return {cpu, gpu};
  }
  keep.push_back(random_packed_int4(rng, n, k));
  cpu.packed = keep.back().cpu, gpu.packed = keep.back().gpu;
  const int64_t groups = (k + group - 1) / group;
  keep.push_back(b.weight(scale_dtype, n, groups, random_floats(rng, n * groups, 0.002f, 0.02f)));
  cpu.scales = keep.back().cpu, gpu.scales = keep.back().gpu;
  return {cpu, gpu};
}

// A linear's split partials left to the op that reads its output (LinearMmaWorkspace::unsummed_splits): the
// residual norm and silu_mul add them in split order themselves, which must give, bit for bit, what the sums
// kernel and the plain op give, and store the sums into the linear's output as the sums kernel would. Cases:
// the 4B's down projection into the residual norm (quads kernel) and its gate|up into silu_mul (float4
// kernel); hidden 1002 (the element-wise norm) and intermediate 1002 (unaligned up columns), where the ops
// run the sums kernel first. Then the same through the backend (linear, then add_rmsnorm or
// silu_gated_linear) against the GPU's ops with the linear's output read back in between.
TEST(CudaOps, SplitPartialsSummedByTheirReader) {
  std::mt19937 rng(65);
  auto& b = backends();
  constexpr int64_t kRows = 16;
  struct Case {
    int64_t n, k;  // the linear's
    bool gated;    // silu_mul of [gate | up] (n = 2 I) instead of the residual norm
  };
  for (const Case& c :
       {Case{2560, 9216, false}, Case{18432, 2560, true}, Case{1002, 2560, false}, Case{2004, 2560, true}}) {
    const WeightPair packed = random_packed_int4(rng, c.n, c.k);
    const WeightPair scales =
        b.weight(DType::BF16, c.n, c.k / 32, random_floats(rng, c.n * c.k / 32, 0.002f, 0.02f));
    const LinearWeight w{c.n, c.k, {}, packed.gpu, scales.gpu, 32, {}};
    const TensorPair x = b.activation(kRows, c.k, random_floats(rng, kRows * c.k, -1.0f, 1.0f));
    const std::string label = fmt::format("linear W4A16 g32 M={} N={} K={} into {}", kRows, c.n, c.k,
                                          c.gated ? "silu_mul" : "the residual norm");
    // The ops' other operands, two copies of each for the ops that they update.
    const int64_t width = c.gated ? c.n / 2 : c.n;
    const WeightPair norm_weight = b.weight(DType::BF16, 1, width, random_floats(rng, width, -0.5f, 0.5f));
    const std::vector<float> residual = random_floats(rng, kRows * width, -3.0f, 3.0f);
    TensorPair linear_out = b.poisoned(kRows, c.n), summed = b.poisoned(kRows, c.n);
    TensorPair fused_x = b.activation(kRows, width, residual), plain_x = b.activation(kRows, width, residual);
    TensorPair fused = b.poisoned(kRows, width), plain = b.poisoned(kRows, width);
    const LinearMmaWorkspaceBuffers workspace_buffers(b.gpu(), kRows, c.n, c.k);
    cuda::LinearMmaWorkspace workspace = workspace_buffers.get();
    int splits = 0;
    workspace.unsummed_splits = &splits;
    b.gpu().synchronize();
    cuda::check_cuda(cuda::launch_linear_mma(linear_out.gpu(), x.gpu(), w, workspace, nullptr), "linear");
    ASSERT_GT(splits, 1) << label << ": the linear left no partials, so nothing here reads them";
    const cuda::UnsummedSplits unsummed =
        cuda::UnsummedSplits::packed(workspace.partials, splits, kRows, c.n);
    cuda::check_cuda(cuda::launch_split_partial_sums(summed.gpu(), unsummed, nullptr), "sums kernel");
    if (c.gated) {
      const int64_t i = c.n / 2;
      const Tensor out = linear_out.gpu(), sums = summed.gpu();
      cuda::check_cuda(
          cuda::launch_elementwise(cuda::Elementwise::SiluMul, fused.gpu(), out.cols_view(0, i),
                                   out.cols_view(i, i), nullptr, unsummed, unsummed.cols_from(i)),
          "silu_mul of the partials");
      cuda::check_cuda(cuda::launch_elementwise(cuda::Elementwise::SiluMul, plain.gpu(), sums.cols_view(0, i),
                                                sums.cols_view(i, i), nullptr),
                       "silu_mul of the sums");
    } else {
      cuda::check_cuda(cuda::launch_add_rmsnorm(fused.gpu(), fused_x.gpu(), linear_out.gpu(), unsummed,
                                                norm_weight.gpu, 1e-6f, true, nullptr),
                       "add_rmsnorm of the partials");
      cuda::check_cuda(cuda::launch_add_rmsnorm(plain.gpu(), plain_x.gpu(), summed.gpu(), {}, norm_weight.gpu,
                                                1e-6f, true, nullptr),
                       "add_rmsnorm of the sums");
    }
    cuda::check_cuda(cudaDeviceSynchronize(), "split partials' readers");
    const std::vector<float> sums = b.read_gpu(summed.gpu());
    expect_close("split sums", label + ": the op's stored sums vs the sums kernel's",
                 b.read_gpu(linear_out.gpu()), sums, kExact);
    expect_close("split sums", label + ": output", b.read_gpu(fused.gpu()), b.read_gpu(plain.gpu()), kExact);
    expect_close("split sums", label + ": updated residual", b.read_gpu(fused_x.gpu()),
                 b.read_gpu(plain_x.gpu()), kExact);

    // Through the backend: the linear's output left unsummed for its reader, against the same ops with the
    // output read in between (which sums it first).
    // Everything made before the linear: an upload or a write between it and its reader sums its partials.
    TensorPair backend_x = b.activation(kRows, width, residual), backend_out = b.poisoned(kRows, width);
    constexpr int64_t kDownFeatures = 64;  // gated: backend_out is silu_gated_linear's act (the down's x)
    const WeightPair down_weight =
        b.weight(DType::BF16, kDownFeatures, width, random_floats(rng, kDownFeatures * width, -0.05f, 0.05f));
    const LinearWeight down{kDownFeatures, width, down_weight.gpu, {}, {}, 0, {}};
    TensorPair down_out = b.poisoned(kRows, kDownFeatures);
    linear_out = b.poisoned(kRows, c.n);
    b.gpu().linear(linear_out.gpu(), x.gpu(), w);
    if (c.gated) {
      b.gpu().silu_gated_linear(down_out.gpu(), linear_out.gpu(), backend_out.gpu(), down);
    } else {
      b.gpu().add_rmsnorm(backend_out.gpu(), backend_x.gpu(), linear_out.gpu(), norm_weight.gpu, 1e-6f, true);
    }
    expect_close("split sums", label + ": through the backend", b.read_gpu(backend_out.gpu()),
                 b.read_gpu(plain.gpu()), kExact);
    expect_close("split sums", label + ": the linear's output through the backend",
                 b.read_gpu(linear_out.gpu()), sums, kExact);
  }
}

// A linear's output freed while its split partials wait for their reader: their sums must not be stored into
// the freed memory, nor into a buffer allocated in its place (compute-sanitizer's pass of these tests caught
// that write before the buffers dropped a freed output's partials).
TEST(CudaOps, LinearOutputFreedBeforeItsSums) {
  std::mt19937 rng(66);
  auto& b = backends();
  constexpr int64_t kRows = 16, kN = 2560, kK = 9216;
  const WeightPair packed = random_packed_int4(rng, kN, kK);
  const WeightPair scales =
      b.weight(DType::BF16, kN, kK / 32, random_floats(rng, kN * kK / 32, 0.002f, 0.02f));
  const LinearWeight w{kN, kK, {}, packed.gpu, scales.gpu, 32, {}};
  const TensorPair x = b.activation(kRows, kK, random_floats(rng, kRows * kK, -1.0f, 1.0f));
  ASSERT_GT(cuda::linear_mma_partial_floats(kRows, kN, kK), 0u) << "the linear splits K";
  b.gpu().linear(b.gpu().alloc(DType::F32, kRows, kN)->tensor(), x.gpu(), w);
  const std::unique_ptr<Buffer> next = b.gpu().alloc(DType::F32, kRows, kN);
  const std::vector<float> values = random_floats(rng, kRows * kN, -1.0f, 1.0f);
  // Filled past the backend (whose ops would sum pending partials first), then read through it: stray sums
  // (the freed output's, at what is likely the same address) would land over these values.
  cuda::check_cuda(cudaDeviceSynchronize(), "the linear");
  cuda::check_cuda(
      cudaMemcpy(next->tensor().data, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice),
      "fill");
  expect_close("split sums", "a buffer allocated after the linear's output was freed",
               b.read_gpu(next->tensor()), values, kExact);
}

// --bf16-copies off (BackendOptions::bf16_copies) reaches the backend: it makes no copy.
TEST(CudaOps, NoDequantizedCopyWithBf16CopiesOff) {
  std::mt19937 rng(65);
  std::vector<WeightPair> keep;
  const LinearWeight w = random_mlp_weight(rng, 256, 512, 32, DType::BF16, keep).second;
  EXPECT_EQ(make_cuda_backend({.bf16_copies = false})->dequantized_copy(w), nullptr);
}

struct MlpCase {
  int64_t hidden, intermediate;
  int group;  // 0: BF16 weights
  DType scale_dtype;

  std::string label() const {
    return fmt::format(
        "mlp {} H={} I={}",
        group == 0 ? "BF16" : fmt::format("W4A16 g{} {} scales", group, dtype_label(scale_dtype)), hidden,
        intermediate);
  }
};

// The gated MLP as the model runs it: the gate|up linear, then Backend::silu_gated_linear.
void run_gated_mlp(Backend& backend, const Tensor& out, const Tensor& gate_up, const Tensor& act,
                   const Tensor& x, const LinearWeight& w_gate_up, const LinearWeight& w_down) {
  backend.linear(gate_up, x, w_gate_up);
  backend.silu_gated_linear(out, gate_up, act, w_down);
}

// The gated MLP of `rows` random rows of x on both backends: the weights (their buffers kept here), x, the
// scratch gate_up and act, and the output.
struct MlpCall {
  std::vector<WeightPair> keep;
  LinearWeight gate_up_cpu, gate_up_gpu, down_cpu, down_gpu;
  TensorPair x, gate_up, act, out;
};

MlpCall call_mlp(std::mt19937& rng, const MlpCase& c, int64_t rows) {
  auto& b = backends();
  MlpCall m;
  std::tie(m.gate_up_cpu, m.gate_up_gpu) =
      random_mlp_weight(rng, 2 * c.intermediate, c.hidden, c.group, c.scale_dtype, m.keep);
  std::tie(m.down_cpu, m.down_gpu) =
      random_mlp_weight(rng, c.hidden, c.intermediate, c.group, c.scale_dtype, m.keep);
  m.x = b.activation(rows, c.hidden, random_floats(rng, rows * c.hidden, -1.0f, 1.0f));
  m.gate_up = b.poisoned(rows, 2 * c.intermediate);
  m.act = b.poisoned(rows, c.intermediate);
  m.out = b.poisoned(rows, c.hidden);
  on_both([&](const Side& s) {
    run_gated_mlp(s.backend, s(m.out), s(m.gate_up), s(m.act), s(m.x), s.gpu ? m.gate_up_gpu : m.gate_up_cpu,
                  s.gpu ? m.down_gpu : m.down_cpu);
  });
  return m;
}

// The gated MLP (linear, Backend::silu_gated_linear): at one row the CUDA backend's down projection makes
// silu(gate) * up while it stages x (no silu_mul launch), which must give the three ops' values bit for bit
// (linear, silu_mul, linear on the GPU, as 16 rows run), so the rows of a 16-row call equal each row alone;
// all of it against the CPU too. Cases: the 4B's W4A16 g32 MLP, g128 (the drafter's), F16 scales at small K
// (3 and 5 chunks), BF16 weights, and K not a multiple of 32 (the three ops at one row too).
TEST(CudaOps, Mlp) {
  std::mt19937 rng(63);
  auto& b = backends();
  constexpr int64_t kRows = 16;
  for (const MlpCase& c : {MlpCase{2560, 9216, 32, DType::BF16}, MlpCase{2560, 9728, 128, DType::BF16},
                           MlpCase{384, 640, 32, DType::F16}, MlpCase{2560, 9216, 0, DType::BF16},
                           MlpCase{2592, 1000, 32, DType::BF16}}) {
    const MlpCall m = call_mlp(rng, c, kRows);
    TensorPair alone = b.poisoned(kRows, c.hidden);
    for (int64_t r = 0; r < kRows; ++r)
      run_gated_mlp(b.gpu(), alone.gpu().rows_view(r, 1), m.gate_up.gpu().rows_view(r, 1),
                    m.act.gpu().rows_view(r, 1), m.x.gpu().rows_view(r, 1), m.gate_up_gpu, m.down_gpu);
    const std::string label = c.label();
    // The three ops on the GPU, at 16 rows and at each row alone.
    TensorPair three = b.poisoned(kRows, c.hidden), three_alone = b.poisoned(kRows, c.hidden);
    auto three_ops = [&](const Tensor& out, int64_t first, int64_t rows) {
      const Tensor gu = m.gate_up.gpu().rows_view(first, rows), a = m.act.gpu().rows_view(first, rows);
      b.gpu().linear(gu, m.x.gpu().rows_view(first, rows), m.gate_up_gpu);
      b.gpu().silu_mul(a, gu.cols_view(0, c.intermediate), gu.cols_view(c.intermediate, c.intermediate));
      b.gpu().linear(out, a, m.down_gpu);
    };
    three_ops(three.gpu(), 0, kRows);
    for (int64_t r = 0; r < kRows; ++r) three_ops(three_alone.gpu().rows_view(r, 1), r, 1);
    // Two linears in a row: twice the linear's tolerance.
    compare(
        "mlp", label + " M=16", m.out,
        2 * std::max(linear_tolerance(m.x.gpu(), m.gate_up_gpu), linear_tolerance(m.act.gpu(), m.down_gpu)));
    expect_close("mlp", label + " M=16 vs linear, silu_mul, linear", b.read_gpu(m.out.gpu()),
                 b.read_gpu(three.gpu()), kExact);
    expect_close("mlp", label + " M=1 each vs linear, silu_mul, linear", b.read_gpu(alone.gpu()),
                 b.read_gpu(three_alone.gpu()), kExact);
    expect_close("mlp", label + " M=16 rows vs M=1 each", b.read_gpu(m.out.gpu()), b.read_gpu(alone.gpu()),
                 kExact);
  }
}

// Prefill rows (more than kLinearMmaMaxRows): the CUDA backend makes the down projection's BF16 operand from
// gate_up in one pass (GemmLinear::run, act unused), which must give what linear after silu_mul gives
// on the GPU, bit for bit; against the CPU, two BF16 products in a row. Cases: the 4B's W4A16 g32 MLP, BF16
// weights with I = 1003 (gate_up rows not 16-byte aligned: the element-wise conversion), W4A16 with F16
// scales.
TEST(CudaOps, MlpManyRows) {
  std::mt19937 rng(64);
  auto& b = backends();
  constexpr int64_t kRows = 200;
  for (const MlpCase& c : {MlpCase{2560, 9216, 32, DType::BF16}, MlpCase{384, 1003, 0, DType::BF16},
                           MlpCase{2592, 1000, 32, DType::F16}}) {
    const MlpCall m = call_mlp(rng, c, kRows);
    TensorPair three = b.poisoned(kRows, c.hidden);
    b.gpu().linear(m.gate_up.gpu(), m.x.gpu(), m.gate_up_gpu);
    b.gpu().silu_mul(m.act.gpu(), m.gate_up.gpu().cols_view(0, c.intermediate),
                     m.gate_up.gpu().cols_view(c.intermediate, c.intermediate));
    b.gpu().linear(three.gpu(), m.act.gpu(), m.down_gpu);
    const std::string label = fmt::format("{} M={}", c.label(), kRows);
    compare("mlp", label, m.out, 2 * kGemmLinearTolerance);
    expect_close("mlp", label + " vs linear, silu_mul, linear", b.read_gpu(m.out.gpu()),
                 b.read_gpu(three.gpu()), kExact);
  }
}

// The gated attention's output projection (Backend::sigmoid_gated_linear): above kLinearMmaMaxRows rows the
// CUDA backend makes x * sigmoid(gate) in the pass that rounds x to BF16 (GemmLinear::run), which must
// give sigmoid_mul then linear on the GPU bit for bit; below, the two ops. Against the CPU: the linear's
// tolerance. The 4B's o_proj shape (4096 -> 2560) and odd columns (element-wise conversion).
TEST(CudaOps, SigmoidGatedLinear) {
  std::mt19937 rng(65);
  auto& b = backends();
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{2560, 4096}, std::pair<int64_t, int64_t>{300, 1003}})
    for (int64_t rows : {16, 200}) {
      const WeightPair w = b.weight(DType::BF16, n, k, random_floats(rng, n * k, -0.05f, 0.05f));
      const LinearWeight cpu_weight{n, k, w.cpu, {}, {}, 0, {}}, gpu_weight{n, k, w.gpu, {}, {}, 0, {}};
      const std::vector<float> x_values = random_floats(rng, rows * k, -2.0f, 2.0f);
      const TensorPair x = b.activation(rows, k, x_values), x_copy = b.activation(rows, k, x_values);
      const TensorPair gate = b.activation(rows, k, random_floats(rng, rows * k, -4.0f, 4.0f));
      TensorPair out = b.poisoned(rows, n), two_ops = b.poisoned(rows, n);
      on_both([&](const Side& s) {
        s.backend.sigmoid_gated_linear(s(out), s(x), s(gate), s.gpu ? gpu_weight : cpu_weight);
      });
      b.gpu().sigmoid_mul(x_copy.gpu(), x_copy.gpu(), gate.gpu());
      b.gpu().linear(two_ops.gpu(), x_copy.gpu(), gpu_weight);
      const std::string label = fmt::format("sigmoid_gated_linear [{}, {}] -> {}", rows, k, n);
      compare("linear", label, out, linear_tolerance(x_copy.gpu(), gpu_weight));
      expect_close("linear", label + " vs sigmoid_mul, linear", b.read_gpu(out.gpu()),
                   b.read_gpu(two_ops.gpu()), kExact);
    }
}

// A sublayer's norm and the linears that read its rows (Backend::add_rmsnorm_linear): above
// kLinearMmaMaxRows rows the CUDA norm writes the rows in BF16 straight into cuBLAS's operand (in F32 only
// when kept), which must give the separate ops on the GPU bit for bit (rmsnorm or add_rmsnorm, then linear
// per projection, whose pass rounds the rows the same way); against the CPU, the linear's tolerance (the
// residual exact, the kept rows the norm's). Cases at the 4B's hidden size: its W4A16 g32 attention q|k|v,
// GDN in_proj_qkvz (rows kept: the mixer reads them too) and MLP gate|up, small BF16 and W4A16 projections
// (two of different formats as unstacked modules) at 2051 rows, with and without the residual add (the first
// layer's norm), 16 rows (the separate ops); 1002 columns take the element-wise norm kernel.
TEST(CudaOps, AddRmsNormLinear) {
  std::mt19937 rng(66);
  auto& b = backends();
  struct Case {
    int64_t rows, hidden;
    bool residual;
    NormedRows kept;
    std::vector<std::pair<int64_t, int>> projections;  // out_features and group (0: BF16 weights) of each
  };
  const Case cases[] = {{33, 2560, true, NormedRows::Scratch, {{10240, 32}}},
                        {100, 2560, true, NormedRows::Kept, {{12288, 32}}},
                        {100, 2560, true, NormedRows::Scratch, {{18432, 32}}},
                        {2051, 2560, false, NormedRows::Scratch, {{96, 0}}},
                        {2051, 2560, true, NormedRows::Kept, {{256, 32}, {32, 0}}},
                        {16, 2560, true, NormedRows::Kept, {{256, 32}}},
                        {40, 1002, true, NormedRows::Kept, {{128, 0}}}};
  for (const Case& c : cases) {
    const std::string label =
        fmt::format("add_rmsnorm_linear [{}, {}]{}{}", c.rows, c.hidden, c.residual ? " + delta" : "",
                    c.kept == NormedRows::Kept ? " rows kept" : "");
    const WeightPair norm_weight =
        b.weight(DType::BF16, 1, c.hidden, random_floats(rng, c.hidden, -0.5f, 0.5f));
    std::vector<WeightPair> keep;
    std::vector<std::pair<LinearWeight, LinearWeight>> weights;
    for (const auto& [n, group] : c.projections)
      weights.push_back(random_mlp_weight(rng, n, c.hidden, group, DType::BF16, keep));
    const std::vector<float> x_values = random_floats(rng, c.rows * c.hidden, -3.0f, 3.0f);
    const TensorPair x = b.activation(c.rows, c.hidden, x_values),
                     x_ops = b.activation(c.rows, c.hidden, x_values);
    const TensorPair delta =
        b.activation(c.rows, c.hidden, random_floats(rng, c.rows * c.hidden, -1.0f, 1.0f));
    TensorPair normed = b.poisoned(c.rows, c.hidden), normed_ops = b.poisoned(c.rows, c.hidden);
    std::vector<TensorPair> outs, outs_ops;
    for (const auto& [n, group] : c.projections) {
      outs.push_back(b.poisoned(c.rows, n));
      outs_ops.push_back(b.poisoned(c.rows, n));
    }
    on_both([&](const Side& s) {
      std::vector<LinearProjection> projections;
      for (size_t i = 0; i < weights.size(); ++i)
        projections.push_back({s(outs[i]), s.gpu ? weights[i].second : weights[i].first});
      s.backend.add_rmsnorm_linear(projections, s(normed), c.kept, s(x), c.residual ? s(delta) : Tensor{},
                                   s(norm_weight), 1e-6f, true);
    });
    Backend& gpu = b.gpu();
    if (c.residual)
      gpu.add_rmsnorm(normed_ops.gpu(), x_ops.gpu(), delta.gpu(), norm_weight.gpu, 1e-6f, true);
    else
      gpu.rmsnorm(normed_ops.gpu(), x_ops.gpu(), norm_weight.gpu, 1e-6f, true);
    for (size_t i = 0; i < weights.size(); ++i)
      gpu.linear(outs_ops[i].gpu(), normed_ops.gpu(), weights[i].second);
    for (size_t i = 0; i < weights.size(); ++i) {
      const std::string name = fmt::format("{} -> projection {} [{}, {}] g{}", label, i,
                                           c.projections[i].first, c.hidden, c.projections[i].second);
      compare("add_rmsnorm_linear", name, outs[i], linear_tolerance(normed_ops.gpu(), weights[i].second));
      expect_close("add_rmsnorm_linear", name + " vs the separate ops", b.read_gpu(outs[i].gpu()),
                   b.read_gpu(outs_ops[i].gpu()), kExact);
    }
    compare("add_rmsnorm_linear", label + " residual", x, kExact);
    expect_close("add_rmsnorm_linear", label + " residual vs the separate ops", b.read_gpu(x.gpu()),
                 b.read_gpu(x_ops.gpu()), kExact);
    if (c.kept == NormedRows::Kept) {
      compare("add_rmsnorm_linear", label + " normed rows", normed, kReductionTolerance);
      expect_close("add_rmsnorm_linear", label + " normed rows vs the separate ops", b.read_gpu(normed.gpu()),
                   b.read_gpu(normed_ops.gpu()), kExact);
    }
  }
}

// A verify step's rows equal decode steps': 16 rows through add_rmsnorm_linear (the norm, then the many-row
// linear) against each row alone (the norm, then the one-row linear), bit for bit in the outputs, the
// residual and the kept normed rows.
TEST(CudaOps, AddRmsNormLinearRowsIndependentOfBatch) {
  std::mt19937 rng(67);
  auto& b = backends();
  constexpr int64_t kRows = 16, kHidden = 2560;
  std::vector<WeightPair> keep;
  const LinearWeight gpu_weight = random_mlp_weight(rng, 12288, kHidden, 32, DType::BF16, keep).second;
  const WeightPair norm_weight = b.weight(DType::BF16, 1, kHidden, random_floats(rng, kHidden, -0.5f, 0.5f));
  const std::vector<float> x_values = random_floats(rng, kRows * kHidden, -3.0f, 3.0f);
  const TensorPair delta = b.activation(kRows, kHidden, random_floats(rng, kRows * kHidden, -1.0f, 1.0f));
  const TensorPair x_together = b.activation(kRows, kHidden, x_values),
                   x_alone = b.activation(kRows, kHidden, x_values);
  TensorPair out_together = b.poisoned(kRows, 12288), out_alone = b.poisoned(kRows, 12288);
  TensorPair normed_together = b.poisoned(kRows, kHidden), normed_alone = b.poisoned(kRows, kHidden);
  Backend& gpu = b.gpu();
  const std::vector<LinearProjection> together{{out_together.gpu(), gpu_weight}};
  gpu.add_rmsnorm_linear(together, normed_together.gpu(), NormedRows::Kept, x_together.gpu(), delta.gpu(),
                         norm_weight.gpu, 1e-6f, true);
  for (int64_t r = 0; r < kRows; ++r) {
    const std::vector<LinearProjection> alone{{out_alone.gpu().rows_view(r, 1), gpu_weight}};
    gpu.add_rmsnorm_linear(alone, normed_alone.gpu().rows_view(r, 1), NormedRows::Kept,
                           x_alone.gpu().rows_view(r, 1), delta.gpu().rows_view(r, 1), norm_weight.gpu, 1e-6f,
                           true);
  }
  const std::string label = "add_rmsnorm_linear [16, 2560] -> [12288] g32, M=16 rows vs M=1 each";
  expect_close("add_rmsnorm_linear", label, b.read_gpu(out_together.gpu()), b.read_gpu(out_alone.gpu()),
               kExact);
  expect_close("add_rmsnorm_linear", label + ": residual", b.read_gpu(x_together.gpu()),
               b.read_gpu(x_alone.gpu()), kExact);
  expect_close("add_rmsnorm_linear", label + ": normed rows", b.read_gpu(normed_together.gpu()),
               b.read_gpu(normed_alone.gpu()), kExact);
}

TEST(CudaOps, Elementwise) {
  std::mt19937 rng(7);
  auto& b = backends();
  using BinaryOp = void (Backend::*)(const Tensor&, const Tensor&, const Tensor&);
  struct Case {
    const char* name;
    BinaryOp op;
    double tolerance;
  };
  for (const Case& c :
       {Case{"add", &Backend::add, kExact}, Case{"silu_mul", &Backend::silu_mul, kElementwiseTolerance},
        Case{"sigmoid_mul", &Backend::sigmoid_mul, kElementwiseTolerance}}) {
    for (int tokens : {1, 3, 16}) {
      const TensorPair x = b.activation(tokens, 9216, random_floats(rng, tokens * 9216, -8.0f, 8.0f));
      const TensorPair y = b.activation(tokens, 9216, random_floats(rng, tokens * 9216, -8.0f, 8.0f));
      TensorPair out = b.poisoned(tokens, 9216);
      on_both([&](const Side& s) { (s.backend.*c.op)(s(out), s(x), s(y)); });
      compare(c.name, fmt::format("{} [{}, 9216]", c.name, tokens), out, c.tolerance);
    }
    // In place (out aliases the first input) on strided views.
    TensorPair x = b.activation(3, 4200, random_floats(rng, 3 * 4200, -8.0f, 8.0f));
    const TensorPair y = b.activation(3, 4096, random_floats(rng, 3 * 4096, -8.0f, 8.0f));
    on_both([&](const Side& s) {
      const Tensor view = s(x).cols_view(100, 4096);
      (s.backend.*c.op)(view, view, s(y));
    });
    compare(c.name, fmt::format("{} in place, strided [3, 4096] of [3, 4200]", c.name), x, c.tolerance);
  }
}

TEST(CudaOps, SplitQueryGate) {
  std::mt19937 rng(8);
  auto& b = backends();
  for (int tokens : {1, 3, 16}) {
    const TensorPair qg = b.activation(tokens, 8192, random_floats(rng, tokens * 8192, -2.0f, 2.0f));
    TensorPair query = b.poisoned(tokens, 4096), gate = b.poisoned(tokens, 4096);
    on_both([&](const Side& s) { s.backend.split_query_gate(s(query), s(gate), s(qg), 256); });
    compare("split_query_gate", fmt::format("split_query_gate query [{}, 4096] head_dim 256", tokens), query,
            kExact);
    compare("split_query_gate", fmt::format("split_query_gate gate [{}, 4096] head_dim 256", tokens), gate,
            kExact);
  }
}

// The fused prologue against the CPU's composition of split_query_gate, rmsnorm, rope and kv_store: query
// and gate, and the whole caches (random rows around the stored ones must stay); then the gate-less form
// with the queries in place (the DFlash drafter's). Norm then rotation, as rmsnorm and rope are compared:
// kReductionTolerance.
TEST(CudaOps, AttentionPrologue) {
  std::mt19937 rng(41);
  auto& b = backends();
  struct Case {
    int heads, kv_heads, head_dim, rotary_dim;
    DType norm_dtype;
    bool unit_offset;
  };
  for (const Case& c : {Case{16, 4, 256, 64, DType::BF16, true}, Case{4, 2, 64, 16, DType::F32, true},
                        Case{2, 1, 32, 8, DType::BF16, false}, Case{8, 8, 128, 32, DType::F16, true}}) {
    const int64_t q_cols = int64_t(c.heads) * c.head_dim, kv_cols = int64_t(c.kv_heads) * c.head_dim;
    const WeightPair q_norm =
        b.weight(c.norm_dtype, 1, c.head_dim, random_floats(rng, c.head_dim, -0.5f, 0.5f));
    const WeightPair k_norm =
        b.weight(c.norm_dtype, 1, c.head_dim, random_floats(rng, c.head_dim, -0.5f, 0.5f));
    const AttentionPrologueShape shape{c.heads, c.kv_heads, c.head_dim,   c.rotary_dim,
                                       1e7,     1e-6f,      c.unit_offset};
    // 1-16 tokens: a warp a block; 65 and 150: prefill's blocks of 8 warps (the {2, 1} shape's 4 slots leave
    // a block part empty).
    for (int tokens : {1, 3, 16, 65, 150}) {
      const int64_t cache_rows = 200;
      std::vector<int32_t> positions = consecutive_positions(tokens, 40);
      if (tokens == 3) positions = {47, 40, 140};  // not in order
      const TensorPair pos = b.indices(positions);
      TensorPair qkv = b.activation(tokens, 2 * q_cols + 2 * kv_cols,
                                    random_floats(rng, tokens * (2 * q_cols + 2 * kv_cols), -3.0f, 3.0f));
      TensorPair k_cache =
          b.activation(cache_rows, kv_cols, random_floats(rng, cache_rows * kv_cols, -1.0f, 1.0f));
      TensorPair v_cache =
          b.activation(cache_rows, kv_cols, random_floats(rng, cache_rows * kv_cols, -1.0f, 1.0f));
      TensorPair query = b.poisoned(tokens, q_cols), gate = b.poisoned(tokens, q_cols);
      on_both([&](const Side& s) {
        s.backend.attention_prologue(s(query), s(gate), s(qkv), s(q_norm), s(k_norm), s(k_cache), s(v_cache),
                                     s(pos), shape);
      });
      const std::string label =
          fmt::format("attention_prologue {}/{}/{} rotary {} T={} norm {}", c.heads, c.kv_heads, c.head_dim,
                      c.rotary_dim, tokens, dtype_label(c.norm_dtype));
      compare("attention_prologue", label + " query", query, kReductionTolerance);
      compare("attention_prologue", label + " gate", gate, kExact);
      compare("attention_prologue", label + " k cache", k_cache, kReductionTolerance);
      compare("attention_prologue", label + " v cache", v_cache, kExact);

      // Without a gate (qkv = queries | keys | values, the DFlash drafter's): the queries normed and rotated
      // in place (qkv's query columns on each side; its key columns may differ: the CPU's default norms them
      // in place) and into a tensor of their own (qkv's query columns then stay), with the whole caches.
      const int64_t plain_width = q_cols + 2 * kv_cols;
      const std::vector<float> plain_values = random_floats(rng, tokens * plain_width, -3.0f, 3.0f);
      for (const bool in_place : {true, false}) {
        TensorPair plain_qkv = b.activation(tokens, plain_width, plain_values);
        TensorPair plain_k =
            b.activation(cache_rows, kv_cols, random_floats(rng, cache_rows * kv_cols, -1.0f, 1.0f));
        TensorPair plain_v =
            b.activation(cache_rows, kv_cols, random_floats(rng, cache_rows * kv_cols, -1.0f, 1.0f));
        TensorPair own_query = b.poisoned(tokens, q_cols);
        on_both([&](const Side& s) {
          const Tensor q = in_place ? s(plain_qkv).cols_view(0, q_cols) : s(own_query);
          s.backend.attention_prologue(q, Tensor{}, s(plain_qkv), s(q_norm), s(k_norm), s(plain_k),
                                       s(plain_v), s(pos), shape);
        });
        const std::string form = in_place ? " without a gate, in place" : " without a gate, own query";
        const auto query_columns = [&](const Tensor& t) { return t.cols_view(0, q_cols); };
        if (in_place) {
          compare_view("attention_prologue", label + form + " query", plain_qkv, query_columns,
                       kReductionTolerance);
        } else {
          compare("attention_prologue", label + form + " query", own_query, kReductionTolerance);
          std::vector<float> untouched;
          for (int64_t r = 0; r < tokens; ++r)
            untouched.insert(untouched.end(), plain_values.begin() + r * plain_width,
                             plain_values.begin() + r * plain_width + q_cols);
          const Tensor gpu_queries = query_columns(plain_qkv.gpu());
          TensorPair copy = b.poisoned(tokens, q_cols);
          b.gpu().copy(copy.gpu(), gpu_queries);
          expect_close("attention_prologue", label + form + ": qkv's query columns untouched",
                       b.read_gpu(copy.gpu()), untouched, kExact);
        }
        compare("attention_prologue", label + form + " k cache", plain_k, kReductionTolerance);
        compare("attention_prologue", label + form + " v cache", plain_v, kExact);
      }

      // Keys and values only (no query heads: the drafter's context rows, one layer's columns of the stacked
      // rows of three), the whole caches.
      const AttentionPrologueShape keys_only{0,   c.kv_heads, c.head_dim,   c.rotary_dim,
                                             1e7, 1e-6f,      c.unit_offset};
      TensorPair layers =
          b.activation(tokens, 6 * kv_cols, random_floats(rng, tokens * 6 * kv_cols, -3.0f, 3.0f));
      const auto kv = [&](const Tensor& t) { return t.cols_view(2 * kv_cols, 2 * kv_cols); };
      TensorPair kv_k =
          b.activation(cache_rows, kv_cols, random_floats(rng, cache_rows * kv_cols, -1.0f, 1.0f));
      TensorPair kv_v =
          b.activation(cache_rows, kv_cols, random_floats(rng, cache_rows * kv_cols, -1.0f, 1.0f));
      on_both([&](const Side& s) {
        s.backend.attention_prologue(Tensor{}, Tensor{}, kv(s(layers)), Tensor{}, s(k_norm), s(kv_k), s(kv_v),
                                     s(pos), keys_only);
      });
      compare("attention_prologue", label + " keys only, k cache", kv_k, kReductionTolerance);
      compare("attention_prologue", label + " keys only, v cache", kv_v, kExact);
    }
  }
}

// attention_prologues (the drafter's context rows: keys and values of every layer) against attention_prologue
// a layer at a time on the GPU, bit for bit, and the CPU op (the caches: kReductionTolerance, values exact):
// the drafter's 5 layers and 9 (two launches of at most kMaxPrologueLayers), at 1, 16 and 65 rows; and two
// gated layers with query heads (the target's form).
TEST(CudaOps, AttentionPrologues) {
  std::mt19937 rng(42);
  auto& b = backends();
  struct Case {
    int layers, heads, kv_heads, head_dim;
  };
  for (const Case& c : {Case{5, 0, 8, 128}, Case{9, 0, 2, 64}, Case{2, 8, 2, 128}}) {
    const int64_t q_cols = int64_t(c.heads) * c.head_dim, kv_cols = int64_t(c.kv_heads) * c.head_dim;
    const int64_t width = (c.heads > 0 ? 2 * q_cols : 0) + 2 * kv_cols;
    const AttentionPrologueShape shape{c.heads, c.kv_heads, c.head_dim, c.head_dim, 1e6, 1e-6f, false};
    std::vector<WeightPair> q_norms, k_norms;
    for (int i = 0; i < c.layers; ++i) {
      q_norms.push_back(b.weight(DType::BF16, 1, c.head_dim, random_floats(rng, c.head_dim, -0.5f, 0.5f)));
      k_norms.push_back(b.weight(DType::BF16, 1, c.head_dim, random_floats(rng, c.head_dim, -0.5f, 0.5f)));
    }
    for (int tokens : {1, 16, 65}) {
      const int64_t cache_rows = 100;
      const TensorPair pos = b.indices(consecutive_positions(tokens, 20));
      const TensorPair rows =
          b.activation(tokens, c.layers * width, random_floats(rng, tokens * c.layers * width, -3.0f, 3.0f));
      const std::vector<float> cache_values = random_floats(rng, cache_rows * kv_cols, -1.0f, 1.0f);
      struct Outputs {
        std::vector<TensorPair> query, gate, k_cache, v_cache;
      };
      auto outputs = [&] {
        Outputs o;
        for (int i = 0; i < c.layers; ++i) {
          o.query.push_back(b.poisoned(tokens, std::max<int64_t>(q_cols, 1)));
          o.gate.push_back(b.poisoned(tokens, std::max<int64_t>(q_cols, 1)));
          o.k_cache.push_back(b.activation(cache_rows, kv_cols, cache_values));
          o.v_cache.push_back(b.activation(cache_rows, kv_cols, cache_values));
        }
        return o;
      };
      auto layers_of = [&](const Outputs& o, const Side& s) {
        std::vector<AttentionPrologueLayer> layers;
        for (int i = 0; i < c.layers; ++i) {
          const bool queries = c.heads > 0;
          layers.push_back({queries ? s(o.query[size_t(i)]) : Tensor{},
                            queries ? s(o.gate[size_t(i)]) : Tensor{}, s(rows).cols_view(i * width, width),
                            queries ? s(q_norms[size_t(i)]) : Tensor{}, s(k_norms[size_t(i)]),
                            s(o.k_cache[size_t(i)]), s(o.v_cache[size_t(i)])});
        }
        return layers;
      };
      const Outputs together = outputs(), one_by_one = outputs();
      on_both([&](const Side& s) { s.backend.attention_prologues(layers_of(together, s), s(pos), shape); });
      for (const AttentionPrologueLayer& l : layers_of(one_by_one, Side{b.gpu(), true}))
        b.gpu().attention_prologue(l.query, l.gate, l.qkv, l.q_norm, l.k_norm, l.k_cache, l.v_cache,
                                   pos.gpu(), shape);
      const std::string label = fmt::format("attention_prologues {} layers {}/{}/{} T={}", c.layers, c.heads,
                                            c.kv_heads, c.head_dim, tokens);
      for (int i = 0; i < c.layers; ++i) {
        const std::string layer = fmt::format("{} layer {}", label, i);
        const TensorPair *k = &together.k_cache[size_t(i)], *v = &together.v_cache[size_t(i)];
        compare("attention_prologue", layer + " k cache", *k, kReductionTolerance);
        compare("attention_prologue", layer + " v cache", *v, kExact);
        expect_close("attention_prologue", layer + " k cache equals one layer's call", b.read_gpu(k->gpu()),
                     b.read_gpu(one_by_one.k_cache[size_t(i)].gpu()), kExact);
        expect_close("attention_prologue", layer + " v cache equals one layer's call", b.read_gpu(v->gpu()),
                     b.read_gpu(one_by_one.v_cache[size_t(i)].gpu()), kExact);
        if (c.heads > 0) {
          compare("attention_prologue", layer + " query", together.query[size_t(i)], kReductionTolerance);
          expect_close("attention_prologue", layer + " query equals one layer's call",
                       b.read_gpu(together.query[size_t(i)].gpu()),
                       b.read_gpu(one_by_one.query[size_t(i)].gpu()), kExact);
        }
      }
    }
  }
}

TEST(CudaOps, Rope) {
  std::mt19937 rng(9);
  auto& b = backends();
  // cos/sin of the same fp32 angles, within 2 ulp on both sides.
  constexpr double kRopeTolerance = 2e-6;
  struct Case {
    int64_t cols;
    int head_dim, rotary_dim;
    double theta;
  };
  for (const Case& c :
       {Case{16 * 256, 256, 64, 1e7}, Case{4 * 256, 256, 64, 1e7}, Case{4 * 64, 64, 16, 1e4}}) {
    for (int tokens : {1, 3, 16}) {
      for (int first : {0, 1000, 131000}) {
        std::vector<int32_t> positions = consecutive_positions(tokens, first);
        if (tokens == 3) positions = {first + 7, first, first + 100};  // not in order
        const TensorPair pos = b.indices(positions);
        TensorPair x = b.activation(tokens, c.cols, random_floats(rng, tokens * c.cols, -2.0f, 2.0f));
        on_both([&](const Side& s) { s.backend.rope(s(x), s(pos), c.head_dim, c.rotary_dim, c.theta); });
        compare("rope",
                fmt::format("rope [{}, {}] head_dim {} rotary {} positions from {}", tokens, c.cols,
                            c.head_dim, c.rotary_dim, first),
                x, kRopeTolerance);
      }
    }
  }
  // A strided view: the key part of a fused [T, q | k] row.
  const TensorPair pos = b.indices(consecutive_positions(16, 500));
  TensorPair fused = b.activation(16, 5120, random_floats(rng, 16 * 5120, -2.0f, 2.0f));
  on_both([&](const Side& s) { s.backend.rope(s(fused).cols_view(4096, 1024), s(pos), 256, 64, 1e7); });
  compare("rope", "rope strided [16, 1024] of [16, 5120] positions from 500", fused, kRopeTolerance);
}

TEST(CudaOps, KvStore) {
  std::mt19937 rng(10);
  auto& b = backends();
  for (int tokens : {1, 3, 16}) {
    TensorPair cache = b.activation(300, 1024, random_floats(rng, 300 * 1024, -1.0f, 1.0f));
    const TensorPair x = b.activation(tokens, 1024, random_floats(rng, tokens * 1024, -1.0f, 1.0f));
    std::vector<int32_t> positions = consecutive_positions(tokens, 283);
    if (tokens == 3) positions = {299, 0, 150};
    const TensorPair pos = b.indices(positions);
    on_both([&](const Side& s) { s.backend.kv_store(s(cache), s(x), s(pos)); });
    compare("kv_store", fmt::format("kv_store [{}, 1024] into cache [300, 1024]", tokens), cache, kExact);
  }
}

// The arithmetic of the CUDA attention kernel a case takes (attention.cu): FP32 when rows are 16-byte
// aligned and the query rows of one KV head (tokens x grouped heads) number at most 4 (decode), or at most
// 64 (verify) with a head_dim the tensor-core verify kernel does not take; split-BF16 tensor cores for the
// other verify cases and for prefill (more rows, or misaligned rows) of up to kLinearMmaMaxRows tokens;
// BF16 tensor cores for longer prefill chunks.
enum class AttentionArithmetic { Fp32, SplitBf16, Bf16 };

AttentionArithmetic attention_arithmetic(int tokens, int heads, int kv_heads, int head_dim, bool aligned) {
  const int rows = tokens * (heads / kv_heads);
  const bool verify_mma_head_dim = head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256;
  if (!aligned || head_dim % 4 != 0 || rows > 64)
    return tokens > cuda::kLinearMmaMaxRows ? AttentionArithmetic::Bf16 : AttentionArithmetic::SplitBf16;
  return rows <= 4 || !verify_mma_head_dim ? AttentionArithmetic::Fp32 : AttentionArithmetic::SplitBf16;
}

// FP32 kernels: softmax-weighted sums over up to 32k keys, online vs two-pass softmax, dot products in
// another order.
constexpr double kAttentionTolerance = 1e-5;
// The CPU reference adds the weighted values of 32k keys one after another in FP32; there the two differ by
// ~1.3e-5 (H200).
constexpr double kAttentionLongContextTolerance = 5e-5;
// Split-BF16 tensor cores: q, k, p and v are each hi + lo BF16 (x - hi - lo ~ 2^-17 x), products without
// lo*lo, FP32 sums. A float64 simulation of this arithmetic on these data gives 6e-6..1.2e-5 (scores up to
// ~11); the rest is margin.
constexpr double kAttentionTensorCoreTolerance = 5e-5;
// BF16 tensor cores (prefill chunks of more than kLinearMmaMaxRows tokens): q, k, p and v rounded to BF16
// once, FP32 sums and softmax. A float64 simulation of this arithmetic on data like these (65-2048 tokens
// from position 0, q in [-3, 3] or [-8, 8], k and v in [-1, 1]) gives 3.2e-3..7.9e-3 of the largest output.
constexpr double kAttentionBf16Tolerance = 2e-2;

double attention_tolerance(AttentionArithmetic arithmetic, bool long_context) {
  if (arithmetic == AttentionArithmetic::Bf16) return kAttentionBf16Tolerance;
  if (arithmetic == AttentionArithmetic::SplitBf16) return kAttentionTensorCoreTolerance;
  return long_context ? kAttentionLongContextTolerance : kAttentionTolerance;
}

struct AttentionCase {
  int heads, kv_heads, head_dim;
  int64_t cache_rows;
  std::vector<int32_t> positions;  // one per query token
  float query_range = 3.0f;
  int64_t query_column_offset = 0;  // > 0: q is a view at this column of a wider tensor (rows misaligned)
};

// Runs one case on both backends (output poisoned first) and compares all rows.
void check_attention(std::mt19937& rng, const AttentionCase& c, const std::string& what) {
  auto& b = backends();
  const auto tokens = static_cast<int64_t>(c.positions.size());
  const int64_t kv_cols = int64_t{c.kv_heads} * c.head_dim, q_cols = int64_t{c.heads} * c.head_dim;
  const TensorPair k =
      b.activation(c.cache_rows, kv_cols, random_floats(rng, c.cache_rows * kv_cols, -1.0f, 1.0f));
  const TensorPair v =
      b.activation(c.cache_rows, kv_cols, random_floats(rng, c.cache_rows * kv_cols, -1.0f, 1.0f));
  const int64_t q_width = q_cols + c.query_column_offset;
  const TensorPair q =
      b.activation(tokens, q_width, random_floats(rng, tokens * q_width, -c.query_range, c.query_range));
  const TensorPair pos = b.indices(c.positions);
  TensorPair out = b.poisoned(tokens, q_cols);
  const AttentionShape shape{c.heads, c.kv_heads, c.head_dim,
                             1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  on_both([&](const Side& s) {
    s.backend.attention(s(out), s(q).cols_view(c.query_column_offset, q_cols), s(k), s(v), s(pos), shape);
  });
  const AttentionArithmetic arithmetic = attention_arithmetic(static_cast<int>(tokens), c.heads, c.kv_heads,
                                                              c.head_dim, c.query_column_offset % 4 == 0);
  const bool long_context = *std::max_element(c.positions.begin(), c.positions.end()) >= 4096;
  compare("attention",
          fmt::format("attention {} heads {}/{} dim {} T={} positions {}..{} cache {} ({})", what, c.heads,
                      c.kv_heads, c.head_dim, tokens, c.positions.front(), c.positions.back(), c.cache_rows,
                      arithmetic == AttentionArithmetic::Bf16        ? "BF16 mma"
                      : arithmetic == AttentionArithmetic::SplitBf16 ? "split-BF16 mma"
                                                                     : "FP32"),
          out, attention_tolerance(arithmetic, long_context));
}

TEST(CudaOps, Attention) {
  std::mt19937 rng(11);
  // Qwen3.5-4B: 16 query heads, 4 KV heads of 256.
  // Decode: one token (4 query rows per KV head) at contexts 1, 63, 4096 and 32768.
  for (int32_t context : {1, 63, 4096, 32768})
    check_attention(rng, {16, 4, 256, 32768, {context - 1}}, "decode");
  check_attention(rng, {16, 4, 256, 1100, {1099}}, "decode, cache rows not a multiple of any tile");
  // Verify: 16 tokens (64 query rows) from contexts 40 and 4000.
  check_attention(rng, {16, 4, 256, 4100, consecutive_positions(16, 40)}, "verify");
  check_attention(rng, {16, 4, 256, 4100, consecutive_positions(16, 4000)}, "verify");
  // Verify of 2..16 tokens (8..64 rows: partial row tiles) at contexts that are not multiples of the 32-key
  // tiles, from the start of the cache (16 tokens at positions 0..15), with one key split (a cache of 60
  // rows), and at 32k.
  for (int tokens : {2, 3, 5, 8, 15, 16})
    for (int32_t context : {tokens, 17 + tokens, 255, 1000 + tokens, 4097})
      check_attention(rng, {16, 4, 256, 4200, consecutive_positions(tokens, context - tokens)},
                      fmt::format("verify, context {}", context));
  check_attention(rng, {16, 4, 256, 60, consecutive_positions(16, 41)}, "verify, one key split");
  check_attention(rng, {16, 4, 256, 32768, consecutive_positions(16, 32768 - 16)}, "verify, context 32768");
  // Prefill from the start (63 and 65 tokens straddle a 64-row tile's 16 tokens; 2048; 3000), a chunk after
  // 512 cached rows, and larger scores.
  for (int tokens : {63, 65, 2048, 3000})
    check_attention(rng, {16, 4, 256, 3000, consecutive_positions(tokens, 0)}, "prefill");
  check_attention(rng, {16, 4, 256, 1024, consecutive_positions(300, 512)}, "prefill chunk after 512 rows");
  check_attention(rng, {16, 4, 256, 600, consecutive_positions(100, 400), 8.0f}, "prefill, q in [-8, 8]");
  // The paired prefill kernel's 128-row tiles (32 tokens x 4 heads) and 32-key tiles: 31/32/33 tokens, a
  // context that is no multiple of 32 (129 tokens from 1000), the last 512-token chunk of a 2048-token
  // prompt, and head_dim 128 / 64 with many rows (one tile of dims per warp of a pair: 64 / 32 dims).
  for (int tokens : {31, 32, 33})
    check_attention(rng, {16, 4, 256, 100, consecutive_positions(tokens, 0)}, "prefill, paired row tiles");
  check_attention(rng, {16, 4, 256, 1200, consecutive_positions(129, 1000)}, "prefill chunk after 1000 rows");
  check_attention(rng, {16, 4, 256, 2048, consecutive_positions(512, 1536)}, "prefill chunk after 1536 rows");
  check_attention(rng, {8, 2, 128, 1100, consecutive_positions(1000, 0)}, "prefill, head_dim 128");
  check_attention(rng, {8, 2, 128, 100, consecutive_positions(30, 50)}, "prefill, head_dim 128, split BF16");
  check_attention(rng, {4, 1, 64, 100, consecutive_positions(25, 10)}, "prefill, head_dim 64, split BF16");
  check_attention(rng, {4, 1, 64, 700, consecutive_positions(333, 300)}, "prefill, head_dim 64");
  // Positions out of order.
  check_attention(rng, {16, 4, 256, 300, {7, 0, 250}}, "verify, positions out of order");
  check_attention(rng, {16, 4, 256, 300, {7, 0, 250, 3, 100, 299, 17, 64, 5, 9, 11, 13, 15, 1, 2, 4, 280}},
                  "prefill, positions out of order");
  // A misaligned q view takes the tensor-core path even for one token.
  check_attention(rng, {16, 4, 256, 500, {499}, 3.0f, 1}, "decode, q misaligned");
  // The fixtures' shapes (head_dim 32 / 64; 2 or 4 query heads per KV head) and no grouping.
  struct Shape {
    int heads, kv_heads, head_dim;
  };
  // head_dim 48: the FP32 verify kernel (the tensor-core one takes 32, 64, 128 and 256).
  for (const Shape& shape :
       {Shape{2, 1, 32}, Shape{4, 2, 64}, Shape{4, 1, 32}, Shape{8, 8, 128}, Shape{4, 1, 48}})
    for (int tokens : {1, 3, 16, 65, 200})
      check_attention(rng,
                      {shape.heads, shape.kv_heads, shape.head_dim, 512, consecutive_positions(tokens, 5)},
                      "fixture shape");
}

// A position outside the cache gives a NaN output row (the CUDA backend cannot report it without a host
// sync); the other rows are unaffected. The CPU backend refuses such positions, so its reference runs with
// the bad position replaced by a valid one.
TEST(CudaOps, AttentionBadPosition) {
  std::mt19937 rng(15);
  auto& b = backends();
  constexpr int kHeads = 16, kKvHeads = 4, kDim = 256;
  const AttentionShape shape{kHeads, kKvHeads, kDim, 1.0f / 16.0f};
  struct Case {
    int tokens;
    int64_t cache_rows;
    int32_t first_position;
  };
  // Decode (1 token), verify (3 tokens) and tensor-core (20, 1100 tokens) kernels, with key splits and
  // (small caches, many rows) without.
  for (const Case& c : {Case{1, 600, 500}, Case{3, 600, 500}, Case{20, 600, 500}, Case{1, 20, 10},
                        Case{3, 40, 10}, Case{1100, 1200, 0}}) {
    const int64_t kv_values = c.cache_rows * kKvHeads * kDim;
    const TensorPair k = b.activation(c.cache_rows, kKvHeads * kDim, random_floats(rng, kv_values, -1, 1));
    const TensorPair v = b.activation(c.cache_rows, kKvHeads * kDim, random_floats(rng, kv_values, -1, 1));
    std::vector<int32_t> positions = consecutive_positions(c.tokens, c.first_position);
    const size_t bad = positions.size() / 2;
    positions[bad] = c.tokens == 3 ? -1 : static_cast<int32_t>(c.cache_rows);
    std::vector<int32_t> valid_positions = positions;
    valid_positions[bad] = 0;
    const TensorPair q =
        b.activation(c.tokens, kHeads * kDim, random_floats(rng, int64_t{c.tokens} * kHeads * kDim, -3, 3));
    const TensorPair gpu_pos = b.indices(positions), cpu_pos = b.indices(valid_positions);
    TensorPair out = b.poisoned(c.tokens, kHeads * kDim);
    b.cpu().attention(out.cpu(), q.cpu(), k.cpu(), v.cpu(), cpu_pos.cpu(), shape);
    b.gpu().attention(out.gpu(), q.gpu(), k.gpu(), v.gpu(), gpu_pos.gpu(), shape);
    b.gpu().synchronize();
    const std::vector<float> gpu = b.read_gpu(out.gpu()), cpu = b.read_cpu(out.cpu());
    std::vector<float> gpu_valid, cpu_valid;
    double not_nan_in_bad_row = 0;
    for (size_t i = 0; i < gpu.size(); ++i) {
      if (i / (kHeads * kDim) == bad) {
        if (!std::isnan(gpu[i])) ++not_nan_in_bad_row;
      } else {
        gpu_valid.push_back(gpu[i]);
        cpu_valid.push_back(cpu[i]);
      }
    }
    const std::string label =
        fmt::format("attention T={} position {} of cache {}", c.tokens, positions[bad], c.cache_rows);
    const double tolerance =
        attention_tolerance(attention_arithmetic(c.tokens, kHeads, kKvHeads, kDim, true), false);
    if (!gpu_valid.empty())
      expect_close("attention", label + ": the other rows", gpu_valid, cpu_valid, tolerance);
    recorded_checks().push_back(CheckResult{"attention", label + ": values of the bad row that are not NaN",
                                            not_nan_in_bad_row, 0.0});
    EXPECT_EQ(not_nan_in_bad_row, 0) << label;
  }
}

TEST(CudaOps, Conv1dSilu) {
  std::mt19937 rng(12);
  auto& b = backends();
  constexpr int64_t kChannels = 8192;
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (int kernel : {4, 2}) {
      const WeightPair weight =
          b.weight(dtype, kChannels, kernel, random_floats(rng, kChannels * kernel, -0.6f, 0.6f));
      for (int tokens : {1, 63, 65}) {
        TensorPair state =
            b.activation(kChannels, kernel - 1, random_floats(rng, kChannels * (kernel - 1), -2.0f, 2.0f));
        const TensorPair x =
            b.activation(tokens, kChannels, random_floats(rng, tokens * kChannels, -2.0f, 2.0f));
        TensorPair out = b.poisoned(tokens, kChannels);
        on_both([&](const Side& s) { s.backend.conv1d_silu(s(out), s(x), s(state), s(weight), true); });
        const std::string label =
            fmt::format("conv1d_silu {} K={} [{}, {}]", dtype_label(dtype), kernel, tokens, kChannels);
        compare("conv1d_silu", label + " out", out, kElementwiseTolerance);
        compare("conv1d_silu", label + " state", state, kExact);
      }
    }
  }
  // In place: out aliases x.
  const WeightPair weight =
      b.weight(DType::BF16, kChannels, 4, random_floats(rng, kChannels * 4, -0.6f, 0.6f));
  TensorPair state = b.activation(kChannels, 3, random_floats(rng, kChannels * 3, -2.0f, 2.0f));
  TensorPair x = b.activation(16, kChannels, random_floats(rng, 16 * kChannels, -2.0f, 2.0f));
  on_both([&](const Side& s) { s.backend.conv1d_silu(s(x), s(x), s(state), s(weight), true); });
  compare("conv1d_silu", "conv1d_silu in place [16, 8192] out", x, kElementwiseTolerance);
  compare("conv1d_silu", "conv1d_silu in place [16, 8192] state", state, kExact);
}

// Many tokens (the token-parallel kernel, groups of 8 tokens): T below K - 1 (the new state still holds old
// state), around a group boundary, and long; channel counts that are not a multiple of the 128-channel block;
// K = 3, 4, 8; the state advanced or only read; x as the first columns of a wider row (the model's qkvz).
TEST(CudaOps, Conv1dSiluManyTokens) {
  std::mt19937 rng(121);
  auto& b = backends();
  struct Case {
    int64_t channels, row_cols;
    int kernel;
    std::vector<int> tokens;
  };
  const std::vector<Case> cases = {
      {8192, 12288, 4, {9, 512, 2049}},  // the 4B's conv over the qkv columns of qkvz
      {1003, 1003, 8, {2, 7, 8, 9, 65}},
      {1003, 1010, 3, {1, 2, 16, 2049}},
  };
  for (const Case& c : cases) {
    const WeightPair weight =
        b.weight(DType::BF16, c.channels, c.kernel, random_floats(rng, c.channels * c.kernel, -0.6f, 0.6f));
    for (int tokens : c.tokens) {
      for (bool update_state : {true, false}) {
        TensorPair state = b.activation(c.channels, c.kernel - 1,
                                        random_floats(rng, c.channels * (c.kernel - 1), -2.0f, 2.0f));
        const TensorPair x =
            b.activation(tokens, c.row_cols, random_floats(rng, tokens * c.row_cols, -2.0f, 2.0f));
        TensorPair out = b.poisoned(tokens, c.channels);
        on_both([&](const Side& s) {
          s.backend.conv1d_silu(s(out), s(x).cols_view(0, c.channels), s(state), s(weight), update_state);
        });
        const std::string label =
            fmt::format("conv1d_silu K={} [{}, {}] of rows of {}{}", c.kernel, tokens, c.channels, c.row_cols,
                        update_state ? "" : " (state read only)");
        compare("conv1d_silu", label + " out", out, kElementwiseTolerance);
        compare("conv1d_silu", label + " state", state, kExact);
      }
    }
  }
}

TEST(CudaOps, GdnGates) {
  std::mt19937 rng(13);
  auto& b = backends();
  const WeightPair a_log = b.weight(DType::F32, 1, 32, random_floats(rng, 32, -2.0f, 2.0f));
  const WeightPair dt_bias = b.weight(DType::BF16, 1, 32, random_floats(rng, 32, -1.0f, 1.0f));
  for (int tokens : {1, 3, 16, 65}) {
    // a spans softplus's threshold of 20.
    const TensorPair bb = b.activation(tokens, 32, random_floats(rng, tokens * 32, -6.0f, 6.0f));
    const TensorPair a = b.activation(tokens, 32, random_floats(rng, tokens * 32, -25.0f, 25.0f));
    TensorPair beta = b.poisoned(tokens, 32), g = b.poisoned(tokens, 32);
    on_both([&](const Side& s) { s.backend.gdn_gates(s(beta), s(g), s(bb), s(a), s(a_log), s(dt_bias)); });
    compare("gdn_gates", fmt::format("gdn_gates beta [{}, 32]", tokens), beta, kElementwiseTolerance);
    compare("gdn_gates", fmt::format("gdn_gates g [{}, 32]", tokens), g, kElementwiseTolerance);
  }
  // In place (beta = b, g = a), as gdn_gates_linear's fallback runs it.
  TensorPair bb = b.activation(3, 32, random_floats(rng, 3 * 32, -6.0f, 6.0f));
  TensorPair a = b.activation(3, 32, random_floats(rng, 3 * 32, -25.0f, 25.0f));
  on_both([&](const Side& s) { s.backend.gdn_gates(s(bb), s(a), s(bb), s(a), s(a_log), s(dt_bias)); });
  compare("gdn_gates", "gdn_gates in place beta [3, 32]", bb, kElementwiseTolerance);
  compare("gdn_gates", "gdn_gates in place g [3, 32]", a, kElementwiseTolerance);
}

// The 4B's b/a projections (nv 32, H 2560): one launch for T <= 16 BF16 rows (x whole or as 16-byte aligned
// columns of a wider row); the composed fallback for more rows, F16 weights and misaligned x. Tolerance: the
// dot products' (kLinearTolerance); sigmoid and softplus have slopes <= 1.
TEST(CudaOps, GdnGatesLinear) {
  std::mt19937 rng(14);
  auto& b = backends();
  const int64_t heads = 32, k = 2560;
  const WeightPair a_log = b.weight(DType::F32, 1, heads, random_floats(rng, heads, -2.0f, 2.0f));
  const WeightPair dt_bias = b.weight(DType::BF16, 1, heads, random_floats(rng, heads, -1.0f, 1.0f));
  struct Case {
    DType dtype;
    int64_t x_offset;  // x = columns x_offset .. x_offset + k - 1 of rows of k + 16
    std::vector<int> tokens;
  };
  const std::vector<Case> cases = {
      {DType::BF16, 0, {1, 3, 16, 17, 65, 200}},
      {DType::BF16, 4, {1, 16}},
      {DType::BF16, 1, {3}},
      {DType::F16, 0, {1, 16}},
  };
  for (const Case& c : cases) {
    const WeightPair w_b = b.weight(c.dtype, heads, k, random_floats(rng, heads * k, -0.05f, 0.05f));
    const WeightPair w_a = b.weight(c.dtype, heads, k, random_floats(rng, heads * k, -0.05f, 0.05f));
    for (int tokens : c.tokens) {
      const TensorPair x = b.activation(tokens, k + 16, random_floats(rng, tokens * (k + 16), -1.0f, 1.0f));
      TensorPair beta = b.poisoned(tokens, heads), g = b.poisoned(tokens, heads);
      on_both([&](const Side& s) {
        s.backend.gdn_gates_linear(s(beta), s(g), s(x).cols_view(c.x_offset, k),
                                   LinearWeight{heads, k, s(w_b), {}, {}, 0, {}},
                                   LinearWeight{heads, k, s(w_a), {}, {}, 0, {}}, s(a_log), s(dt_bias));
      });
      const std::string label = fmt::format("gdn_gates_linear {} [{}, {}] x at column {}",
                                            dtype_label(c.dtype), tokens, k, c.x_offset);
      // More than kLinearMmaMaxRows rows: both projections are BF16 products against one BF16 copy of x
      // (GemmLinear::run_pair), which must equal two linears and gdn_gates on the GPU bit for bit.
      const bool gemm = tokens > cuda::kLinearMmaMaxRows &&
                        cuda::GemmLinear::supports(LinearWeight{heads, k, w_b.gpu, {}, {}, 0, {}});
      compare("gdn_gates_linear", label + " beta", beta, gemm ? kGemmLinearTolerance : kLinearTolerance);
      compare("gdn_gates_linear", label + " g", g, gemm ? kGemmLinearTolerance : kLinearTolerance);
      if (!gemm) continue;
      TensorPair beta_ops = b.poisoned(tokens, heads), g_ops = b.poisoned(tokens, heads);
      const Tensor x_view = x.gpu().cols_view(c.x_offset, k);
      b.gpu().linear(beta_ops.gpu(), x_view, LinearWeight{heads, k, w_b.gpu, {}, {}, 0, {}});
      b.gpu().linear(g_ops.gpu(), x_view, LinearWeight{heads, k, w_a.gpu, {}, {}, 0, {}});
      b.gpu().gdn_gates(beta_ops.gpu(), g_ops.gpu(), beta_ops.gpu(), g_ops.gpu(), a_log.gpu, dt_bias.gpu);
      expect_close("gdn_gates_linear", label + " beta vs linear, linear, gdn_gates", b.read_gpu(beta.gpu()),
                   b.read_gpu(beta_ops.gpu()), kExact);
      expect_close("gdn_gates_linear", label + " g vs linear, linear, gdn_gates", b.read_gpu(g.gpu()),
                   b.read_gpu(g_ops.gpu()), kExact);
    }
  }
}

// A verify step's rows get the gates a decode step would: 16 rows in one call vs each row alone, bitwise.
TEST(CudaOps, GdnGatesLinearRowsIndependentOfT) {
  std::mt19937 rng(15);
  auto& b = backends();
  const int64_t heads = 32, k = 2560, rows = cuda::kGdnGatesLinearMaxRows;
  const WeightPair a_log = b.weight(DType::F32, 1, heads, random_floats(rng, heads, -2.0f, 2.0f));
  const WeightPair dt_bias = b.weight(DType::BF16, 1, heads, random_floats(rng, heads, -1.0f, 1.0f));
  const WeightPair w_b = b.weight(DType::BF16, heads, k, random_floats(rng, heads * k, -0.05f, 0.05f));
  const WeightPair w_a = b.weight(DType::BF16, heads, k, random_floats(rng, heads * k, -0.05f, 0.05f));
  const LinearWeight b_weight{heads, k, w_b.gpu, {}, {}, 0, {}}, a_weight{heads, k, w_a.gpu, {}, {}, 0, {}};
  const TensorPair x = b.activation(rows, k, random_floats(rng, rows * k, -1.0f, 1.0f));
  TensorPair beta = b.poisoned(rows, heads), g = b.poisoned(rows, heads);
  TensorPair beta_alone = b.poisoned(rows, heads), g_alone = b.poisoned(rows, heads);
  b.gpu().gdn_gates_linear(beta.gpu(), g.gpu(), x.gpu(), b_weight, a_weight, a_log.gpu, dt_bias.gpu);
  for (int64_t r = 0; r < rows; ++r)
    b.gpu().gdn_gates_linear(beta_alone.gpu().rows_view(r, 1), g_alone.gpu().rows_view(r, 1),
                             x.gpu().rows_view(r, 1), b_weight, a_weight, a_log.gpu, dt_bias.gpu);
  expect_close("gdn_gates_linear", "gdn_gates_linear beta, T=16 rows vs T=1 each", b.read_gpu(beta.gpu()),
               b.read_gpu(beta_alone.gpu()), kExact);
  expect_close("gdn_gates_linear", "gdn_gates_linear g, T=16 rows vs T=1 each", b.read_gpu(g.gpu()),
               b.read_gpu(g_alone.gpu()), kExact);
}

// The gated delta rule's random inputs of one shape and length (q, k, v in [-1, 1], beta in [0.05, 0.95], g
// in
// [-2, -0.01], a non-zero state), on both backends.
struct GdnCase {
  GdnShape shape;
  int64_t tokens;
  std::vector<float> initial_state;
  TensorPair qkv, beta, g;

  GdnCase(std::mt19937& rng, const GdnShape& s, int64_t t)
      : shape(s),
        tokens(t),
        initial_state(random_floats(rng, state_rows() * s.value_head_dim, -0.5f, 0.5f)),
        qkv(backends().activation(t, qkv_cols(), random_floats(rng, t * qkv_cols(), -1.0f, 1.0f))),
        beta(backends().activation(t, s.num_value_heads,
                                   random_floats(rng, t * s.num_value_heads, 0.05f, 0.95f))),
        g(backends().activation(t, s.num_value_heads,
                                random_floats(rng, t * s.num_value_heads, -2.0f, -0.01f))) {}

  int64_t qkv_cols() const {
    return 2 * int64_t{shape.num_key_heads} * shape.key_head_dim +
           int64_t{shape.num_value_heads} * shape.value_head_dim;
  }
  int64_t state_rows() const { return int64_t{shape.num_value_heads} * shape.key_head_dim; }
  int64_t out_cols() const { return int64_t{shape.num_value_heads} * shape.value_head_dim; }
  TensorPair fresh_state() const {
    return backends().activation(state_rows(), shape.value_head_dim, initial_state);
  }
  std::string label() const {
    return fmt::format("gated_delta_rule nk {} nv {} dk {} dv {} T={}", shape.num_key_heads,
                       shape.num_value_heads, shape.key_head_dim, shape.value_head_dim, tokens);
  }
};

// A verify step's replay record (GdnReplayRows) of `tokens` rows on both backends, poisoned until written.
struct RecordPair {
  TensorPair keys, decays, deltas;

  RecordPair(const GdnShape& s, int64_t tokens)
      : keys(backends().poisoned(tokens, int64_t{s.num_key_heads} * s.key_head_dim)),
        decays(backends().poisoned(tokens, s.num_value_heads)),
        deltas(backends().poisoned(tokens, int64_t{s.num_value_heads} * s.value_head_dim)) {}

  // Random rows (keys in [-0.3, 0.3], decays in [0.1, 1], deltas in [-1, 1]) for the commit alone.
  RecordPair(std::mt19937& rng, const GdnShape& s, int64_t tokens)
      : keys(random_pair(rng, tokens, int64_t{s.num_key_heads} * s.key_head_dim, -0.3f, 0.3f)),
        decays(random_pair(rng, tokens, s.num_value_heads, 0.1f, 1.0f)),
        deltas(random_pair(rng, tokens, int64_t{s.num_value_heads} * s.value_head_dim, -1.0f, 1.0f)) {}

  GdnReplayRows side(bool gpu, int64_t count) const {
    auto of = [gpu](const TensorPair& t) { return gpu ? t.gpu() : t.cpu(); };
    return GdnReplayRows{of(keys), of(decays), of(deltas)}.rows_view(0, count);
  }

 private:
  static TensorPair random_pair(std::mt19937& rng, int64_t rows, int64_t cols, float low, float high) {
    return backends().activation(rows, cols, random_floats(rng, size_t(rows * cols), low, high));
  }
};

// Every CUDA path against the CPU op: the recurrence (T < cuda::kGdnChunkedMinTokens = 64: decode, verify)
// and the chunked kernels (T >= 64; T = 3000 crosses the 2,048-token workspace segment), on the 4B
// shape and on small ones with nk != nv and dk != dv (padded head dims). The CPU op is recurrent up to 16
// tokens, chunked beyond: where both sides run the recurrence the tolerance is kRecurrentGdnTolerance, else
// kChunkedGdnTolerance (the same math in another form; the CUDA chunked products are split BF16) up to
// kGdnChunkedSplitMaxTokens tokens and kChunkedBf16GdnTolerance beyond (BF16 operands). Where
// the CUDA side is recurrent past 16 tokens it is also held to the CPU recurrence. Output and state both.
TEST(CudaOps, GatedDeltaRule) {
  std::mt19937 rng(14);
  auto& b = backends();
  struct Case {
    GdnShape shape;
    std::vector<int64_t> tokens;
  };
  const std::vector<Case> cases = {
      {{16, 32, 128, 128}, {1, 3, 16, 40, 63, 64, 65, 127, 200, 3000}},
      {{2, 4, 32, 32}, {1, 16, 63, 64, 65, 200}},
      // dk 32 padded to dv's D = 64; 8,192 tokens: four 2,048-token workspace segments (+ a tail).
      {{2, 4, 32, 64}, {64, 127, 300}},
      {{1, 2, 64, 64}, {8192, 8200}},
      {{3, 6, 64, 48}, {1, 3, 63, 64, 65, 200, 2100}},
      // dk 48 of 64 padded rows, dv 20: a slab with a half-empty warp and an empty one.
      {{1, 3, 48, 20}, {1, 3, 15, 16, 17, 40}},
      // The general recurrent kernel: dk above 128 (no chunked form either), dv not a multiple of 4.
      {{2, 2, 160, 30}, {1, 3, 16, 33}},
  };
  for (const Case& c : cases) {
    for (int64_t tokens : c.tokens) {
      const GdnCase in(rng, c.shape, tokens);
      TensorPair state = in.fresh_state();
      TensorPair out = b.poisoned(tokens, in.out_cols());
      on_both([&](const Side& s) {
        s.backend.gated_delta_rule(s(out), s(in.qkv), s(in.beta), s(in.g), s(state), c.shape, true);
      });
      const bool cuda_recurrent = tokens < cuda::kGdnChunkedMinTokens;
      const bool both_recurrent = tokens <= cpu::kGdnRecurrentMaxTokens;
      const bool bf16_chunked = !cuda_recurrent && tokens > cuda::kGdnChunkedSplitMaxTokens;
      const double tolerance = both_recurrent ? kRecurrentGdnTolerance
                               : bf16_chunked ? kChunkedBf16GdnTolerance
                                              : kChunkedGdnTolerance;
      const std::string against = fmt::format("(CUDA {}) vs CPU op ({})",
                                              cuda_recurrent ? "recurrent"
                                              : bf16_chunked ? "chunked, BF16"
                                                             : "chunked, split BF16",
                                              both_recurrent ? "recurrent" : "chunked");
      compare("gated_delta_rule", in.label() + " out " + against, out, tolerance);
      compare("gated_delta_rule", in.label() + " state " + against, state, tolerance);
      if (!cuda_recurrent || both_recurrent) continue;
      TensorPair recurrent_state = in.fresh_state();
      TensorPair recurrent_out = b.poisoned(tokens, in.out_cols());
      cpu::gated_delta_rule_recurrent(recurrent_out.cpu(), in.qkv.cpu(), in.beta.cpu(), in.g.cpu(),
                                      recurrent_state.cpu(), c.shape);
      expect_close("gated_delta_rule", in.label() + " out (CUDA recurrent) vs CPU recurrence",
                   b.read_gpu(out.gpu()), b.read_cpu(recurrent_out.cpu()), kRecurrentGdnTolerance);
      expect_close("gated_delta_rule", in.label() + " state (CUDA recurrent) vs CPU recurrence",
                   b.read_gpu(state.gpu()), b.read_cpu(recurrent_state.cpu()), kRecurrentGdnTolerance);
    }
  }
}

// update_state false (a verify step): the state is only read, bit for bit, and the output is exactly that of
// the updating call, on each path (recurrent, chunked in one segment, chunked over two segments whose state
// is carried in the workspace). A verify block's replay record (the recurrence: the 4B shape, a padded one
// and the general kernel's) matches the CPU op's (kRecurrentGdnTolerance), and gdn_commit of it gives the
// updating call's state bit for bit.
TEST(CudaOps, GatedDeltaRuleWithoutStateUpdate) {
  std::mt19937 rng(15);
  auto& b = backends();
  struct Case {
    GdnShape shape;
    int64_t tokens;
  };
  const std::vector<Case> cases = {{{16, 32, 128, 128}, 16},
                                   {{16, 32, 128, 128}, 200},
                                   {{16, 32, 128, 128}, 3000},
                                   {{1, 3, 48, 20}, 15},
                                   {{2, 2, 160, 30}, 16}};
  for (const auto& [shape, tokens] : cases) {
    const GdnCase in(rng, shape, tokens);
    const bool recorded = tokens <= kGdnReplayMaxRows;
    const RecordPair record(shape, recorded ? tokens : 1);
    TensorPair state = in.fresh_state();
    TensorPair kept_out = b.poisoned(tokens, in.out_cols()), updated_out = b.poisoned(tokens, in.out_cols());
    on_both([&](const Side& s) {
      if (!s.gpu && !recorded) return;
      s.backend.gated_delta_rule(
          s(kept_out), s(in.qkv), s(in.beta), s(in.g), s(state), in.shape,
          recorded ? GdnStateUpdate(record.side(s.gpu, tokens)) : GdnStateUpdate(false));
    });
    expect_close("gated_delta_rule", in.label() + " update_state false: state unchanged",
                 b.read_gpu(state.gpu()), in.initial_state, kExact);
    b.gpu().gated_delta_rule(updated_out.gpu(), in.qkv.gpu(), in.beta.gpu(), in.g.gpu(), state.gpu(),
                             in.shape, true);
    expect_close("gated_delta_rule", in.label() + " update_state false: out equals the updating call's",
                 b.read_gpu(kept_out.gpu()), b.read_gpu(updated_out.gpu()), kExact);
    if (!recorded) continue;
    compare("gated_delta_rule", in.label() + " replay keys vs CPU", record.keys, kRecurrentGdnTolerance);
    compare("gated_delta_rule", in.label() + " replay decays vs CPU", record.decays, kRecurrentGdnTolerance);
    compare("gated_delta_rule", in.label() + " replay deltas vs CPU", record.deltas, kRecurrentGdnTolerance);
    const int64_t channels = in.qkv_cols();
    const TensorPair conv_state = b.activation(channels, 3, random_floats(rng, size_t(channels * 3), -1, 1));
    TensorPair replayed = in.fresh_state();
    const GdnCommitLayer layer{conv_state.gpu(), in.qkv.gpu(), replayed.gpu(), record.side(true, tokens)};
    b.gpu().gdn_commit({&layer, 1}, shape, Tensor{});
    expect_close("gated_delta_rule", in.label() + " commit of the record equals the updating call's state",
                 b.read_gpu(replayed.gpu()), b.read_gpu(state.gpu()), kExact);
  }
}

// A replay record of value heads wider than the CUDA commit stages (kGdnCommitMaxValueDim) is refused by the
// verify step that would write it, naming the limit, before anything runs.
TEST(CudaOps, GatedDeltaRuleRefusesARecordTheCommitCannotTake) {
  std::mt19937 rng(21);
  auto& b = backends();
  const GdnShape shape{1, 1, 16, cuda::kGdnCommitMaxValueDim + 8};
  const GdnCase in(rng, shape, 2);
  const RecordPair record(shape, 2);
  TensorPair state = in.fresh_state(), out = b.poisoned(2, in.out_cols());
  try {
    b.gpu().gated_delta_rule(out.gpu(), in.qkv.gpu(), in.beta.gpu(), in.g.gpu(), state.gpu(), shape,
                             GdnStateUpdate(record.side(true, 2)));
    FAIL() << "a record of value_head_dim " << shape.value_head_dim << " was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("replay record with value_head_dim {}, above the CUDA "
                                                     "commit's {}",
                                                     shape.value_head_dim, cuda::kGdnCommitMaxValueDim)),
              std::string::npos)
        << e.what();
  }
  expect_close("gated_delta_rule", "refused record: the state is untouched", b.read_gpu(state.gpu()),
               in.initial_state, kExact);
}

// Replaying accepted tokens must rebuild the state of the verify bit for bit: tokens in one call equal the
// same tokens fed in calls of 1, of 3 + 13, and (40 tokens: other places in the kernel's 16-token stages) of
// 17 + 23 (rows and final state); on the 4B shape, a padded one and one of the general kernel.
TEST(CudaOps, GatedDeltaRuleTokensIndependentOfCall) {
  std::mt19937 rng(16);
  auto& b = backends();
  struct Case {
    GdnShape shape;
    int64_t tokens;
    std::vector<std::vector<int64_t>> splits;
  };
  const std::vector<Case> cases = {
      {{16, 32, 128, 128}, 16, {std::vector<int64_t>(16, 1), {3, 13}}},
      {{16, 32, 128, 128}, 40, {{17, 23}, {1, 15, 24}}},
      {{1, 3, 48, 20}, 16, {std::vector<int64_t>(16, 1)}},
      {{2, 2, 160, 30}, 16, {{3, 13}}},
  };
  for (const Case& c : cases) {
    const GdnCase in(rng, c.shape, c.tokens);
    TensorPair together_state = in.fresh_state();
    TensorPair together = b.poisoned(c.tokens, in.out_cols());
    b.gpu().gated_delta_rule(together.gpu(), in.qkv.gpu(), in.beta.gpu(), in.g.gpu(), together_state.gpu(),
                             in.shape, true);
    for (const std::vector<int64_t>& split : c.splits) {
      TensorPair state = in.fresh_state();
      TensorPair out = b.poisoned(c.tokens, in.out_cols());
      int64_t first = 0;
      std::string calls;
      for (int64_t count : split) {
        b.gpu().gated_delta_rule(out.gpu().rows_view(first, count), in.qkv.gpu().rows_view(first, count),
                                 in.beta.gpu().rows_view(first, count), in.g.gpu().rows_view(first, count),
                                 state.gpu(), in.shape, true);
        first += count;
        calls += fmt::format("{}{}", calls.empty() ? "" : " + ", count);
      }
      const std::string name = fmt::format("{} in calls of {}", in.label(), calls);
      expect_close("gated_delta_rule", name + ": out equals one call's", b.read_gpu(out.gpu()),
                   b.read_gpu(together.gpu()), kExact);
      expect_close("gated_delta_rule", name + ": state equals one call's", b.read_gpu(state.gpu()),
                   b.read_gpu(together_state.gpu()), kExact);
    }
  }
}

// gdn_commit with the count of accepted rows on the device (as the model's one recorded commit takes it),
// over a random record of 16 pending rows of the 4B shape: counts 0, 1, 7 and 16 equal the CUDA commit of
// only those rows bit for bit and the CPU commit with the same count (conv exact, recurrent
// kRecurrentGdnTolerance); counts outside the range are clamped (-3 -> 0, 20 -> 16), where the CPU would
// refuse them. A state of 129-float rows (no 16-byte column quads) takes the commit a column a thread.
TEST(CudaOps, GdnCommitRowsOnDevice) {
  std::mt19937 rng(19);
  auto& b = backends();
  constexpr int64_t kKernel = 4, kPending = 16;
  const GdnShape shape{16, 32, 128, 128};
  const GdnCase in(rng, shape, kPending);
  const RecordPair record(rng, shape, kPending);
  const int64_t channels = in.qkv_cols();
  const TensorPair conv_input =
      b.activation(kPending, channels + 3, random_floats(rng, kPending * (channels + 3), -1.0f, 1.0f));
  const std::vector<float> history = random_floats(rng, channels * (kKernel - 1), -1.0f, 1.0f);
  const std::vector<float> wide =
      random_floats(rng, size_t(in.state_rows() * (shape.value_head_dim + 1)), -1, 1);
  for (const bool padded : {false, true}) {
    for (int count : {0, 1, 7, 16, -3, 20}) {
      const int64_t accepted = std::clamp<int64_t>(count, 0, kPending);
      const std::string label = fmt::format("gdn_commit of {} pending rows, count {} on the device{}",
                                            kPending, count, padded ? ", rows of 129 floats" : "");
      const TensorPair conv_state = b.activation(channels, kKernel - 1, history);
      const TensorPair prefix_conv_state = b.activation(channels, kKernel - 1, history);
      auto fresh = [&] {
        return padded ? b.activation(in.state_rows(), shape.value_head_dim + 1, wide) : in.fresh_state();
      };
      const TensorPair state = fresh(), prefix_state = fresh();
      auto recurrent = [&](const TensorPair& t, bool gpu) {
        const Tensor whole = gpu ? t.gpu() : t.cpu();
        return padded ? whole.cols_view(0, shape.value_head_dim) : whole;
      };
      const TensorPair rows = b.indices({count});
      auto layer_of = [&](const TensorPair& conv, const TensorPair& s, int64_t n, bool gpu) {
        auto side = [gpu](const TensorPair& t) { return gpu ? t.gpu() : t.cpu(); };
        return GdnCommitLayer{side(conv), side(conv_input).cols_view(0, channels).rows_view(0, n),
                              recurrent(s, gpu), record.side(gpu, n)};
      };
      const GdnCommitLayer counted = layer_of(conv_state, state, kPending, true);
      b.gpu().gdn_commit({&counted, 1}, shape, rows.gpu());
      const GdnCommitLayer prefix = layer_of(prefix_conv_state, prefix_state, accepted, true);
      b.gpu().gdn_commit({&prefix, 1}, shape, Tensor{});
      expect_close("gdn_commit", label + ": conv state vs the prefix's", b.read_gpu(conv_state.gpu()),
                   b.read_gpu(prefix_conv_state.gpu()), kExact);
      expect_close("gdn_commit", label + ": recurrent state vs the prefix's", b.read_gpu(state.gpu()),
                   b.read_gpu(prefix_state.gpu()), kExact);
      if (accepted > 0) {
        EXPECT_NE(b.read_gpu(state.gpu()), b.read_gpu(fresh().gpu())) << label << ": nothing replayed";
      } else {
        EXPECT_EQ(b.read_gpu(state.gpu()), b.read_gpu(fresh().gpu())) << label << ": a count of 0 replayed";
      }
      const TensorPair cpu_rows = b.indices({static_cast<int32_t>(accepted)});
      const GdnCommitLayer cpu_layer = layer_of(conv_state, state, kPending, false);
      b.cpu().gdn_commit({&cpu_layer, 1}, shape, cpu_rows.cpu());
      compare("gdn_commit", label + ": conv state vs CPU", conv_state, kExact);
      compare("gdn_commit", label + ": recurrent state vs CPU", state, kRecurrentGdnTolerance);
    }
  }
}

// gdn_commit (the states of many layers in one launch, no outputs) of each side's verify record against the
// CPU op, and against the CUDA conv1d_silu + gated_delta_rule with update_state, which it must equal bit for
// bit (a commit replays what plain decode would have computed). Strided conv inputs as in the model; 26
// layers of a small shape take two launches (24 per launch); the 4B shape; a padded shape; a layer of the
// general kernel. Conv state: exact (a copy); recurrent state against the CPU: kRecurrentGdnTolerance.
TEST(CudaOps, GdnCommit) {
  std::mt19937 rng(18);
  auto& b = backends();
  constexpr int64_t kKernel = 4;
  struct Case {
    GdnShape shape;
    int layers;
    std::vector<int64_t> tokens;
  };
  const std::vector<Case> cases = {
      {{16, 32, 128, 128}, 3, {1, 3, 16}},
      {{2, 4, 32, 32}, 26, {2, 16}},
      {{1, 3, 48, 20}, 2, {1, 15}},
      {{2, 2, 160, 30}, 2, {3, 16}},
  };
  for (const Case& c : cases) {
    for (int64_t tokens : c.tokens) {
      std::vector<GdnCase> inputs;
      std::vector<TensorPair> conv_inputs, conv_states, conv_states_before, states;
      for (int i = 0; i < c.layers; ++i) {
        const GdnCase& in = inputs.emplace_back(rng, c.shape, tokens);
        const int64_t channels = in.qkv_cols();
        conv_inputs.push_back(
            b.activation(tokens, channels + 3, random_floats(rng, tokens * (channels + 3), -1.0f, 1.0f)));
        const std::vector<float> history = random_floats(rng, channels * (kKernel - 1), -1.0f, 1.0f);
        conv_states.push_back(b.activation(channels, kKernel - 1, history));
        conv_states_before.push_back(b.activation(channels, kKernel - 1, history));
        states.push_back(in.fresh_state());
      }
      const std::string label = fmt::format("gdn_commit {} layers of {}", c.layers, inputs.front().label());
      std::vector<RecordPair> records;
      for (int i = 0; i < c.layers; ++i) records.emplace_back(c.shape, tokens);
      on_both([&](const Side& s) {
        std::vector<GdnCommitLayer> layers;
        for (int i = 0; i < c.layers; ++i) {
          const GdnCase& in = inputs[i];
          const TensorPair verify_out = b.poisoned(tokens, in.out_cols());
          s.backend.gated_delta_rule(s(verify_out), s(in.qkv), s(in.beta), s(in.g), s(states[i]), c.shape,
                                     GdnStateUpdate(records[i].side(s.gpu, tokens)));
          layers.push_back({s(conv_states[i]), s(conv_inputs[i]).cols_view(0, in.qkv_cols()), s(states[i]),
                            records[i].side(s.gpu, tokens)});
        }
        s.backend.gdn_commit(layers, c.shape, Tensor{});
      });
      for (int i = 0; i < c.layers; ++i) {
        const GdnCase& in = inputs[i];
        const std::string layer = fmt::format("{} layer {}", label, i);
        compare("gdn_commit", layer + " conv state vs CPU", conv_states[i], kExact);
        compare("gdn_commit", layer + " recurrent state vs CPU", states[i], kRecurrentGdnTolerance);
        TensorPair state = in.fresh_state();
        TensorPair conv_out = b.poisoned(tokens, in.qkv_cols()), out = b.poisoned(tokens, in.out_cols());
        const WeightPair weight = b.weight(DType::BF16, in.qkv_cols(), kKernel,
                                           random_floats(rng, in.qkv_cols() * kKernel, -0.5f, 0.5f));
        b.gpu().conv1d_silu(conv_out.gpu(), conv_inputs[i].gpu().cols_view(0, in.qkv_cols()),
                            conv_states_before[i].gpu(), weight.gpu, true);
        b.gpu().gated_delta_rule(out.gpu(), in.qkv.gpu(), in.beta.gpu(), in.g.gpu(), state.gpu(), in.shape,
                                 true);
        expect_close("gdn_commit", layer + " conv state vs CUDA conv1d_silu",
                     b.read_gpu(conv_states[i].gpu()), b.read_gpu(conv_states_before[i].gpu()), kExact);
        expect_close("gdn_commit", layer + " recurrent state vs CUDA gated_delta_rule",
                     b.read_gpu(states[i].gpu()), b.read_gpu(state.gpu()), kExact);
      }
    }
  }
}

// A GDN layer's mixer inputs (Backend::gdn_mixer) of one shape, hidden size and length, on both backends:
// qkvz and x in [-1, 1], conv state in [-1, 1], conv taps in [-0.5, 0.5], the gates' projections in
// [-0.05, 0.05], a norm weight in [0.5, 1.5], a non-zero recurrent state.
struct MixerCase {
  GdnShape shape;
  int64_t hidden, tokens;
  std::vector<float> initial_conv_state, initial_state;
  TensorPair qkvz, x;
  WeightPair conv_weight, w_b, w_a, a_log, dt_bias, norm_weight;

  MixerCase(std::mt19937& rng, const GdnShape& s, int64_t h, int64_t t)
      : shape(s),
        hidden(h),
        tokens(t),
        initial_conv_state(random_floats(rng, channels() * 3, -1.0f, 1.0f)),
        initial_state(random_floats(rng, state_rows() * s.value_head_dim, -0.5f, 0.5f)),
        qkvz(backends().activation(t, channels() + z_cols(),
                                   random_floats(rng, t * (channels() + z_cols()), -1.0f, 1.0f))),
        x(backends().activation(t, h, random_floats(rng, t * h, -1.0f, 1.0f))),
        conv_weight(
            backends().weight(DType::BF16, channels(), 4, random_floats(rng, channels() * 4, -0.5f, 0.5f))),
        w_b(backends().weight(DType::BF16, s.num_value_heads, h,
                              random_floats(rng, s.num_value_heads * h, -0.05f, 0.05f))),
        w_a(backends().weight(DType::BF16, s.num_value_heads, h,
                              random_floats(rng, s.num_value_heads * h, -0.05f, 0.05f))),
        a_log(backends().weight(DType::F32, 1, s.num_value_heads,
                                random_floats(rng, s.num_value_heads, -2.0f, 2.0f))),
        dt_bias(backends().weight(DType::BF16, 1, s.num_value_heads,
                                  random_floats(rng, s.num_value_heads, -1.0f, 1.0f))),
        norm_weight(backends().weight(DType::BF16, 1, s.value_head_dim,
                                      random_floats(rng, s.value_head_dim, 0.5f, 1.5f))) {}

  int64_t channels() const { return 2 * int64_t{shape.num_key_heads} * shape.key_head_dim + z_cols(); }
  int64_t z_cols() const { return int64_t{shape.num_value_heads} * shape.value_head_dim; }
  int64_t state_rows() const { return int64_t{shape.num_value_heads} * shape.key_head_dim; }
  TensorPair fresh_conv_state() const { return backends().activation(channels(), 3, initial_conv_state); }
  TensorPair fresh_state() const {
    return backends().activation(state_rows(), shape.value_head_dim, initial_state);
  }
  GdnMixerWeights weights(bool gpu) const {
    auto pick = [gpu](const WeightPair& w) { return gpu ? w.gpu : w.cpu; };
    const int64_t nv = shape.num_value_heads;
    return {pick(conv_weight),
            {nv, hidden, pick(w_b), {}, {}, 0, {}},
            {nv, hidden, pick(w_a), {}, {}, 0, {}},
            pick(a_log),
            pick(dt_bias),
            pick(norm_weight)};
  }
  std::string label() const {
    return fmt::format("gdn_mixer nk {} nv {} dk {} dv {} H {} T={}", shape.num_key_heads,
                       shape.num_value_heads, shape.key_head_dim, shape.value_head_dim, hidden, tokens);
  }
};

// A mixer call's outputs.
struct MixerOutputs {
  TensorPair out, conv_out, beta, g, core;
  explicit MixerOutputs(const MixerCase& c)
      : out(backends().poisoned(c.tokens, c.z_cols())),
        conv_out(backends().poisoned(c.tokens, c.channels())),
        beta(backends().poisoned(c.tokens, c.shape.num_value_heads)),
        g(backends().poisoned(c.tokens, c.shape.num_value_heads)),
        core(backends().poisoned(c.tokens, c.z_cols())) {}
};

// kRecurrentGdnTolerance (the recurrence in another summation order) doubled: beta and the decay come from
// the gates' dot products (kLinearTolerance-sized differences; sigmoid's and exp(softplus)'s slopes are at
// most 1 here), and the norm divides by a sum of squares added in another order.
constexpr double kGdnMixerTolerance = 1e-4;

// The CUDA gdn_mixer (the fused kernels for T <= 16 on these shapes: checked) against the CPU composition of
// conv1d_silu, gdn_gates_linear, gated_delta_rule and gated_rmsnorm: the 4B layer, a fixture-sized one, one
// with dv 20 and three value heads per key head, and dk 16 with dv 36 (two slabs, the second of 4 columns).
// Every output and both states; conv outputs and state to kElementwiseTolerance / exactly, the gates to
// kLinearTolerance. Without update_state the states stay untouched, bit for bit, the outputs are those of the
// updating call, and the commit of its replay record gives the updating call's states bit for bit.
TEST(CudaOps, GdnMixer) {
  std::mt19937 rng(19);
  auto& b = backends();
  struct Case {
    GdnShape shape;
    int64_t hidden;
  };
  const std::vector<Case> cases = {
      {{16, 32, 128, 128}, 2560}, {{2, 4, 32, 32}, 128}, {{1, 3, 48, 20}, 64}, {{2, 4, 16, 36}, 64}};
  for (const Case& c : cases) {
    for (int64_t tokens : {1, 3, 16}) {
      const MixerCase in(rng, c.shape, c.hidden, tokens);
      ASSERT_TRUE(
          cuda::gdn_mixer_fits(in.qkvz.gpu(), in.x.gpu(), in.fresh_state().gpu(), in.weights(true), c.shape))
          << in.label() << ": the fused kernel does not take it";
      const MixerOutputs o(in);
      TensorPair conv_state = in.fresh_conv_state(), state = in.fresh_state();
      on_both([&](const Side& s) {
        s.backend.gdn_mixer(s(o.out), s(o.conv_out), s(o.beta), s(o.g), s(o.core), s(in.qkvz), s(in.x),
                            s(conv_state), s(state), in.weights(s.gpu), c.shape, 1e-6f, true);
      });
      compare("gdn_mixer", in.label() + " out", o.out, kGdnMixerTolerance);
      compare("gdn_mixer", in.label() + " conv_out", o.conv_out, kElementwiseTolerance);
      compare("gdn_mixer", in.label() + " beta", o.beta, kLinearTolerance);
      compare("gdn_mixer", in.label() + " g", o.g, kLinearTolerance);
      compare("gdn_mixer", in.label() + " conv state", conv_state, kExact);
      compare("gdn_mixer", in.label() + " recurrent state", state, kGdnMixerTolerance);

      const MixerOutputs kept(in);
      const RecordPair record(c.shape, tokens);
      TensorPair kept_conv_state = in.fresh_conv_state(), kept_state = in.fresh_state();
      b.gpu().gdn_mixer(kept.out.gpu(), kept.conv_out.gpu(), kept.beta.gpu(), kept.g.gpu(), kept.core.gpu(),
                        in.qkvz.gpu(), in.x.gpu(), kept_conv_state.gpu(), kept_state.gpu(), in.weights(true),
                        c.shape, 1e-6f, GdnStateUpdate(record.side(true, tokens)));
      const std::string without = in.label() + " update_state false: ";
      expect_close("gdn_mixer", without + "conv state unchanged", b.read_gpu(kept_conv_state.gpu()),
                   in.initial_conv_state, kExact);
      expect_close("gdn_mixer", without + "recurrent state unchanged", b.read_gpu(kept_state.gpu()),
                   in.initial_state, kExact);
      expect_close("gdn_mixer", without + "out equals the updating call's", b.read_gpu(kept.out.gpu()),
                   b.read_gpu(o.out.gpu()), kExact);
      expect_close("gdn_mixer", without + "conv_out equals the updating call's",
                   b.read_gpu(kept.conv_out.gpu()), b.read_gpu(o.conv_out.gpu()), kExact);
      expect_close("gdn_mixer", without + "g equals the updating call's", b.read_gpu(kept.g.gpu()),
                   b.read_gpu(o.g.gpu()), kExact);
      const GdnCommitLayer layer{kept_conv_state.gpu(), in.qkvz.gpu().cols_view(0, in.channels()),
                                 kept_state.gpu(), record.side(true, tokens)};
      b.gpu().gdn_commit({&layer, 1}, c.shape, Tensor{});
      expect_close("gdn_mixer", without + "its record's commit gives the updating call's conv state",
                   b.read_gpu(kept_conv_state.gpu()), b.read_gpu(conv_state.gpu()), kExact);
      expect_close("gdn_mixer", without + "its record's commit gives the updating call's recurrent state",
                   b.read_gpu(kept_state.gpu()), b.read_gpu(state.gpu()), kExact);
    }
  }
}

// A verify step's rows get what decode steps would make, bit for bit: 16 tokens in one call vs 16 calls of
// one (every output, both final states), and the verify form (no state update) followed by gdn_commit of 7
// accepted rows of its replay record rebuilds the states of 7 single-token calls exactly.
TEST(CudaOps, GdnMixerTokensIndependentOfCall) {
  std::mt19937 rng(20);
  auto& b = backends();
  constexpr int64_t kTokens = 16, kAccepted = 7;
  struct Case {
    GdnShape shape;
    int64_t hidden;
  };
  for (const Case& c : std::vector<Case>{{{16, 32, 128, 128}, 2560}, {{2, 4, 32, 32}, 128}}) {
    const MixerCase in(rng, c.shape, c.hidden, kTokens);
    const GdnMixerWeights w = in.weights(true);
    ASSERT_TRUE(cuda::gdn_mixer_fits(in.qkvz.gpu(), in.x.gpu(), in.fresh_state().gpu(), w, c.shape))
        << in.label() << ": the fused kernel does not take it";
    auto mixer = [&](const MixerOutputs& o, const TensorPair& conv_state, const TensorPair& state,
                     int64_t first, int64_t count, const GdnStateUpdate& update) {
      auto rows = [&](const TensorPair& t) { return t.gpu().rows_view(first, count); };
      b.gpu().gdn_mixer(rows(o.out), rows(o.conv_out), rows(o.beta), rows(o.g), rows(o.core), rows(in.qkvz),
                        rows(in.x), conv_state.gpu(), state.gpu(), w, c.shape, 1e-6f, update);
    };
    const MixerOutputs together(in);
    TensorPair together_conv = in.fresh_conv_state(), together_state = in.fresh_state();
    mixer(together, together_conv, together_state, 0, kTokens, true);

    const MixerOutputs alone(in);
    TensorPair alone_conv = in.fresh_conv_state(), alone_state = in.fresh_state();
    std::vector<float> accepted_conv, accepted_state;
    for (int64_t t = 0; t < kTokens; ++t) {
      mixer(alone, alone_conv, alone_state, t, 1, true);
      if (t + 1 == kAccepted) {
        accepted_conv = b.read_gpu(alone_conv.gpu());
        accepted_state = b.read_gpu(alone_state.gpu());
      }
    }
    const std::string name = in.label() + " in 16 calls of 1: ";
    for (const auto& [output, a, t] :
         {std::tuple{"out", &alone.out, &together.out},
          std::tuple{"conv_out", &alone.conv_out, &together.conv_out},
          std::tuple{"beta", &alone.beta, &together.beta}, std::tuple{"g", &alone.g, &together.g}})
      expect_close("gdn_mixer", name + output + " equals one call's", b.read_gpu(a->gpu()),
                   b.read_gpu(t->gpu()), kExact);
    expect_close("gdn_mixer", name + "conv state equals one call's", b.read_gpu(alone_conv.gpu()),
                 b.read_gpu(together_conv.gpu()), kExact);
    expect_close("gdn_mixer", name + "recurrent state equals one call's", b.read_gpu(alone_state.gpu()),
                 b.read_gpu(together_state.gpu()), kExact);

    const MixerOutputs verify(in);
    TensorPair conv_state = in.fresh_conv_state(), state = in.fresh_state();
    const RecordPair record(c.shape, kTokens);
    mixer(verify, conv_state, state, 0, kTokens, GdnStateUpdate(record.side(true, kTokens)));
    const GdnCommitLayer layer{conv_state.gpu(),
                               in.qkvz.gpu().rows_view(0, kAccepted).cols_view(0, in.channels()), state.gpu(),
                               record.side(true, kAccepted)};
    b.gpu().gdn_commit({&layer, 1}, c.shape, Tensor{});
    const std::string commit = in.label() + " verify + commit of 7 rows: ";
    expect_close("gdn_mixer", commit + "conv state equals 7 decode steps'", b.read_gpu(conv_state.gpu()),
                 accepted_conv, kExact);
    expect_close("gdn_mixer", commit + "recurrent state equals 7 decode steps'", b.read_gpu(state.gpu()),
                 accepted_state, kExact);
  }
}

// A GDN layer's mixer and its output projection (Backend::gdn_mixer_linear): above kLinearMmaMaxRows rows the
// CUDA gated norm writes the rows in BF16 straight into cuBLAS's operand (no F32 rows), which must give the
// separate ops on the GPU bit for bit (gdn_mixer, then linear, whose pass rounds the rows the same way): the
// projection, the mixer's other outputs and both states. Against the CPU: the projection to the linear's
// tolerance of the CPU's linear of the GPU's gated rows (the mixer's own error is measured by
// CudaOps.GdnMixer and its ops' tests), the conv outputs and state as CudaOps.GdnMixer holds them. The 4B's
// layer (nk 16, nv 32, dk = dv = 128, hidden 2560) with its W4A16 g32 out_proj at 33 rows (the recurrence)
// and 100 (the chunked kernels), small BF16 and W4A16 projections at 2051 (chunked with BF16 operands), 16
// rows (the fused mixer, then the tensor-core linear) and 20 (the mixer's ops, then the tensor-core linear).
TEST(CudaOps, GdnMixerLinear) {
  std::mt19937 rng(67);
  auto& b = backends();
  const GdnShape shape{16, 32, 128, 128};
  constexpr int64_t kHidden = 2560;
  struct Case {
    int64_t tokens, out_features;
    int group;  // 0: BF16 weights
  };
  const Case cases[] = {{33, 2560, 32},  {100, 2560, 32}, {2051, 96, 0},
                        {2051, 256, 32}, {16, 2560, 32},  {20, 256, 32}};
  for (const Case& c : cases) {
    const MixerCase in(rng, shape, kHidden, c.tokens);
    std::vector<WeightPair> keep;
    LinearWeight cpu_w, gpu_w;
    std::tie(cpu_w, gpu_w) = random_mlp_weight(rng, c.out_features, in.z_cols(), c.group, DType::BF16, keep);
    const std::string label =
        fmt::format("{} -> out_proj [{}, {}] g{}", in.label(), c.out_features, in.z_cols(), c.group);
    const MixerOutputs o(in), ops(in);  // their out: the gated rows
    TensorPair out = b.poisoned(c.tokens, c.out_features), out_ops = b.poisoned(c.tokens, c.out_features);
    TensorPair conv_state = in.fresh_conv_state(), state = in.fresh_state();
    TensorPair conv_state_ops = in.fresh_conv_state(), state_ops = in.fresh_state();
    on_both([&](const Side& s) {
      s.backend.gdn_mixer_linear({s(out), s.gpu ? gpu_w : cpu_w}, s(o.out), s(o.conv_out), s(o.beta), s(o.g),
                                 s(o.core), s(in.qkvz), s(in.x), s(conv_state), s(state), in.weights(s.gpu),
                                 shape, 1e-6f, true);
    });
    Backend& gpu = b.gpu();
    gpu.gdn_mixer(ops.out.gpu(), ops.conv_out.gpu(), ops.beta.gpu(), ops.g.gpu(), ops.core.gpu(),
                  in.qkvz.gpu(), in.x.gpu(), conv_state_ops.gpu(), state_ops.gpu(), in.weights(true), shape,
                  1e-6f, true);
    gpu.linear(out_ops.gpu(), ops.out.gpu(), gpu_w);
    auto expect_same = [&](std::string_view name, const TensorPair& fused, const TensorPair& separate) {
      expect_close("gdn_mixer_linear", fmt::format("{} {} vs the separate ops", label, name),
                   b.read_gpu(fused.gpu()), b.read_gpu(separate.gpu()), kExact);
    };
    expect_same("out", out, out_ops);
    expect_same("conv_out", o.conv_out, ops.conv_out);
    expect_same("beta", o.beta, ops.beta);
    expect_same("g", o.g, ops.g);
    // Up to 16 tokens the fused mixer kernel (gdn_mixer.cu) keeps its norm's partial sums in core, not the
    // recurrence's output.
    if (c.tokens > 16) expect_same("core", o.core, ops.core);
    expect_same("conv state", conv_state, conv_state_ops);
    expect_same("recurrent state", state, state_ops);
    const TensorPair gated = b.activation(c.tokens, in.z_cols(), b.read_gpu(ops.out.gpu()));
    TensorPair reference = b.poisoned(c.tokens, c.out_features);
    b.cpu().linear(reference.cpu(), gated.cpu(), cpu_w);
    expect_close("gdn_mixer_linear", label + " out vs the CPU's linear of the gated rows",
                 b.read_gpu(out.gpu()), b.read_cpu(reference.cpu()), linear_tolerance(gated.gpu(), gpu_w));
    compare("gdn_mixer_linear", label + " conv_out", o.conv_out, kElementwiseTolerance);
    compare("gdn_mixer_linear", label + " conv state", conv_state, kExact);
  }
}

// argmax: ids are exact. Rows of the head's width (248,320: 31 slices of the CUDA kernel), one less, odd
// widths and a strided view whose padding would win if read; every fourth row from row 1 has its maximum tied
// in two slices, from row 2 two NaNs, from row 3 only -inf. The ids start poisoned at -1.
TEST(CudaOps, Argmax) {
  std::mt19937 rng(17);
  auto& b = backends();
  struct Case {
    int64_t vocab, stride;
    int rows;
  };
  const std::vector<Case> cases = {{248320, 248320, 1},  {248320, 248320, 15}, {248320, 248320, 16},
                                   {248319, 248320, 16}, {8193, 8193, 15},     {1, 1, 16},
                                   {1001, 1024, 3}};
  for (const Case& c : cases) {
    std::vector<float> values = random_floats(rng, size_t(c.rows * c.stride), -20.0f, 20.0f);
    auto at = [&](int r, int64_t i) -> float& { return values[size_t(r * c.stride + i)]; };
    for (int r = 0; r < c.rows; ++r) {
      for (int64_t i = c.vocab; i < c.stride; ++i) at(r, i) = 1000.0f;
      if (r % 4 == 1) at(r, c.vocab / 3) = at(r, c.vocab - 1) = 30.0f;
      if (r % 4 == 2) at(r, c.vocab / 2) = at(r, c.vocab - 1) = std::numeric_limits<float>::quiet_NaN();
      if (r % 4 == 3)
        for (int64_t i = 0; i < c.vocab; ++i) at(r, i) = -std::numeric_limits<float>::infinity();
    }
    const TensorPair logits = b.activation(c.rows, c.stride, values);
    const TensorPair ids = b.indices(std::vector<int32_t>(size_t(c.rows), -1));
    on_both([&](const Side& s) { s.backend.argmax(s(ids), s(logits).cols_view(0, c.vocab)); });
    std::vector<int32_t> gpu_ids(size_t(c.rows)), cpu_ids(size_t(c.rows));
    b.gpu().read(gpu_ids.data(), ids.gpu());
    b.cpu().read(cpu_ids.data(), ids.cpu());
    EXPECT_EQ(gpu_ids, cpu_ids) << "V=" << c.vocab << " rows=" << c.rows;
    expect_close("argmax", fmt::format("argmax V={} stride={} rows={}", c.vocab, c.stride, c.rows),
                 std::vector<float>(gpu_ids.begin(), gpu_ids.end()),
                 std::vector<float>(cpu_ids.begin(), cpu_ids.end()), kExact);
  }
}

// Programmatic dependent launch (pdl.cuh): on an sm_90+ device (with the build's sm_90 code) every launch
// carries the attribute unless QSPEC_PDL=0. A chain of kernels that each read what the one before wrote (or
// overwrite what it read), with copies and fills (memcpy / memset nodes) between some of them, must count
// exactly, run directly and replayed from a step graph. 16 MiB per tensor, so each kernel runs long enough
// for a missing wait to show.
TEST(CudaOps, DependentLaunchChain) {
  int device = 0;
  cudaDeviceProp properties{};
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaGetDeviceProperties(&properties, device), cudaSuccess);
  const char* setting = std::getenv("QSPEC_PDL");
  const bool switched_off = setting && std::string_view(setting) == "0";
  EXPECT_EQ(cuda::programmatic_launch_enabled(), properties.major >= 9 && !switched_off)
      << "compute capability " << properties.major << "." << properties.minor;

  Backend& gpu = backends().gpu();
  constexpr int64_t kRows = 64, kCols = 65536;
  const auto make = [&] { return gpu.alloc(DType::F32, kRows, kCols); };
  const std::unique_ptr<Buffer> x = make(), y = make(), ones = make();
  gpu.write(ones->tensor(), std::vector<float>(size_t{kRows * kCols}, 1.0f).data());
  constexpr int kSteps = 64;
  constexpr int kIncrementsPerChain = kSteps + 2 * (kSteps / 8);
  const auto chain = [&] {
    const Tensor &tx = x->tensor(), &ty = y->tensor(), &tones = ones->tensor();
    for (int i = 0; i < kSteps; ++i) {
      gpu.add(tx, tx, tones);
      if (i % 8 == 3) {  // y = x through a copy, x = y + 1
        gpu.copy(ty, tx);
        gpu.add(tx, ty, tones);
      }
      if (i % 8 == 5) {  // y = 0 + x after a fill, x = y + 1
        gpu.fill_zero(ty);
        gpu.add(ty, ty, tx);
        gpu.add(tx, ty, tones);
      }
    }
  };
  const auto expect_count = [&](const std::string& name, int increments) {
    expect_close("pdl", name, backends().read_gpu(x->tensor()),
                 std::vector<float>(size_t{kRows * kCols}, static_cast<float>(increments)), kExact);
  };
  gpu.fill_zero(x->tensor());
  chain();
  expect_count(fmt::format("{} dependent adds, direct", kIncrementsPerChain), kIncrementsPerChain);
  const std::unique_ptr<StepGraph> graph = gpu.capture(chain);
  gpu.fill_zero(x->tensor());
  constexpr int kReplays = 3;
  for (int r = 0; r < kReplays; ++r) graph->launch();
  expect_count(fmt::format("{} dependent adds, {} graph replays", kReplays * kIncrementsPerChain, kReplays),
               kReplays * kIncrementsPerChain);
}

}  // namespace
}  // namespace qspec::cuda_test

namespace qspec::cuda_test {
namespace {

// Backend::beside on CUDA: side work starts after everything issued before it (a copy reading what a long
// chain of main-stream copies writes last), read() waits for it, join_side() orders later main-stream work
// after it, and writes, reads or synchronisation inside it are refused by name (the backend stays usable).
TEST(CudaSide, BesideOrdersAfterEarlierWorkAndBeforeJoins) {
  std::mt19937 rng(97);
  auto& b = backends();
  Backend& gpu = b.gpu();
  const int64_t big_rows = 4096, cols = 4096;  // 64 MiB a copy: the chain takes a while on any GPU
  const TensorPair big = b.activation(big_rows, cols, random_floats(rng, big_rows * cols, -1.0f, 1.0f));
  const TensorPair other = b.poisoned(big_rows, cols);
  const std::vector<float> values = random_floats(rng, 64 * cols, -2.0f, 2.0f);
  const TensorPair source = b.activation(64, cols, values);
  const TensorPair seen = b.poisoned(64, cols), after = b.poisoned(64, cols);
  for (int round = 0; round < 3; ++round) {
    b.poison(seen);
    gpu.write(source.gpu(), values.data());  // unlike big's rows, which the side copy must see instead
    for (int i = 0; i < 8; ++i)
      gpu.copy(i % 2 == 0 ? other.gpu() : big.gpu(), i % 2 == 0 ? big.gpu() : other.gpu());
    gpu.copy(source.gpu(), big.gpu().rows_view(0, 64));  // the last main-stream write before the side work
    gpu.beside([&] { gpu.copy(seen.gpu(), source.gpu()); });
    const std::vector<float> big_rows_read = b.read_gpu(big.gpu().rows_view(0, 64));
    expect_close("beside", fmt::format("round {}: the side copy saw the main stream's last write", round),
                 b.read_gpu(seen.gpu()), big_rows_read, kExact);
  }
  // A step graph recorded and launched inside beside (the commit's path) runs on the side stream too.
  b.poison(seen);
  std::unique_ptr<StepGraph> graph;  // kept until the read has waited for its launch
  gpu.beside([&] {
    graph = gpu.capture([&] { gpu.copy(seen.gpu(), source.gpu()); });
    graph->launch();
  });
  expect_close("beside", "a graph captured and launched beside", b.read_gpu(seen.gpu()),
               b.read_gpu(source.gpu()), kExact);
  // The side work writes; main-stream work after join_side reads what it wrote.
  b.poison(seen);
  b.poison(after);
  gpu.beside([&] {
    for (int i = 0; i < 8; ++i) gpu.copy(other.gpu(), big.gpu());
    gpu.copy(seen.gpu(), source.gpu());
  });
  gpu.join_side();
  gpu.copy(after.gpu(), seen.gpu());
  expect_close("beside", "main-stream work after join_side saw the side's write", b.read_gpu(after.gpu()),
               b.read_gpu(source.gpu()), kExact);

  std::vector<float> host(size_t(64 * cols));
  for (const auto& [what, call] : std::initializer_list<std::pair<std::string, std::function<void()>>>{
           {"read", [&] { gpu.read(host.data(), source.gpu()); }},
           {"write", [&] { gpu.write(source.gpu(), host.data()); }},
           {"synchronize", [&] { gpu.synchronize(); }},
           {"join_side", [&] { gpu.join_side(); }},
           {"alloc", [&] { static_cast<void>(gpu.alloc(DType::F32, 1, 1)); }}}) {
    try {
      gpu.beside(call);
      ADD_FAILURE() << what << " inside beside was not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what + ": not allowed inside Backend::beside"), std::string::npos)
          << e.what();
    }
  }
  gpu.synchronize();  // usable again, on the main stream
  expect_close("beside", "after refused calls", b.read_gpu(after.gpu()), b.read_gpu(source.gpu()), kExact);
  // A strided view reads back with its rows packed.
  std::vector<float> columns(size_t(64 * 3)), want;
  gpu.read(columns.data(), source.gpu().cols_view(5, 3));
  const std::vector<float> whole = b.read_gpu(source.gpu());
  for (int64_t r = 0; r < 64; ++r)
    want.insert(want.end(), whole.begin() + r * cols + 5, whole.begin() + r * cols + 8);
  EXPECT_EQ(columns, want);
}

}  // namespace
}  // namespace qspec::cuda_test
