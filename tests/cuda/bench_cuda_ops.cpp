// A first timing of a few CUDA ops at Qwen3.5-4B decode shapes, as bandwidth against the H200's measured
// 4.16 TB/s (bytes = each input read once + each output written once). Working sets are larger than the 60 MB
// L2 (several weight matrices / layer states in turn), inputs are random. Time per call = the median over
// trials of (host time of `reps` back-to-back calls, then one synchronize) / reps, after a warm-up.
//   qspec_cuda_bench OUT.json   (QSPEC_COMMIT names the commit in the JSON)
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_resources.h"
#include "backend/cuda/gemm_linear.h"
#include "backend/cuda/launchers.h"
#include "core/error.h"
#include "core/half.h"
#include "io/safetensors.h"
#include "linear_mma_workspace.h"

namespace qspec {
namespace {

constexpr double kMeasuredBandwidth = 4.16e12;  // bytes/s, device-to-device copy on this H200 (DESIGN.md)
constexpr int kTrials = 7;
constexpr int kReps = 20;

// Cheap deterministic pseudo-random bits (xorshift64*), enough to keep data off zeros.
class Bits {
 public:
  uint64_t next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1DULL;
  }
  float uniform(float low, float high) {
    return low + (high - low) * static_cast<float>(next() >> 40) / static_cast<float>(1 << 24);
  }

 private:
  uint64_t state_ = 0x9E3779B97F4A7C15ULL;
};

struct Bench {
  Backend& backend;
  Bits bits;
  std::vector<std::vector<uint8_t>> host_bytes;
  std::vector<std::unique_ptr<Buffer>> buffers;

  Tensor weight(DType dtype, int64_t rows, int64_t cols, float low, float high) {
    std::vector<uint8_t>& bytes =
        host_bytes.emplace_back(static_cast<size_t>(rows * cols) * dtype_size(dtype));
    for (size_t i = 0; i < bytes.size(); i += dtype_size(dtype)) {
      const float v = bits.uniform(low, high);
      if (dtype == DType::BF16) {
        const uint16_t h = f32_to_bf16(v);
        std::memcpy(&bytes[i], &h, 2);
      } else if (dtype == DType::I32) {
        const auto word = static_cast<uint32_t>(bits.next());
        std::memcpy(&bytes[i], &word, 4);
      } else {
        std::memcpy(&bytes[i], &v, 4);
      }
    }
    TensorView view{"bench", dtype, {rows, cols}, bytes.data(), bytes.size(), nullptr};
    Tensor t = backend.upload_weight(view, rows, cols);
    host_bytes.back() = {};
    return t;
  }

  Tensor activation(int64_t rows, int64_t cols, float low, float high) {
    const Tensor& t = buffers.emplace_back(backend.alloc(DType::F32, rows, cols))->tensor();
    std::vector<float> values(static_cast<size_t>(rows * cols));
    for (float& v : values) v = bits.uniform(low, high);
    backend.write(t, values.data());
    return t;
  }

  Tensor indices(std::vector<int32_t> values) {
    const Tensor& t =
        buffers.emplace_back(backend.alloc(DType::I32, static_cast<int64_t>(values.size()), 1))->tensor();
    backend.write(t, values.data());
    return t;
  }

  // Seconds per call of `run`; `wait` waits for the work it queued (by default the backend's stream).
  double time(const std::function<void()>& run, const std::function<void()>& wait = {}) {
    auto finish = [&] { wait ? wait() : backend.synchronize(); };
    for (int i = 0; i < 3; ++i) run();
    finish();
    std::vector<double> trials;
    for (int trial = 0; trial < kTrials; ++trial) {
      const auto start = std::chrono::steady_clock::now();
      for (int rep = 0; rep < kReps; ++rep) run();
      finish();
      trials.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                       kReps);
    }
    std::sort(trials.begin(), trials.end());
    return trials[trials.size() / 2];
  }
};

nlohmann::json entry(const std::string& name, double bytes, double seconds) {
  const double bandwidth = bytes / seconds;
  fmt::print("{:<58} {:>10.1f} us {:>8.0f} GB/s {:>5.1f}%\n", name, seconds * 1e6, bandwidth / 1e9,
             100.0 * bandwidth / kMeasuredBandwidth);
  return {{"op", name},
          {"bytes", bytes},
          {"us", seconds * 1e6},
          {"GB_per_s", bandwidth / 1e9},
          {"fraction_of_4_16_TB_per_s", bandwidth / kMeasuredBandwidth}};
}

