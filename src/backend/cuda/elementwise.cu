// Elementwise ops on F32 activations (add, silu_mul, sigmoid_mul) and the per-head query/gate split. Rows may
// be strided; out may alias an input (each element is read before it is written, by the same thread).
#include <cstdint>
#include <utility>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/split_sums.cuh"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 256;
// add / silu_mul / sigmoid_mul: a block covers kRowBlock * kRowColumns columns of a row.
constexpr int kRowBlock = 128;
constexpr int kRowColumns = 4;

template <Elementwise kOp>
__device__ inline float combine(float a, float b) {
  if constexpr (kOp == Elementwise::Add)
    return a + b;
  else if constexpr (kOp == Elementwise::SiluMul)
    return silu_mul(a, b);
  else
    return a * sigmoid(b);
}

// Grid (column blocks, rows; rows beyond grid.y's limit in strides): no division per element. kAligned:
// every row of the three views 16-byte aligned and a multiple of 4 columns (float4 loads and stores).
// kSplits (aligned only): a's and b's values are their split partials' sums, stored into a and b too.
template <Elementwise kOp, bool kAligned, bool kSplits>
__global__ void elementwise_kernel(float* out, int64_t out_stride, float* a, int64_t a_stride, float* b,
                                   int64_t b_stride, int64_t rows, int cols, UnsummedSplits a_splits,
                                   UnsummedSplits b_splits) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int c = (static_cast<int>(blockIdx.x) * kRowBlock + static_cast<int>(threadIdx.x)) * kRowColumns;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float* a_row = a + r * a_stride + c;
    float* b_row = b + r * b_stride + c;
    float* out_row = out + r * out_stride + c;
    if constexpr (kSplits) {
      const float4 va = sum4_in_split_order(a_splits, r, c);
      const float4 vb = sum4_in_split_order(b_splits, r, c);
      *reinterpret_cast<float4*>(a_row) = va;
      *reinterpret_cast<float4*>(b_row) = vb;
      *reinterpret_cast<float4*>(out_row) = make_float4(combine<kOp>(va.x, vb.x), combine<kOp>(va.y, vb.y),
                                                        combine<kOp>(va.z, vb.z), combine<kOp>(va.w, vb.w));
    } else if constexpr (kAligned) {
      const float4 va = *reinterpret_cast<const float4*>(a_row);
      const float4 vb = *reinterpret_cast<const float4*>(b_row);
      *reinterpret_cast<float4*>(out_row) = make_float4(combine<kOp>(va.x, vb.x), combine<kOp>(va.y, vb.y),
                                                        combine<kOp>(va.z, vb.z), combine<kOp>(va.w, vb.w));
    } else {
      for (int i = 0; i < kRowColumns && c + i < cols; ++i) out_row[i] = combine<kOp>(a_row[i], b_row[i]);
    }
  }
}

// qg row: per head h, head_dim query values then head_dim gate values.
__global__ void split_query_gate_kernel(float* query, int64_t query_stride, float* gate, int64_t gate_stride,
                                        const float* qg, int64_t qg_stride, int64_t rows, int64_t half_cols,
                                        int head_dim) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t count = rows * half_cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / half_cols, c = i % half_cols;
    const int64_t head = c / head_dim, d = c % head_dim;
    const float* pair = qg + r * qg_stride + 2 * head * head_dim;
    query[r * query_stride + c] = pair[d];
    gate[r * gate_stride + c] = pair[head_dim + d];
  }
}

template <Elementwise kOp>
cudaError_t launch_op(const Tensor& out, const Tensor& a, const Tensor& b, const UnsummedSplits& a_splits,
                      const UnsummedSplits& b_splits, cudaStream_t stream) {
  constexpr int kColumnsPerBlock = kRowBlock * kRowColumns;
  const dim3 grid = column_blocks_by_rows(a.rows, a.cols, kColumnsPerBlock);
  const bool aligned = a.cols % kRowColumns == 0 && rows_aligned_to_float4(out) &&
                       rows_aligned_to_float4(a) && rows_aligned_to_float4(b);
  const int cols = static_cast<int>(a.cols);
  const auto launch = [&](auto kernel, const UnsummedSplits& a_source, const UnsummedSplits& b_source) {
    return launch_kernel(kernel, grid, kRowBlock, 0, stream, out.ptr<float>(), out.stride, a.ptr<float>(),
                         a.stride, b.ptr<float>(), b.stride, a.rows, cols, a_source, b_source);
  };
  if (a_splits.any() && b_splits.any() && a_splits.splits == b_splits.splits && aligned &&
      a_splits.float4_aligned() && b_splits.float4_aligned())
    return launch(elementwise_kernel<kOp, true, true>, a_splits, b_splits);
  // Otherwise the sums kernel stores the values first.
  for (const auto& [values, splits] : {std::pair{a, a_splits}, std::pair{b, b_splits}})
    if (splits.any()) {
      const cudaError_t status = launch_split_partial_sums(values, splits, stream);
      if (status != cudaSuccess) return status;
    }
  return launch(aligned ? elementwise_kernel<kOp, true, false> : elementwise_kernel<kOp, false, false>,
                UnsummedSplits{}, UnsummedSplits{});
}

}  // namespace

cudaError_t launch_elementwise(Elementwise op, const Tensor& out, const Tensor& a, const Tensor& b,
                               cudaStream_t stream, const UnsummedSplits& a_splits,
                               const UnsummedSplits& b_splits) {
  if (a.numel() == 0) return cudaSuccess;
  switch (op) {
    case Elementwise::Add:
      return launch_op<Elementwise::Add>(out, a, b, a_splits, b_splits, stream);
    case Elementwise::SiluMul:
      return launch_op<Elementwise::SiluMul>(out, a, b, a_splits, b_splits, stream);
    case Elementwise::SigmoidMul:
      return launch_op<Elementwise::SigmoidMul>(out, a, b, a_splits, b_splits, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_split_query_gate(const Tensor& query, const Tensor& gate, const Tensor& qg, int head_dim,
                                    cudaStream_t stream) {
  if (query.numel() == 0) return cudaSuccess;
  return launch_kernel(split_query_gate_kernel, grid_for(query.numel(), kBlock), kBlock, 0, stream,
                       query.ptr<float>(), query.stride, gate.ptr<float>(), gate.stride,
                       qg.ptr<const float>(), qg.stride, qg.rows, query.cols, head_dim);
}

}  // namespace qspec::cuda
