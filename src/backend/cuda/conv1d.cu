// Causal depthwise conv1d + SiLU with a rolling state of the previous K-1 inputs (PyTorch cross-correlation:
// weight[c][K-1] multiplies the current token); the taps are summed in the CPU reference's order. K is a
// template argument, the window lives in registers.
//
// Many tokens (prefill): one thread per (channel, kTokensPerThread consecutive tokens), so that every token
// runs in parallel and the kernel moves bytes at the bandwidth limit. A warp spans 32 consecutive channels
// of the same tokens (128-byte loads and stores). In place (out = x) a thread's outputs would overwrite the
// inputs of the next token group's history, so that case walks the tokens of a channel in one thread.
#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 128;
// At least kMaxConvKernel - 1, so that only the first token group reaches back into the state.
constexpr int kTokensPerThread = 8;
static_assert(kTokensPerThread >= kMaxConvKernel - 1, "only token group 0 may read the state");

// Grid (token groups, channel blocks). The state is read and written only by the threads of token group 0
// (blockIdx.x == 0), each for its own channel, so no other thread races with the update.
template <typename W, int kKernel>
__global__ void conv1d_silu_kernel(float* out, int64_t out_stride, const float* x, int64_t x_stride,
                                   float* state, int64_t state_stride, const W* weight, int64_t weight_stride,
                                   int64_t channels, int64_t tokens, bool update_state) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int kHistory = kKernel - 1;
  constexpr int kWindow = kHistory + kTokensPerThread;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kBlock + threadIdx.x;
  if (c >= channels) return;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kTokensPerThread;
  const float* channel_state = state + c * state_stride;
  // window[i]: the input of token first - kHistory + i; token -m is the state's column kHistory - m.
  float window[kWindow];
#pragma unroll
  for (int i = 0; i < kWindow; ++i) {
    const int64_t t = first - kHistory + i;
    window[i] = t < 0 ? channel_state[kHistory + t] : (t < tokens ? x[t * x_stride + c] : 0.0f);
  }
  float taps[kKernel];
#pragma unroll
  for (int j = 0; j < kKernel; ++j) taps[j] = to_float(weight[c * weight_stride + j]);
#pragma unroll
  for (int u = 0; u < kTokensPerThread; ++u) {
    if (first + u >= tokens) break;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kKernel; ++j) sum += taps[j] * window[u + j];
    out[(first + u) * out_stride + c] = silu(sum);
  }
  if (!update_state || blockIdx.x != 0) return;
  // The new state: the inputs of tokens T - kHistory .. T - 1 (some still the old state's when T < kHistory),
  // all read before any is written.
  float next_state[kHistory > 0 ? kHistory : 1];
#pragma unroll
  for (int j = 0; j < kHistory; ++j) {
    const int64_t t = tokens - kHistory + j;
    next_state[j] = t < 0 ? channel_state[kHistory + t] : x[t * x_stride + c];
  }
#pragma unroll
  for (int j = 0; j < kHistory; ++j) state[c * state_stride + j] = next_state[j];
}

// out aliases x: one thread per channel walks the T tokens in order, reading each token's input before it
// writes that token's output.
template <typename W, int kKernel>
__global__ void conv1d_silu_in_place_kernel(float* out, int64_t out_stride, const float* x, int64_t x_stride,
                                            float* state, int64_t state_stride, const W* weight,
                                            int64_t weight_stride, int64_t channels, int64_t tokens,
                                            bool update_state) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int kHistory = kKernel - 1;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float taps[kKernel];
  float history[kHistory > 0 ? kHistory : 1];
#pragma unroll
  for (int j = 0; j < kKernel; ++j) taps[j] = to_float(weight[c * weight_stride + j]);
#pragma unroll
  for (int j = 0; j < kHistory; ++j) history[j] = state[c * state_stride + j];
  for (int64_t t = 0; t < tokens; ++t)
    out[t * out_stride + c] = conv_silu_step(taps, history, x[t * x_stride + c]);
  if (!update_state) return;
#pragma unroll
  for (int j = 0; j < kHistory; ++j) state[c * state_stride + j] = history[j];
}

template <typename W, int kKernel>
cudaError_t launch_sized(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight,
                         bool update_state, cudaStream_t stream) {
  if (out.overlaps(x)) {
    return launch_kernel(conv1d_silu_in_place_kernel<W, kKernel>, grid_for(x.cols, kBlock), kBlock, 0, stream,
                         out.ptr<float>(), out.stride, x.ptr<const float>(), x.stride, state.ptr<float>(),
                         state.stride, weight.ptr<const W>(), weight.stride, x.cols, x.rows, update_state);
  }
  const dim3 grid(static_cast<unsigned>((x.rows + kTokensPerThread - 1) / kTokensPerThread),
                  static_cast<unsigned>((x.cols + kBlock - 1) / kBlock));
  return launch_kernel(conv1d_silu_kernel<W, kKernel>, grid, kBlock, 0, stream, out.ptr<float>(), out.stride,
                       x.ptr<const float>(), x.stride, state.ptr<float>(), state.stride,
                       weight.ptr<const W>(), weight.stride, x.cols, x.rows, update_state);
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
  if (x.cols == 0 || x.rows == 0) return cudaSuccess;
  return with_weight_type(weight.dtype, [&](auto type) {
    return launch_any_size<decltype(type)>(out, x, state, weight, update_state, stream);
  });
}

}  // namespace qspec::cuda