// A compute-bound op: time and TFLOP/s.
nlohmann::json flop_entry(const std::string& name, double flop, double seconds) {
  fmt::print("{:<58} {:>10.1f} us {:>8.1f} TFLOP/s\n", name, seconds * 1e6, flop / seconds / 1e12);
  return {{"op", name}, {"flop", flop}, {"us", seconds * 1e6}, {"TFLOP_per_s", flop / seconds / 1e12}};
}

// The tensor-core linear's knobs (launchers.h, LinearMmaTuning) over the model's W4A16 shapes at 1 and 16
// rows: the split of K (chunks of 128 k per split), the many-row kernels' grid (the default, or 528 blocks
// walking the items) and, at one row, the one-row kernel against the many-row one. Prints, per shape, the
// default and the best; records every point.
void sweep_linear_mma(Bench& bench, nlohmann::json& results) {
  struct Shape {
    int64_t n, k;
  };
  constexpr int kMatrices = 8;
  constexpr int64_t kFourBlocksPerMultiprocessor = 4 * 132;
  for (const Shape shape : {Shape{18432, 2560}, Shape{12288, 2560}, Shape{2560, 9216}, Shape{2560, 4096}}) {
    const auto [n, k] = shape;
    std::vector<LinearWeight> weights;
    for (int i = 0; i < kMatrices; ++i)
      weights.push_back({n,
                         k,
                         {},
                         bench.weight(DType::I32, n, k / 8, 0, 0),
                         bench.weight(DType::BF16, n, k / 32, 0.002f, 0.02f),
                         32,
                         {}});
    const int64_t chunks = (k + 127) / 128;
    for (int64_t rows : {1, 16}) {
      const Tensor x = bench.activation(rows, k, -1, 1);
      const Tensor out = bench.activation(rows, n, -1, 1);
      // One chunk per split: the most partial sums of any tuning.
      const cuda_test::LinearMmaWorkspaceBuffers workspace_buffers(bench.backend, rows, n, k, 1);
      const cuda::LinearMmaWorkspace workspace = workspace_buffers.get();
      // Seconds per call; launched on the default stream (not the backend's), so waited for with device
      // synchronizations.
      auto time_tuning = [&](const cuda::LinearMmaTuning& tuning) {
        return bench.time(
                   [&] {
                     for (const LinearWeight& w : weights)
                       cuda::check_cuda(cuda::launch_linear_mma(out, x, w, workspace, nullptr, tuning),
                                        "linear_mma sweep");
                   },
                   [] { cuda::check_cuda(cudaDeviceSynchronize(), "linear_mma sweep"); }) /
               kMatrices;
      };
      std::string best;
      double best_seconds = 1e9, default_seconds = 0;
      for (int64_t per_split :
           {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{8}, chunks}) {
        for (int64_t grid : {int64_t{0}, kFourBlocksPerMultiprocessor})
          for (bool one_row_kernel : {true, false}) {
            if (!one_row_kernel && rows > 1) continue;
            if (one_row_kernel && rows == 1 && grid != 0) continue;  // the one-row kernel ignores the grid
            const double seconds = time_tuning({per_split, grid, one_row_kernel});
            const std::string name = fmt::format(
                "sweep linear W4A16 g32 M={} N={} K={} chunks/split {} grid {}{}", rows, n, k,
                per_split == 0 ? "default" : std::to_string(per_split), grid == 0 ? "default" : "528 walking",
                rows == 1 && !one_row_kernel ? " many-row kernel" : "");
            const double bytes = static_cast<double>(n * k) / 2.0 + static_cast<double>(n * (k / 32)) * 2.0;
            results.push_back({{"op", name},
                               {"us", seconds * 1e6},
                               {"bytes", bytes},
                               {"fraction_of_4_16_TB_per_s", bytes / seconds / kMeasuredBandwidth}});
            if (per_split == 0 && grid == 0 && one_row_kernel) default_seconds = seconds;
            if (seconds < best_seconds) best_seconds = seconds, best = name;
          }
      }
      fmt::print("sweep M={} N={} K={}: default {:.1f} us, best {:.1f} us ({})\n", rows, n, k,
                 default_seconds * 1e6, best_seconds * 1e6, best);
      if (rows != 1) continue;
      // The one-row kernel's unit: 1 .. all splits of K per unit (the split itself, the sums, unchanged).
      const int64_t splits = cuda::linear_mma_partial_floats(1, n, k) / n;
      std::string parts_line;
      for (int64_t per_part = 1; per_part <= std::max<int64_t>(splits, 1); ++per_part) {
        const double seconds = time_tuning({0, 0, true, per_part});
        results.push_back({{"op", fmt::format("sweep linear W4A16 g32 M=1 N={} K={} splits/unit {} of {}", n,
                                              k, per_part, splits)},
                           {"us", seconds * 1e6}});
        parts_line += fmt::format(" {}:{:.1f}", per_part, seconds * 1e6);
      }
      fmt::print("sweep M=1 N={} K={} splits per unit (of {}) -> us:{}\n", n, k, splits, parts_line);
    }
  }
}

