// argmax over the rows of logits in two stages, so that a 248k-wide row is read by many blocks at once: one
// block per (row, slice of kSliceWidth columns) finds its slice's best candidate, then one warp per row
// combines the slices' candidates. "Best" is a total order (NaN above every number, then the larger value,
// then the lower index), so the result is the CPU rule's (backend/argmax.h) in any order of combination.
#include <climits>
#include <cmath>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kSliceWidth = 8192;  // 32 columns per thread

struct Candidate {
  float value;
  int32_t index;
};

// Stands for no column: loses to every real candidate (a real -inf has a lower index).
__device__ Candidate no_candidate() {
  return {-INFINITY, INT_MAX};
}

__device__ bool better(Candidate a, Candidate b) {
  const bool a_nan = isnan(a.value), b_nan = isnan(b.value);
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

__device__ Candidate warp_best(Candidate c) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const Candidate other{__shfl_xor_sync(0xffffffffu, c.value, offset),
                          __shfl_xor_sync(0xffffffffu, c.index, offset)};
    if (better(other, c)) c = other;
  }
  return c;
}

__global__ void argmax_slices_kernel(Candidate* partials, const float* logits, int64_t stride, int64_t cols) {
  wait_for_previous_kernel();
  allow_next_kernel();
  __shared__ Candidate warp_results[kThreads / kWarpSize];
  const int64_t row = blockIdx.y;
  const float* x = logits + row * stride;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSliceWidth;
  const int64_t end = begin + kSliceWidth < cols ? begin + kSliceWidth : cols;
  Candidate best = no_candidate();
#pragma unroll 8
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const Candidate c{x[i], static_cast<int32_t>(i)};
    if (better(c, best)) best = c;
  }
  best = warp_best(best);
  if (threadIdx.x % kWarpSize == 0) warp_results[threadIdx.x / kWarpSize] = best;
  __syncthreads();
  if (threadIdx.x >= kWarpSize) return;
  best = threadIdx.x < kThreads / kWarpSize ? warp_results[threadIdx.x] : no_candidate();
  best = warp_best(best);
  if (threadIdx.x == 0) partials[row * gridDim.x + blockIdx.x] = best;
}

__global__ void argmax_combine_kernel(int32_t* out_ids, int64_t out_stride, const Candidate* partials,
                                      int slices) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t row = blockIdx.x;
  Candidate best = no_candidate();
  for (int s = static_cast<int>(threadIdx.x); s < slices; s += kWarpSize) {
    const Candidate c = partials[row * slices + s];
    if (better(c, best)) best = c;
  }
  best = warp_best(best);
  if (threadIdx.x == 0) out_ids[row * out_stride] = best.index;
}

int slices_of(int64_t cols) {
  return static_cast<int>((cols + kSliceWidth - 1) / kSliceWidth);
}

}  // namespace

size_t argmax_workspace_bytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>(rows) * static_cast<size_t>(slices_of(cols)) * sizeof(Candidate);
}

cudaError_t launch_argmax(const Tensor& out_ids, const Tensor& logits, void* workspace, cudaStream_t stream) {
  if (logits.rows == 0) return cudaSuccess;
  const int slices = slices_of(logits.cols);
  auto* partials = static_cast<Candidate*>(workspace);
  const cudaError_t status = launch_kernel(
      argmax_slices_kernel, dim3(static_cast<unsigned>(slices), static_cast<unsigned>(logits.rows)), kThreads,
      0, stream, partials, logits.ptr<float>(), logits.stride, logits.cols);
  if (status != cudaSuccess) return status;
  return launch_kernel(argmax_combine_kernel, static_cast<unsigned>(logits.rows), kWarpSize, 0, stream,
                       out_ids.ptr<int32_t>(), out_ids.stride, partials, slices);
}

}  // namespace qspec::cuda
