// RMSNorm over groups of columns (plain, zero-centered 1 + w), the gated form of the GDN output
// y = w * rmsnorm(x) * silu(z), and the residual form x += delta; y = rmsnorm(x) (one kernel instead of an
// add and a norm per residual connection). One block per (row, group); sum of squares in fp32.
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 256;

enum class NormInput { Plain, Gated, Residual };

// kResidual: x is updated in place (x += delta) before it is normalised; each thread reads back only the
// elements it wrote.
template <typename W, NormInput kInput>
__global__ void rmsnorm_kernel(float* out, int64_t out_stride, float* x, int64_t x_stride, const W* weight,
                               const float* z, int64_t z_stride, int64_t group, float eps,
                               float weight_offset) {
  constexpr bool kGated = kInput == NormInput::Gated;
  __shared__ float scratch[kBlock / kWarpSize];
  const int64_t t = blockIdx.y;
  const int64_t first = blockIdx.x * group;
  float* in = x + t * x_stride + first;
  if constexpr (kInput == NormInput::Residual) {
    const float* delta = z + t * z_stride + first;
    for (int64_t i = threadIdx.x; i < group; i += blockDim.x) in[i] = in[i] + delta[i];
  }
  float sum_of_squares = 0.0f;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) sum_of_squares += in[i] * in[i];
  sum_of_squares = block_sum(sum_of_squares, scratch);
  const float inverse_rms = 1.0f / sqrtf(sum_of_squares / static_cast<float>(group) + eps);
  float* y = out + t * out_stride + first;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) {
    const float scale = weight_offset + to_float(weight[i]);
    if constexpr (kGated)
      y[i] = scale * (in[i] * inverse_rms) * silu(z[t * z_stride + first + i]);
    else
      y[i] = in[i] * inverse_rms * scale;
  }
}

template <NormInput kInput>
cudaError_t launch_norm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& z, float eps,
                        bool unit_offset, cudaStream_t stream) {
  if (x.rows == 0 || x.cols == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(x.cols / weight.cols), static_cast<unsigned int>(x.rows));
  const float weight_offset = unit_offset ? 1.0f : 0.0f;
  return with_weight_type(weight.dtype, [&](auto type) {
    using W = decltype(type);
    rmsnorm_kernel<W, kInput><<<grid, kBlock, 0, stream>>>(
        out.ptr<float>(), out.stride, x.ptr<float>(), x.stride, weight.ptr<const W>(), z.ptr<const float>(),
        z.stride, weight.cols, eps, weight_offset);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t launch_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& z,
                           float eps, bool unit_offset, cudaStream_t stream) {
  if (z.empty()) return launch_norm<NormInput::Plain>(out, x, weight, z, eps, unit_offset, stream);
  return launch_norm<NormInput::Gated>(out, x, weight, z, eps, unit_offset, stream);
}

cudaError_t launch_add_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& delta, const Tensor& weight,
                               float eps, bool unit_offset, cudaStream_t stream) {
  return launch_norm<NormInput::Residual>(out, x, weight, delta, eps, unit_offset, stream);
}

}  // namespace qspec::cuda