// The many-row linear of prefill chunks over the 4B's W4A16 g32 body shapes (gate|up, GDN qkvz, down, GDN
// out), 4 matrices of a shape in turn (more than L2), x already BF16 (the norms make it so): the W4A16
// kernel, cuBLAS on the weights' BF16 copies, and without copies (dequantize, then cuBLAS).
void time_prefill_linears(Bench& bench, nlohmann::json& results) {
  struct Shape {
    int64_t n, k;
  };
  constexpr int kMatrices = 4;
  // The kernel at every row count (GemmLinear takes it below kW4a16MaxRows rows), and never.
  cuda::GemmLinear kernel(cuda::GemmLinear::kDefaultSliceElements, int64_t{1} << 30),
      copies(cuda::GemmLinear::kDefaultSliceElements, 0);
  for (const Shape shape : {Shape{18432, 2560}, Shape{12288, 2560}, Shape{2560, 9216}, Shape{2560, 4096}}) {
    const auto [n, k] = shape;
    std::vector<LinearWeight> quantized, with_copies;
    std::vector<cuda::DeviceMemory> copy_memory;
    for (int i = 0; i < kMatrices; ++i) {
      quantized.push_back({n,
                           k,
                           {},
                           bench.weight(DType::I32, n, k / 8, 0, 0),
                           bench.weight(DType::BF16, n, k / 32, 0.002f, 0.02f),
                           32,
                           {}});
      copy_memory.emplace_back(static_cast<size_t>(n * k) * 2);
      cuda::GemmLinear::dequantize(copy_memory.back().data(), quantized.back(), nullptr);
      with_copies.push_back(quantized.back());
      with_copies.back().dequantized = Tensor::make(DType::BF16, n, k, copy_memory.back().data());
    }
    for (int64_t rows : {64, 128, 256, 512, 1024, 2048}) {
      const Tensor x = bench.activation(rows, k, -1, 1);
      const Tensor out = bench.activation(rows, n, -1, 1);
      const double flop = 2.0 * static_cast<double>(rows * n * k);
      auto time_path = [&](cuda::GemmLinear& gemm, const std::vector<LinearWeight>& weights) {
        void* operand = gemm.operand(rows, k, nullptr);
        cuda::check_cuda(cuda::launch_rows_to_bf16(operand, x, nullptr, cuda::RowGate::None, nullptr),
                         "x to BF16");
        return bench.time(
                   [&] {
                     for (const LinearWeight& w : weights) gemm.multiply(out, operand, w, nullptr);
                   },
                   [] { cuda::check_cuda(cudaDeviceSynchronize(), "prefill linear"); }) /
               kMatrices;
      };
      const std::string shape_name = fmt::format("M={} N={} K={}", rows, n, k);
      results.push_back(
          flop_entry("prefill linear W4A16 kernel " + shape_name, flop, time_path(kernel, quantized)));
      results.push_back(flop_entry("prefill linear cuBLAS on BF16 copies " + shape_name, flop,
                                   time_path(copies, with_copies)));
      results.push_back(
          flop_entry("prefill linear dequantize + cuBLAS " + shape_name, flop, time_path(copies, quantized)));
      // The kernel's block shapes (64 or 128 rows of x a block) at forced splits of K (0: its rule).
      void* operand = kernel.operand(rows, k, nullptr);
      cuda::check_cuda(cuda::launch_rows_to_bf16(operand, x, nullptr, cuda::RowGate::None, nullptr),
                       "x to BF16");
      std::string sweep_line;
      for (int block_rows : {64, 128, 256})
        for (int64_t splits : {0, 1, 2, 4, 8}) {
          const cuda::W4a16GemmTuning tuning{splits, true, true, block_rows};
          cuda::DeviceMemory workspace(
              std::max<size_t>(1, cuda::w4a16_gemm_workspace_bytes(rows, quantized[0], tuning)));
          const double seconds =
              bench.time(
                  [&] {
                    for (const LinearWeight& w : quantized)
                      cuda::check_cuda(
                          cuda::launch_w4a16_gemm(out, operand, w, workspace.data(), nullptr, tuning),
                          "W4A16 kernel");
                  },
                  [] { cuda::check_cuda(cudaDeviceSynchronize(), "W4A16 kernel"); }) /
              kMatrices;
          results.push_back(flop_entry(
              fmt::format("sweep W4A16 kernel {} rows a block, splits {} {}", block_rows, splits, shape_name),
              flop, seconds));
          sweep_line += fmt::format(" {}r/{}s:{:.1f}", block_rows, splits, seconds * 1e6);
        }
      const int64_t chosen = cuda::w4a16_gemm_splits(rows, quantized[0]);
      fmt::print("W4A16 kernel {} splits (its own: {}) -> us:{}\n", shape_name, chosen, sweep_line);
    }
  }
}

