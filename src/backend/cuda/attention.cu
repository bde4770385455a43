// Causal attention of query rows over an F32 KV cache: query row t sees cache rows 0..positions[t]. One block
// per (query row, head); each warp takes every kWarps-th key, computes the score with its lanes along the
// head dims, and keeps an online softmax (running max, sum and weighted values) in fp32; the warps' partial
// results are merged in shared memory at the end.
#include <cmath>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kDimsPerLane = kMaxAttentionHeadDim / kWarpSize;

__global__ void attention_kernel(float* out, int64_t out_stride, const float* q, int64_t q_stride,
                                 const float* k_cache, int64_t k_stride, const float* v_cache,
                                 int64_t v_stride, int64_t cache_rows, const int32_t* positions,
                                 int64_t positions_stride, int num_heads, int heads_per_kv, int head_dim,
                                 float scale) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_total[kWarps];
  __shared__ float warp_acc[kWarps][kMaxAttentionHeadDim];
  const int64_t t = blockIdx.x / num_heads;
  const int head = static_cast<int>(blockIdx.x % num_heads);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  float* y = out + t * out_stride + static_cast<int64_t>(head) * head_dim;
  const int32_t position = positions[t * positions_stride];
  if (position < 0 || position >= cache_rows) {
    for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += blockDim.x) y[d] = NAN;
    return;
  }
  const int64_t keys = int64_t{position} + 1;
  const int64_t kv_offset = static_cast<int64_t>(head / heads_per_kv) * head_dim;
  const float* query = q + t * q_stride + static_cast<int64_t>(head) * head_dim;

  float query_values[kDimsPerLane];
  float acc[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    query_values[i] = d < head_dim ? query[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float running_max = -INFINITY, total = 0.0f;
  for (int64_t j = warp; j < keys; j += kWarps) {
    const float* key = k_cache + j * k_stride + kv_offset;
    const float* value = v_cache + j * v_stride + kv_offset;
    float partial = 0.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      if (d < head_dim) partial += query_values[i] * key[d];
    }
    const float score = warp_sum(partial) * scale;
    const float new_max = fmaxf(running_max, score);
    const float correction = expf(running_max - new_max);
    const float weight = expf(score - new_max);
    total = total * correction + weight;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + i * kWarpSize;
      acc[i] = acc[i] * correction + (d < head_dim ? weight * value[d] : 0.0f);
    }
    running_max = new_max;
  }
  if (lane == 0) {
    warp_max[warp] = running_max;
    warp_total[warp] = total;
  }
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < head_dim) warp_acc[warp][d] = acc[i];
  }
  __syncthreads();
  float block_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) block_max = fmaxf(block_max, warp_max[w]);
  float block_total = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (warp_total[w] > 0.0f) block_total += warp_total[w] * expf(warp_max[w] - block_max);
  for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (warp_total[w] > 0.0f) sum += warp_acc[w][d] * expf(warp_max[w] - block_max);
    y[d] = sum / block_total;
  }
}

}  // namespace

cudaError_t launch_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& positions, int num_heads, int num_kv_heads, int head_dim,
                             float scale, cudaStream_t stream) {
  if (q.rows == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned int>(q.rows * num_heads);
  attention_kernel<<<blocks, kWarps * kWarpSize, 0, stream>>>(
      out.ptr<float>(), out.stride, q.ptr<const float>(), q.stride, k_cache.ptr<const float>(),
      k_cache.stride, v_cache.ptr<const float>(), v_cache.stride, k_cache.rows,
      positions.ptr<const int32_t>(), positions.stride, num_heads, num_heads / num_kv_heads, head_dim, scale);
  return cudaGetLastError();
}

}  // namespace qspec::cuda
