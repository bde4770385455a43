// Attention of query rows over explicit ranges of cache rows [key_begin, key_end) with no other mask (the
// DFlash drafter's block). One block per (query row, head) walks its keys in tiles of kThreads with an online
// softmax in fp32: each thread scores one key of the tile, then owns output dims d and d + kThreads.
#include <cmath>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kThreads = 128;
static_assert(2 * kThreads >= kMaxAttentionHeadDim, "two output dims per thread");

__device__ float block_max(float v, float* scratch) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float result = -INFINITY;
  for (int w = 0; w < kThreads / kWarpSize; ++w) result = fmaxf(result, scratch[w]);
  __syncthreads();
  return result;
}

__global__ void windowed_attention_kernel(float* out, int64_t out_stride, const float* q, int64_t q_stride,
                                          const float* k_cache, int64_t k_stride, const float* v_cache,
                                          int64_t v_stride, const int32_t* key_begin, const int32_t* key_end,
                                          int64_t cache_rows, int heads_per_kv, int head_dim, float scale) {
  wait_for_previous_kernel();
  allow_next_kernel();
  extern __shared__ float shared[];
  float* query = shared;                // [head_dim]
  float* weights = query + head_dim;    // [kThreads]
  float* scratch = weights + kThreads;  // [kThreads / kWarpSize]
  const int64_t row = blockIdx.x;
  const int head = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  float* out_row = out + row * out_stride + static_cast<int64_t>(head) * head_dim;
  const int64_t begin = key_begin[row], end = key_end[row];
  if (begin < 0 || begin >= end || end > cache_rows) {  // the same for every thread of the block
    for (int d = tid; d < head_dim; d += kThreads) out_row[d] = NAN;
    return;
  }
  const float* q_row = q + row * q_stride + static_cast<int64_t>(head) * head_dim;
  for (int d = tid; d < head_dim; d += kThreads) query[d] = q_row[d];
  __syncthreads();

  const int64_t kv_offset = static_cast<int64_t>(head / heads_per_kv) * head_dim;
  float running_max = -INFINITY, running_sum = 0.0f;
  float acc[2] = {0.0f, 0.0f};
  for (int64_t tile = begin; tile < end; tile += kThreads) {
    const int64_t key = tile + tid;
    float score = -INFINITY;
    if (key < end) {
      const float* k_row = k_cache + key * k_stride + kv_offset;
      float dot = 0.0f;
      for (int d = 0; d < head_dim; ++d) dot += query[d] * k_row[d];
      score = dot * scale;
    }
    const float new_max = fmaxf(running_max, block_max(score, scratch));
    const float weight = key < end ? expf(score - new_max) : 0.0f;
    weights[tid] = weight;
    const float correction = expf(running_max - new_max);
    running_sum = running_sum * correction + block_sum(weight, scratch);  // its barrier publishes weights
    const int64_t count = end - tile < kThreads ? end - tile : kThreads;
    for (int i = 0; i < 2; ++i) {
      const int d = tid + i * kThreads;
      if (d >= head_dim) continue;
      float a = acc[i] * correction;
      for (int64_t j = 0; j < count; ++j) a += weights[j] * v_cache[(tile + j) * v_stride + kv_offset + d];
      acc[i] = a;
    }
    running_max = new_max;
    __syncthreads();  // weights is rewritten by the next tile
  }
  for (int i = 0; i < 2; ++i) {
    const int d = tid + i * kThreads;
    if (d < head_dim) out_row[d] = acc[i] / running_sum;
  }
}

}  // namespace

cudaError_t launch_windowed_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                      const Tensor& v_cache, const Tensor& key_begin, const Tensor& key_end,
                                      int num_heads, int num_kv_heads, int head_dim, float scale,
                                      cudaStream_t stream) {
  if (q.rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(q.rows), static_cast<unsigned int>(num_heads));
  const size_t shared = sizeof(float) * (static_cast<size_t>(head_dim) + kThreads + kThreads / kWarpSize);
  return launch_kernel(windowed_attention_kernel, grid, kThreads, shared, stream, out.ptr<float>(),
                       out.stride, q.ptr<const float>(), q.stride, k_cache.ptr<const float>(), k_cache.stride,
                       v_cache.ptr<const float>(), v_cache.stride, key_begin.ptr<const int32_t>(),
                       key_end.ptr<const int32_t>(), k_cache.rows, num_heads / num_kv_heads, head_dim, scale);
}

}  // namespace qspec::cuda
