// Causal attention of query rows over an F32 KV cache: query row t sees cache rows 0..positions[t]. One block
// per (query row, head) of kWarps warps; each warp takes groups of kKeysPerStep consecutive keys (every
// kWarps-th group), computes their scores with its lanes along the head dims (several independent loads and
// reductions in flight), and keeps an online softmax (running max, sum and weighted values) in fp32; the
// warps' partial results are merged in shared memory at the end.
#include <cmath>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 16;
constexpr int kKeysPerStep = 4;
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
  for (int64_t first = int64_t{warp} * kKeysPerStep; first < keys; first += kWarps * kKeysPerStep) {
    float scores[kKeysPerStep];
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      float partial = 0.0f;
      if (first + u < keys) {
        const float* key = k_cache + (first + u) * k_stride + kv_offset;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) {
          const int d = lane + i * kWarpSize;
          if (d < head_dim) partial += query_values[i] * key[d];
        }
      }
      scores[u] = partial;
    }
    // The group's first key exists, so new_max is finite; missing keys get weight exp(-inf) = 0.
    float new_max = running_max;
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      scores[u] = first + u < keys ? warp_sum(scores[u]) * scale : -INFINITY;
      new_max = fmaxf(new_max, scores[u]);
    }
    const float correction = expf(running_max - new_max);
    total *= correction;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[i] *= correction;
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      if (first + u >= keys) break;
      const float weight = expf(scores[u] - new_max);
      total += weight;
      const float* value = v_cache + (first + u) * v_stride + kv_offset;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + i * kWarpSize;
        if (d < head_dim) acc[i] += weight * value[d];
      }
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
