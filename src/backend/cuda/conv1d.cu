// Causal depthwise conv1d + SiLU with a rolling state of the previous K-1 inputs (PyTorch cross-correlation:
// weight[c][K-1] multiplies the current token). One thread per channel walks the T tokens in order, the
// window in registers (K is a template argument); the taps are summed in the CPU reference's order.
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 128;

template <typename W, int kKernel>
__global__ void conv1d_silu_kernel(float* out, int64_t out_stride, const float* x, int64_t x_stride,
                                   float* state, int64_t state_stride, const W* weight, int64_t weight_stride,
                                   int64_t channels, int64_t tokens, bool update_state) {
  constexpr int kHistory = kKernel - 1;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float taps[kKernel];
  float history[kHistory > 0 ? kHistory : 1];
#pragma unroll
  for (int j = 0; j < kKernel; ++j) taps[j] = to_float(weight[c * weight_stride + j]);
#pragma unroll
  for (int j = 0; j < kHistory; ++j) history[j] = state[c * state_stride + j];
  for (int64_t t = 0; t < tokens; ++t) {
    const float current = x[t * x_stride + c];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kHistory; ++j) sum += taps[j] * history[j];
    sum += taps[kHistory] * current;
#pragma unroll
    for (int j = 0; j + 1 < kHistory; ++j) history[j] = history[j + 1];
    if constexpr (kHistory > 0) history[kHistory - 1] = current;
    out[t * out_stride + c] = silu(sum);
  }
  if (!update_state) return;
#pragma unroll
  for (int j = 0; j < kHistory; ++j) state[c * state_stride + j] = history[j];
}

template <typename W, int kKernel>
cudaError_t launch_sized(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight,
                         bool update_state, cudaStream_t stream) {
  conv1d_silu_kernel<W, kKernel><<<grid_for(x.cols, kBlock), kBlock, 0, stream>>>(
      out.ptr<float>(), out.stride, x.ptr<const float>(), x.stride, state.ptr<float>(), state.stride,
      weight.ptr<const W>(), weight.stride, x.cols, x.rows, update_state);
  return cudaGetLastError();
}

template <typename W>
cudaError_t launch_any_size(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight,
                            bool update_state, cudaStream_t stream) {
  static_assert(kMaxConvKernel == 8, "one case per supported kernel size");
  switch (weight.cols) {
    case 1:
      return launch_sized<W, 1>(out, x, state, weight, update_state, stream);
    case 2:
      return launch_sized<W, 2>(out, x, state, weight, update_state, stream);
    case 3:
      return launch_sized<W, 3>(out, x, state, weight, update_state, stream);
    case 4:
      return launch_sized<W, 4>(out, x, state, weight, update_state, stream);
    case 5:
      return launch_sized<W, 5>(out, x, state, weight, update_state, stream);
    case 6:
      return launch_sized<W, 6>(out, x, state, weight, update_state, stream);
    case 7:
      return launch_sized<W, 7>(out, x, state, weight, update_state, stream);
    case 8:
      return launch_sized<W, 8>(out, x, state, weight, update_state, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_conv1d_silu(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight,
                               bool update_state, cudaStream_t stream) {
  if (x.cols == 0) return cudaSuccess;
  return with_weight_type(weight.dtype, [&](auto type) {
    return launch_any_size<decltype(type)>(out, x, state, weight, update_state, stream);
  });
}

}  // namespace qspec::cuda
