// The many-row linear (prefill): out = x W^T as one cuBLAS BF16 matrix product with FP32 accumulation and
// output. x is rounded to BF16 and W4A16 weights are dequantized to BF16 in slices of rows, so the extra
// memory is bounded (max_slice_elements; by default every Qwen3.5-4B linear is one slice below 4,096 rows of
// x, and from there on slices stay within L2: gemm_linear.cpp). Tensor cores at
// this size reach most of the BF16 peak; the price is BF16 rounding of x and of the dequantized weights
// (relative error ~1e-3 of the largest output). A W4A16 weight's BF16 copy (LinearWeight::dequantized,
// made at load by dequantize(), CudaBackend::dequantized_copy) replaces the dequantization below
// kL2SliceMinRows rows of x: it was half of a 64-token prefill on the H200 (9.4 ms, against 5.2 with BF16
// weights). Without a copy (--bf16-copies off, or too little memory for it), fewer than kW4a16MaxRows rows
// take the W4A16 tensor-core kernel instead (launch_w4a16_gemm: the same products, no dequantization pass).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_resources.h"
#include "backend/cuda/launchers.h"
#include "backend/tensor.h"

namespace qspec::cuda {

class GemmLinear {
 public:
  // 64 Mi values: a 128 MiB BF16 scratch copy of the largest W4A16 weight that is dequantized at once.
  static constexpr int64_t kDefaultSliceElements = int64_t{64} << 20;
  // Below this many rows of x, W4A16 weights without a BF16 copy go to their own tensor-core kernel
  // (launch_w4a16_gemm) instead of being dequantized for cuBLAS. On the H200 (qspec_cuda_bench
  // prefill-linears, the 4B's four body shapes together, wgmma, 256-row blocks from 129 rows) the kernel
  // takes 0.34x the time of dequantize + cuBLAS at 64 rows, 0.48x at 128, 0.61x at 256, 0.82x at 512 and
  // 1,024 and 0.96x at 2,048 (the default prefill chunk; longer calls are not measured); cuBLAS on a kept
  // copy takes 1.06x the kernel's time at 64 rows and 0.69-0.88x from 128, so a copy, where there is one, is
  // used instead.
  static constexpr int64_t kW4a16MaxRows = 2049;
  // max_slice_elements: at most this many dequantized values at a time (a smaller bound tests the slicing);
  // w4a16_max_rows: calls with fewer rows of x take the W4A16 kernel (0: never; benchmarks compare the
  // paths).
  explicit GemmLinear(int64_t max_slice_elements = kDefaultSliceElements,
                      int64_t w4a16_max_rows = kW4a16MaxRows);
  ~GemmLinear();
  GemmLinear(const GemmLinear&) = delete;
  GemmLinear& operator=(const GemmLinear&) = delete;

  // Dense BF16 or W4A16 weights (others are not taken: supports()).
  static bool supports(const LinearWeight& w);
  // W4A16 w dequantized to BF16 [w.out_features, w.in_features] (contiguous) at out.
  static void dequantize(void* out, const LinearWeight& w, cudaStream_t stream);
  // out = g(x, y) W^T with g one of RowGate's (launchers.h: x itself for None, y then unused; silu_mul for
  // the gated MLP's down projection, x * sigmoid(y) for the gated attention's output) and y's rows at x's row
  // stride: g is applied, as the elementwise op applies it, by the pass that rounds x to BF16, so g(x, y) is
  // neither stored in F32 nor read back (the same values as linear after the elementwise op). Scratch grows
  // here (a step's first, unrecorded run); a recorded step reuses it.
  void run(const Tensor& out, const Tensor& x, const float* y, RowGate gate, const LinearWeight& w,
           cudaStream_t stream);
  // Two weights against the same x (out_a = x w_a^T, out_b = x w_b^T): x is rounded to BF16 once.
  void run_pair(const Tensor& out_a, const LinearWeight& w_a, const Tensor& out_b, const LinearWeight& w_b,
                const Tensor& x, cudaStream_t stream);
  // For x made in BF16 by a kernel of the caller (the norms before the linears: launch_rmsnorm_to_bf16): the
  // scratch it writes x [rows, cols] into (contiguous), after which multiply() takes it. Binds cuBLAS to the
  // stream.
  void* operand(int64_t rows, int64_t cols, cudaStream_t stream);
  // out = x W^T for x_bf16 [out.rows, w.in_features] in operand()'s scratch.
  void multiply(const Tensor& out, const void* x_bf16, const LinearWeight& w, cudaStream_t stream);
  // Counts the reallocations of the scratch buffers (step graphs recorded before one are stale).
  uint64_t scratch_generation() const { return scratch_generation_; }

 private:
  void* scratch(DeviceMemory& memory, size_t bytes);
  // g(x, y) [M, k] (launch_rows_to_bf16) rounded to BF16 in operand()'s scratch.
  const void* x_to_bf16(const Tensor& x, const float* y, RowGate gate, cudaStream_t stream);

  int64_t max_slice_elements_;
  int64_t w4a16_max_rows_;  // fewer rows of x than this take launch_w4a16_gemm (W4A16 weights, no copy)
  cublasHandle_t handle_ = nullptr;
  DeviceMemory cublas_workspace_, x_bf16_, weight_bf16_, w4a16_workspace_;
  uint64_t scratch_generation_ = 0;
};

}  // namespace qspec::cuda
