// Rotary position embedding in place, NeoX (rotate-half) pairing (i, i + rotary_dim / 2) over the first
// rotary_dim dims of each head. The frequencies come from the host (the CPU reference's own fp32 formula), so
// angle = float(position) * inv_freq[i] is the same fp32 product on both backends.
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 256;

__global__ void rope_kernel(float* x, int64_t x_stride, const int32_t* positions, int64_t positions_stride,
                            int64_t rows, int64_t heads, int head_dim, int half,
                            RopeFrequencies frequencies) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t count = rows * heads * half;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / (heads * half);
    const int64_t head = (i / half) % heads;
    const int pair = static_cast<int>(i % half);
    const float angle = static_cast<float>(positions[t * positions_stride]) * frequencies.inv_freq[pair];
    const float cos_angle = cosf(angle), sin_angle = sinf(angle);
    float* v = x + t * x_stride + head * head_dim;
    const float x1 = v[pair], x2 = v[pair + half];
    v[pair] = x1 * cos_angle - x2 * sin_angle;
    v[pair + half] = x2 * cos_angle + x1 * sin_angle;
  }
}

}  // namespace

cudaError_t launch_rope(const Tensor& x, const Tensor& positions, int head_dim, int rotary_dim,
                        const RopeFrequencies& frequencies, cudaStream_t stream) {
  const int half = rotary_dim / 2;
  const int64_t heads = x.cols / head_dim;
  const int64_t count = x.rows * heads * half;
  if (count == 0) return cudaSuccess;
  return launch_kernel(rope_kernel, grid_for(count, kBlock), kBlock, 0, stream, x.ptr<float>(), x.stride,
                       positions.ptr<const int32_t>(), positions.stride, x.rows, heads, head_dim, half,
                       frequencies);
}

}  // namespace qspec::cuda
