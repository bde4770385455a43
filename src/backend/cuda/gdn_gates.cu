// Gated DeltaNet gates, one thread per (token, value head): beta = sigmoid(b), g = -exp(a_log) * softplus(a +
// dt_bias).
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 256;

template <typename LogRate, typename Bias>
__global__ void gdn_gates_kernel(float* beta, int64_t beta_stride, float* g, int64_t g_stride, const float* b,
                                 int64_t b_stride, const float* a, int64_t a_stride, const LogRate* a_log,
                                 const Bias* dt_bias, int64_t rows, int64_t heads) {
  const int64_t count = rows * heads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / heads, h = i % heads;
    beta[t * beta_stride + h] = sigmoid(b[t * b_stride + h]);
    const float decay_rate = -expf(to_float(a_log[h]));
    g[t * g_stride + h] = decay_rate * softplus(a[t * a_stride + h] + to_float(dt_bias[h]));
  }
}

}  // namespace

cudaError_t launch_gdn_gates(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                             const Tensor& a_log, const Tensor& dt_bias, cudaStream_t stream) {
  if (b.numel() == 0) return cudaSuccess;
  return with_weight_type(a_log.dtype, [&](auto log_rate_type) {
    return with_weight_type(dt_bias.dtype, [&](auto bias_type) {
      using LogRate = decltype(log_rate_type);
      using Bias = decltype(bias_type);
      gdn_gates_kernel<LogRate, Bias><<<grid_for(b.numel(), kBlock), kBlock, 0, stream>>>(
          beta.ptr<float>(), beta.stride, g.ptr<float>(), g.stride, b.ptr<const float>(), b.stride,
          a.ptr<const float>(), a.stride, a_log.ptr<const LogRate>(), dt_bias.ptr<const Bias>(), b.rows,
          b.cols);
      return cudaGetLastError();
    });
  });
}

}  // namespace qspec::cuda
