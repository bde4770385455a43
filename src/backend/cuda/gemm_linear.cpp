#include "backend/cuda/gemm_linear.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"
#include "core/error.h"

namespace qspec::cuda {

namespace {

// A slice of a larger weight is a whole number of this many rows, so that its output columns start 1 KiB
// aligned and its N is a multiple of cuBLAS's tiles. Slices of 13107 rows (odd N, the second slice's output
// only 4-byte aligned) made cuBLAS fall back to its generic kernel (`Kernel2`), ~3x slower than the nvjet
// kernels it picks for the same product on BF16 weights.
constexpr int64_t kSliceRowMultiple = 256;
// Rows of a slice ride on grid.y of the dequantizing kernel.
constexpr int64_t kMaxSliceRows = 65535 / kSliceRowMultiple * kSliceRowMultiple;
// cuBLAS's own workspace, fixed so that recorded step graphs never see it reallocated.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
constexpr size_t kBf16Bytes = 2;
// From this many rows of x on, W4A16 weights are dequantized in slices of at most kL2SliceElements values
// (32 MB of BF16, well within the H200's L2): cuBLAS reads each weight once per row tile of x, and those
// reads then hit L2 (prefill of 8,192 tokens 168 -> 162 ms); with fewer rows the smaller products lost
// more than that (2,048 tokens: 41.7 -> 43.4 ms; session 9).
constexpr int64_t kL2SliceMinRows = 4096;
constexpr int64_t kL2SliceElements = int64_t{16} << 20;

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: {}: {}", what, cublasGetStatusString(status));
}

// Row-major out [M, N] = x [M, K] W^T is column-major out^T [N, M] = W^T^T x^T: W is stored as a column-major
// K x N matrix (transposed by cuBLAS) and x as K x M.
void bf16_gemm(cublasHandle_t handle, const Tensor& out, const void* x_bf16, const void* weight,
               int64_t weight_stride, int64_t k) {
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out.cols),
                            static_cast<int>(out.rows), static_cast<int>(k), &one, weight, CUDA_R_16BF,
                            static_cast<int>(weight_stride), x_bf16, CUDA_R_16BF, static_cast<int>(k), &zero,
                            out.data, CUDA_R_32F, static_cast<int>(out.rows <= 1 ? out.cols : out.stride),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace

GemmLinear::GemmLinear(int64_t max_slice_elements, int64_t w4a16_max_rows)
    : max_slice_elements_(max_slice_elements),
      w4a16_max_rows_(w4a16_max_rows),
      cublas_workspace_(kCublasWorkspaceBytes) {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
}

GemmLinear::~GemmLinear() {
  static_cast<void>(cublasDestroy(handle_));
}

bool GemmLinear::supports(const LinearWeight& w) {
  return w.quantized() || w.weight.dtype == DType::BF16;
}

void GemmLinear::dequantize(void* out, const LinearWeight& w, cudaStream_t stream) {
  for (int64_t first = 0; first < w.out_features; first += kMaxSliceRows) {
    const int64_t rows = std::min(kMaxSliceRows, w.out_features - first);
    check_cuda(launch_dequantize_w4a16(static_cast<char*>(out) + first * w.in_features * kBf16Bytes, w, first,
                                       rows, stream),
               "W4A16 weight to BF16");
  }
}

void* GemmLinear::scratch(DeviceMemory& memory, size_t bytes) {
  if (bytes > memory.bytes()) {
    memory = DeviceMemory(bytes);
    ++scratch_generation_;
  }
  return memory.data();
}

void GemmLinear::run(const Tensor& out, const Tensor& x, const float* y, RowGate gate, const LinearWeight& w,
                     cudaStream_t stream) {
  multiply(out, x_to_bf16(x, y, gate, stream), w, stream);
}

void GemmLinear::run_pair(const Tensor& out_a, const LinearWeight& w_a, const Tensor& out_b,
                          const LinearWeight& w_b, const Tensor& x, cudaStream_t stream) {
  const void* x_bf16 = x_to_bf16(x, nullptr, RowGate::None, stream);
  multiply(out_a, x_bf16, w_a, stream);
  multiply(out_b, x_bf16, w_b, stream);
}

void* GemmLinear::operand(int64_t rows, int64_t cols, cudaStream_t stream) {
  check_cublas(cublasSetStream(handle_, stream), "cublasSetStream");
  check_cublas(cublasSetWorkspace(handle_, cublas_workspace_.data(), cublas_workspace_.bytes()),
               "cublasSetWorkspace");
  return scratch(x_bf16_, static_cast<size_t>(rows * cols) * kBf16Bytes);
}

const void* GemmLinear::x_to_bf16(const Tensor& x, const float* y, RowGate gate, cudaStream_t stream) {
  void* x_bf16 = operand(x.rows, x.cols, stream);
  check_cuda(launch_rows_to_bf16(x_bf16, x, y, gate, stream), "linear (x to BF16)");
  return x_bf16;
}

void GemmLinear::multiply(const Tensor& out, const void* x_bf16, const LinearWeight& w, cudaStream_t stream) {
  const int64_t k = w.in_features;
  // Without a BF16 copy, few rows take the W4A16 kernel (it reads a quarter of the bytes the dequantization
  // writes and cuBLAS reads back); with one, cuBLAS on the copy is faster (kW4a16MaxRows, gemm_linear.h).
  if (w.dequantized.empty() && out.rows < w4a16_max_rows_ && w4a16_gemm_supports(w)) {
    const size_t bytes = w4a16_gemm_workspace_bytes(out.rows, w);
    void* workspace = bytes > 0 ? scratch(w4a16_workspace_, bytes) : nullptr;
    check_cuda(launch_w4a16_gemm(out, x_bf16, w, workspace, stream), "linear (W4A16 tensor cores)");
    return;
  }
  // BF16 weights, or a W4A16 weight's kept BF16 copy: from kL2SliceMinRows rows on, the slices that stay in
  // L2 are faster than the copy (prefill of 8,192 tokens: 141-147 ms with W4A16 weights, 150-152 with BF16
  // ones; session 10).
  const Tensor* bf16 = !w.quantized()                                         ? &w.weight
                       : !w.dequantized.empty() && out.rows < kL2SliceMinRows ? &w.dequantized
                                                                              : nullptr;
  if (bf16 != nullptr) {
    bf16_gemm(handle_, out, x_bf16, bf16->data, bf16->rows <= 1 ? k : bf16->stride, k);
    return;
  }
  // The whole weight when it fits the slice bound (below kL2SliceMinRows rows, the Qwen3.5-4B's largest,
  // gate|up, 18432 x 2560 = 47M values, does), else slices of a whole number of kSliceRowMultiple rows.
  const int64_t slice_elements =
      out.rows >= kL2SliceMinRows ? std::min(max_slice_elements_, kL2SliceElements) : max_slice_elements_;
  const int64_t rows_that_fit =
      std::min(kMaxSliceRows, slice_elements / k) / kSliceRowMultiple * kSliceRowMultiple;
  const int64_t slice_rows = std::min(w.out_features, std::max(kSliceRowMultiple, rows_that_fit));
  void* weight_bf16 = scratch(weight_bf16_, static_cast<size_t>(slice_rows * k) * kBf16Bytes);
  for (int64_t first = 0; first < w.out_features; first += slice_rows) {
    const int64_t rows = std::min(slice_rows, w.out_features - first);
    check_cuda(launch_dequantize_w4a16(weight_bf16, w, first, rows, stream), "linear (W4A16 to BF16)");
    bf16_gemm(handle_, out.cols_view(first, rows), x_bf16, weight_bf16, k, k);
  }
}

}  // namespace qspec::cuda