// Writes the op timings as JSON to out_path.
void write_report(const char* out_path, const cudaDeviceProp& properties, const nlohmann::json& results) {
  const char* commit = std::getenv("QSPEC_COMMIT");
  const nlohmann::json report{
      {"gpu", properties.name},
      {"commit", commit ? commit : "unknown"},
      {"bandwidth_reference_bytes_per_s", kMeasuredBandwidth},
      {"method", "median of 7 trials of 20 back-to-back calls, host clock + synchronize"},
      {"ops", results}};
  std::ofstream out(out_path);
  out << report.dump(1) << "\n";
  if (!out) fail("could not write {}", out_path);
}

// What to time: everything; the linears only (the W4A16 and BF16 shapes, the head, the sweep, the prefill
// linears: ~20 s, for comparing builds of the linear kernels); the prefill linears alone; or no timing, two
// launches of the W4A16 prefill kernel per block shape on gate|up at 2,048 rows, for a profiler (`ncu
// --kernel-name regex:w4a16_gemm_kernel --launch-skip 1 --launch-count 1` takes 64 rows a block,
// `--launch-skip 3` 128).
enum class BenchScope { All, Linears, PrefillLinears, W4a16Launches };

void launch_w4a16_shapes(Bench& bench) {
  constexpr int64_t kRows = 2048, kN = 18432, kK = 2560;
  const LinearWeight w{kN,
                       kK,
                       {},
                       bench.weight(DType::I32, kN, kK / 8, 0, 0),
                       bench.weight(DType::BF16, kN, kK / 32, 0.002f, 0.02f),
                       32,
                       {}};
  cuda::DeviceMemory x(static_cast<size_t>(kRows * kK) * 2);
  cuda::check_cuda(cuda::launch_rows_to_bf16(x.data(), bench.activation(kRows, kK, -1, 1), nullptr,
                                             cuda::RowGate::None, nullptr),
                   "x to BF16");
  const Tensor out = bench.activation(kRows, kN, -1, 1);
  for (int block_rows : {64, 128, 256}) {
    const cuda::W4a16GemmTuning tuning{0, true, true, block_rows};
    cuda::DeviceMemory workspace(std::max<size_t>(1, cuda::w4a16_gemm_workspace_bytes(kRows, w, tuning)));
    for (int launch = 0; launch < 2; ++launch)
      cuda::check_cuda(cuda::launch_w4a16_gemm(out, x.data(), w, workspace.data(), nullptr, tuning),
                       "W4A16 kernel");
  }
  cuda::check_cuda(cudaDeviceSynchronize(), "W4A16 kernel");
}

int run(const char* out_path, BenchScope scope) {
  int device = 0;
  cudaDeviceProp properties{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&properties, device) != cudaSuccess)
    fail("no CUDA device");
  std::unique_ptr<Backend> backend = make_cuda_backend();
  Bench bench{*backend, {}, {}, {}};
  nlohmann::json results = nlohmann::json::array();
  if (scope == BenchScope::W4a16Launches) {
    launch_w4a16_shapes(bench);
    return 0;
  }
  if (scope == BenchScope::PrefillLinears) {
    time_prefill_linears(bench, results);
    write_report(out_path, properties, results);
    return 0;
  }

  // W4A16 linear: 8 matrices of one shape in turn (> 100 MB with the scales, more than L2). gate/up
  // [9216, 2560] and down [2560, 9216] (split K) g32, the drafter's g128 [9728, 2560].
  struct W4a16Shape {
    int64_t n, k, group;
  };
  for (const W4a16Shape shape :
       {W4a16Shape{9216, 2560, 32}, W4a16Shape{2560, 9216, 32}, W4a16Shape{9728, 2560, 128}}) {
    constexpr int kMatrices = 8;
    const auto [n, k, group] = shape;
    std::vector<LinearWeight> weights;
    for (int i = 0; i < kMatrices; ++i)
      weights.push_back({n,
                         k,
                         {},
                         bench.weight(DType::I32, n, k / 8, 0, 0),
                         bench.weight(DType::BF16, n, k / group, 0.002f, 0.02f),
                         static_cast<int>(group),
                         {}});
    for (int64_t rows : {1, 16}) {
      const Tensor x = bench.activation(rows, k, -1, 1);
      const Tensor out = bench.activation(rows, n, -1, 1);
      const double seconds = bench.time([&] {
        for (const LinearWeight& w : weights) backend->linear(out, x, w);
      }) / kMatrices;
      const double bytes = static_cast<double>(n * k) / 2.0 + static_cast<double>(n * (k / group)) * 2.0 +
                           4.0 * static_cast<double>(rows * (k + n));
      results.push_back(
          entry(fmt::format("linear W4A16 g{} M={} N={} K={}", group, rows, n, k), bytes, seconds));
    }
  }
  // Dense BF16 linear [32768, 2560] (168 MB; the LM head's shape with fewer rows).
  {
    constexpr int64_t kN = 32768, kK = 2560;
    const LinearWeight w{kN, kK, bench.weight(DType::BF16, kN, kK, -0.05f, 0.05f), {}, {}, 0, {}};
    for (int64_t rows : {1, 16}) {
      const Tensor x = bench.activation(rows, kK, -1, 1);
      const Tensor out = bench.activation(rows, kN, -1, 1);
      const double seconds = bench.time([&] { backend->linear(out, x, w); });
      const double bytes = kN * kK * 2.0 + 4.0 * static_cast<double>(rows * (kK + kN));
      results.push_back(entry(fmt::format("linear BF16 M={} N={} K={}", rows, kN, kK), bytes, seconds));
    }
  }
  // The head [248320, 2560] (the drafter's 15 rows, a decode's 1, a verify's 16): the target's BF16 and the
  // W4A16 g32 copy of --draft-head w4a16 (each alone is far more than L2).
  {
    constexpr int64_t kN = 248320, kK = 2560, kGroup = 32;
    const LinearWeight bf16{kN, kK, bench.weight(DType::BF16, kN, kK, -0.05f, 0.05f), {}, {}, 0, {}};
    const LinearWeight w4a16{kN,
                             kK,
                             {},
                             bench.weight(DType::I32, kN, kK / 8, 0, 0),
                             bench.weight(DType::BF16, kN, kK / kGroup, 0.002f, 0.02f),
                             static_cast<int>(kGroup),
                             {}};
    for (int64_t rows : {1, 15, 16}) {
      const Tensor x = bench.activation(rows, kK, -1, 1);
      const Tensor out = bench.activation(rows, kN, -1, 1);
      const double activation_bytes = 4.0 * static_cast<double>(rows * (kK + kN));
      const double bf16_seconds = bench.time([&] { backend->linear(out, x, bf16); });
      results.push_back(entry(fmt::format("head BF16 M={} N={} K={}", rows, kN, kK),
                              kN * kK * 2.0 + activation_bytes, bf16_seconds));
      const double w4a16_seconds = bench.time([&] { backend->linear(out, x, w4a16); });
      results.push_back(entry(fmt::format("head W4A16 g32 M={} N={} K={}", rows, kN, kK),
                              kN * kK / 2.0 + kN * (kK / kGroup) * 2.0 + activation_bytes, w4a16_seconds));
    }
  }
  sweep_linear_mma(bench, results);
  time_prefill_linears(bench, results);
  if (scope == BenchScope::Linears) {
    write_report(out_path, properties, results);
    return 0;
  }
  // argmax over the 248,320-wide logits of a decode step (1 row), a draft step (15) and a verify step (16).
  {
    constexpr int64_t kVocab = 248320;
    for (int64_t rows : {1, 15, 16}) {
      const Tensor logits = bench.activation(rows, kVocab, -10, 10);
      const Tensor& ids = bench.buffers.emplace_back(backend->alloc(DType::I32, rows, 1))->tensor();
      const double seconds = bench.time([&] { backend->argmax(ids, logits); });
      results.push_back(entry(fmt::format("argmax rows {} V {}", rows, kVocab),
                              4.0 * static_cast<double>(rows * (kVocab + 1)), seconds));
    }
  }
  // Gated delta rule, Qwen3.5-4B shape. Decode (T = 1) and a verify block (T = 16): 24 layers' states in turn
  // (2 MiB each, read and written), the recurrence. Prefill (T = 2048, 8192): one layer's inputs, the chunked
  // kernels; per layer and for 24 layers, with the chunked form's matrix FLOPs (per head and 64-token chunk
  // 4C^2 dk + 4C^2 (dk + dv) + 6C dk dv, C = 64, counted once although each runs as 3 TF32 products).
  {
    constexpr int kLayers = 24;
    constexpr int64_t kQkvCols = 8192, kHeads = 32, kDim = 128, kChunk = 64;
    const GdnShape shape{16, 32, 128, 128};
    std::vector<Tensor> states;
    for (int i = 0; i < kLayers; ++i) states.push_back(bench.activation(kHeads * kDim, kDim, -0.5f, 0.5f));
    for (int64_t tokens : {1, 16}) {
      const Tensor qkv = bench.activation(tokens, kQkvCols, -1, 1);
      const Tensor beta = bench.activation(tokens, kHeads, 0.1f, 0.9f);
      const Tensor g = bench.activation(tokens, kHeads, -1.0f, -0.01f);
      const Tensor out = bench.activation(tokens, kHeads * kDim, -1, 1);
      const double seconds = bench.time([&] {
        for (const Tensor& state : states) backend->gated_delta_rule(out, qkv, beta, g, state, shape, true);
      }) / kLayers;
      const double bytes = 2.0 * kHeads * kDim * kDim * 4 +
                           4.0 * static_cast<double>(tokens * (kQkvCols + 2 * kHeads + kHeads * kDim));
      results.push_back(
          entry(fmt::format("gated_delta_rule T={} nv 32 dk=dv=128 (state r+w)", tokens), bytes, seconds));
    }
    // The commit of a verify step's accepted rows: all 24 layers' conv and recurrent states in one
    // gdn_commit.
    for (int64_t tokens : {1, 4, 16}) {
      constexpr int64_t kConvHistory = 3;
      const Tensor conv_input = bench.activation(tokens, kQkvCols, -1, 1);
      const GdnReplayRows record{bench.activation(tokens, 16 * kDim, -0.3f, 0.3f),
                                 bench.activation(tokens, kHeads, 0.1f, 1.0f),
                                 bench.activation(tokens, kHeads * kDim, -1, 1)};
      std::vector<GdnCommitLayer> layers;
      for (const Tensor& state : states)
        layers.push_back({bench.activation(kQkvCols, kConvHistory, -1, 1), conv_input, state, record});
      const double seconds = bench.time([&] { backend->gdn_commit(layers, shape, Tensor{}); });
      const double record_floats = static_cast<double>(tokens * (16 * kDim + kHeads + kHeads * kDim));
      const double bytes = kLayers * (2.0 * kHeads * kDim * kDim * 4 + 2.0 * kQkvCols * kConvHistory * 4 +
                                      4.0 * static_cast<double>(tokens * kQkvCols) + 4.0 * record_floats);
      results.push_back(
          entry(fmt::format("gdn_commit 24 layers T={} nv 32 dk=dv=128", tokens), bytes, seconds));
    }
    for (int64_t tokens : {2048, 8192}) {
      const Tensor qkv = bench.activation(tokens, kQkvCols, -1, 1);
      const Tensor beta = bench.activation(tokens, kHeads, 0.1f, 0.9f);
      const Tensor g = bench.activation(tokens, kHeads, -1.0f, -0.01f);
      const Tensor out = bench.activation(tokens, kHeads * kDim, -1, 1);
      const double seconds =
          bench.time([&] { backend->gated_delta_rule(out, qkv, beta, g, states[0], shape, true); });
      const double chunk_flops =
          4.0 * kChunk * kChunk * kDim + 4.0 * kChunk * kChunk * 2 * kDim + 6.0 * kChunk * kDim * kDim;
      const double flops = chunk_flops * kHeads * static_cast<double>((tokens + kChunk - 1) / kChunk);
      const std::string name = fmt::format("gated_delta_rule prefill T={} nv 32 dk=dv=128", tokens);
      fmt::print("{:<58} {:>10.3f} ms/layer {:>8.2f} ms/24 layers {:>6.1f} TFLOP/s\n", name, seconds * 1e3,
                 seconds * 1e3 * kLayers, flops / seconds / 1e12);
      results.push_back({{"op", name},
                         {"us", seconds * 1e6},
                         {"ms_24_layers", seconds * 1e3 * kLayers},
                         {"flops", flops},
                         {"TFLOP_per_s", flops / seconds / 1e12}});
    }
  }
  // Attention of Qwen3.5-4B (16 query heads, 4 KV heads of 256, F32 caches of 32k rows): a decode row, an
  // 8-row and a 16-row verify block at the end of 256 .. 32768 cached positions, 8 layers' caches in turn
  // (bytes: the K and V rows read once); prefill of 2048 / 8192 tokens from position 0 (causal FLOPs: 4 x
  // heads x head_dim x sum over rows of the keys seen; the 8 layers of the model take 8x the time).
  {
    constexpr int kLayers = 8;
    constexpr int64_t kCacheRows = 32768;
    const AttentionShape shape{16, 4, 256, 1.0f / 16.0f};
    std::vector<Tensor> caches;
    for (int i = 0; i < 2 * kLayers; ++i) caches.push_back(bench.activation(kCacheRows, 1024, -1, 1));
    for (int rows : {1, 8, 16}) {
      for (int context : {256, 1024, 4096, 32768}) {
        const Tensor q = bench.activation(rows, 4096, -1, 1);
        const Tensor out = bench.activation(rows, 4096, -1, 1);
        std::vector<int32_t> last_positions(static_cast<size_t>(rows));
        for (int r = 0; r < rows; ++r) last_positions[static_cast<size_t>(r)] = context - rows + r;
        const Tensor positions = bench.indices(last_positions);
        const auto all_layers = [&] {
          for (int layer = 0; layer < kLayers; ++layer)
            backend->attention(out, q, caches[2 * layer], caches[2 * layer + 1], positions, shape);
        };
        const double bytes = 2.0 * context * 1024 * 4 + 8.0 * 4096 * rows;
        const double seconds = bench.time(all_layers) / kLayers;
        results.push_back(
            entry(fmt::format("attention T={} context {} heads 16/4/256", rows, context), bytes, seconds));
        // As a step sees it: the 8 layers' calls in one graph, without host launch costs.
        const std::unique_ptr<StepGraph> graph = backend->capture(all_layers);
        const double graph_seconds = bench.time([&] { graph->launch(); }) / kLayers;
        results.push_back(
            entry(fmt::format("attention T={} context {} heads 16/4/256 (graph)", rows, context), bytes,
                  graph_seconds));
      }
    }
    // Also the last 512-token chunk of a chunked 2048-token prefill (3 key splits, then their merge) and the
    // last 2048-token chunk of an 8192-token prompt (the model's prefill chunk).
    struct Prefill {
      int tokens, start;
    };
    for (const Prefill& p : {Prefill{2048, 0}, Prefill{8192, 0}, Prefill{512, 1536}, Prefill{2048, 6144}}) {
      const Tensor q = bench.activation(p.tokens, 4096, -1, 1);
      const Tensor out = bench.activation(p.tokens, 4096, -1, 1);
      std::vector<int32_t> all_positions(static_cast<size_t>(p.tokens));
      for (int t = 0; t < p.tokens; ++t) all_positions[static_cast<size_t>(t)] = p.start + t;
      const Tensor positions = bench.indices(all_positions);
      const double seconds =
          bench.time([&] { backend->attention(out, q, caches[0], caches[1], positions, shape); });
      const double keys_seen =
          static_cast<double>(p.tokens) * p.start + static_cast<double>(p.tokens) * (p.tokens + 1) / 2;
      const double flop = 4.0 * 16 * 256 * keys_seen;
      results.push_back(
          flop_entry(fmt::format("attention prefill T={} from {} heads 16/4/256 (x8 layers: {:.1f} ms)",
                                 p.tokens, p.start, 8e3 * seconds),
                     flop, seconds));
    }
  }

  // Prefill shapes of the Qwen3.5-4B at 2048 rows. The many-row linear (cuBLAS; W4A16 dequantized to BF16
  // first, x converted to BF16) for gate|up, qkv|z and down, in TFLOP/s against the ~790 of BF16; the ops
  // around it in bandwidth: conv1d_silu over the qkv columns of qkvz (T = 2048, 8192), silu_mul, add_rmsnorm,
  // gated_rmsnorm.
  {
    constexpr int64_t kRows = 2048, kHidden = 2560, kFf = 9216, kConvDim = 8192, kValueDim = 4096;
    struct PrefillLinear {
      const char* name;
      int64_t n, k;
    };
    for (const PrefillLinear shape :
         {PrefillLinear{"gate|up", 2 * kFf, kHidden}, PrefillLinear{"qkv|z", kConvDim + kValueDim, kHidden},
          PrefillLinear{"down", kHidden, kFf}}) {
      const Tensor x = bench.activation(kRows, shape.k, -1, 1);
      const Tensor out = bench.activation(kRows, shape.n, -1, 1);
      const LinearWeight bf16{
          shape.n, shape.k, bench.weight(DType::BF16, shape.n, shape.k, -0.05f, 0.05f), {}, {}, 0, {}};
      const LinearWeight w4a16{shape.n,
                               shape.k,
                               {},
                               bench.weight(DType::I32, shape.n, shape.k / 8, 0, 0),
                               bench.weight(DType::BF16, shape.n, shape.k / 32, 0.002f, 0.02f),
                               32,
                               {}};
      const double flop = 2.0 * static_cast<double>(kRows * shape.n * shape.k);
      for (const LinearWeight* w : {&bf16, &w4a16}) {
        const double seconds = bench.time([&] { backend->linear(out, x, *w); });
        results.push_back(
            flop_entry(fmt::format("linear {} {} M={} N={} K={}", w->quantized() ? "W4A16 g32" : "BF16",
                                   shape.name, kRows, shape.n, shape.k),
                       flop, seconds));
      }
    }
    const Tensor conv_weight = bench.weight(DType::BF16, kConvDim, 4, -0.6f, 0.6f);
    const Tensor conv_state = bench.activation(kConvDim, 3, -1, 1);
    for (int64_t tokens : {kRows, int64_t{8192}}) {
      const Tensor qkvz = bench.activation(tokens, kConvDim + kValueDim, -1, 1);
      const Tensor conv = bench.activation(tokens, kConvDim, -1, 1);
      const double seconds = bench.time(
          [&] { backend->conv1d_silu(conv, qkvz.cols_view(0, kConvDim), conv_state, conv_weight, true); });
      results.push_back(entry(fmt::format("conv1d_silu T={} C={} K=4", tokens, kConvDim),
                              8.0 * static_cast<double>(tokens * kConvDim), seconds));
    }
    const Tensor gate_up = bench.activation(kRows, 2 * kFf, -1, 1);
    const Tensor act = bench.activation(kRows, kFf, -1, 1);
    results.push_back(entry(
        fmt::format("silu_mul [{}, {}]", kRows, kFf), 12.0 * static_cast<double>(kRows * kFf),
        bench.time([&] { backend->silu_mul(act, gate_up.cols_view(0, kFf), gate_up.cols_view(kFf, kFf)); })));
    const Tensor residual = bench.activation(kRows, kHidden, -1, 1);
    const Tensor delta = bench.activation(kRows, kHidden, -1e-3f, 1e-3f);
    const Tensor normed = bench.activation(kRows, kHidden, -1, 1);
    const Tensor norm_weight = bench.weight(DType::BF16, 1, kHidden, -0.5f, 0.5f);
    results.push_back(entry(
        fmt::format("add_rmsnorm [{}, {}]", kRows, kHidden), 16.0 * static_cast<double>(kRows * kHidden),
        bench.time([&] { backend->add_rmsnorm(normed, residual, delta, norm_weight, 1e-6f, true); })));
    const Tensor core = bench.activation(kRows, kValueDim, -1, 1);
    const Tensor z = bench.activation(kRows, kValueDim, -1, 1);
    const Tensor gated = bench.activation(kRows, kValueDim, -1, 1);
    const Tensor gdn_norm_weight = bench.weight(DType::F32, 1, 128, 0.5f, 1.5f);
    results.push_back(entry(fmt::format("gated_rmsnorm [{}, {}] group 128", kRows, kValueDim),
                            12.0 * static_cast<double>(kRows * kValueDim), bench.time([&] {
                              backend->gated_rmsnorm(gated, core, gdn_norm_weight, z, 1e-6f);
                            })));
  }

  write_report(out_path, properties, results);
  return 0;
}

}  // namespace
}  // namespace qspec

int main(int argc, char** argv) {
  const std::string_view scope_name = argc == 3 ? argv[2] : "all";
  const auto scope = scope_name == "all"               ? std::optional(qspec::BenchScope::All)
                     : scope_name == "linears"         ? std::optional(qspec::BenchScope::Linears)
                     : scope_name == "prefill-linears" ? std::optional(qspec::BenchScope::PrefillLinears)
                     : scope_name == "w4a16-launches"  ? std::optional(qspec::BenchScope::W4a16Launches)
                                                       : std::nullopt;
  if ((argc != 2 && argc != 3) || !scope) {
    std::cerr << "usage: qspec_cuda_bench OUT.json [linears|prefill-linears|w4a16-launches]\n";
    return 2;
  }
  try {
    return qspec::run(argv[1], *scope);
  } catch (const std::exception& e) {
    std::cerr << "qspec_cuda_bench: " << e.what() << "\n";
    return 1;
  }
}
