// Attention of query rows over explicit ranges of cache rows [key_begin, key_end) with no other mask, for
// calls of more than 64 query rows per KV head (fewer run the attention kernels with first keys). One block
// per (query row, head); each of its warps walks every kWarps-th group of kKeysInFlight keys with an online
// softmax in fp32, a lane holding dims lane, lane + 32, ... (coalesced loads of a key's row, the dot product
// summed by shuffles), the loads of a group's keys and values issued together; the warps' softmax states are
// merged at the end. (A thread per key, walking a key's dims one by one, took 31 us per drafter layer at a
// 64-token context on the H200, 16% of a draft step.)
#include <cmath>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kKeysInFlight = 4;

// kDimsPerLane: head_dim <= 32 * kDimsPerLane (a kernel per power of two up to kMaxAttentionHeadDim, so the
// drafter's 128 holds 4 keys' rows in half the registers of 256's).
template <int kDimsPerLane>
__global__ void __launch_bounds__(kThreads)
    windowed_attention_kernel(float* out, int64_t out_stride, const float* q, int64_t q_stride,
                              const float* k_cache, int64_t k_stride, const float* v_cache, int64_t v_stride,
                              const int32_t* key_begin, const int32_t* key_end, int64_t cache_rows,
                              int heads_per_kv, int head_dim, float scale) {
  wait_for_previous_kernel();
  allow_next_kernel();
  __shared__ float merged_max[kWarps], merged_sum[kWarps];
  __shared__ float merged_acc[kWarps][kDimsPerLane * kWarpSize];
  const int64_t row = blockIdx.x;
  const int head = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize,
            lane = static_cast<int>(threadIdx.x) % kWarpSize;
  float* out_row = out + row * out_stride + static_cast<int64_t>(head) * head_dim;
  const int64_t begin = key_begin[row], end = key_end[row];
  if (begin < 0 || begin >= end || end > cache_rows) {  // the same for every thread of the block
    for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += kThreads) out_row[d] = NAN;
    return;
  }
  const float* q_row = q + row * q_stride + static_cast<int64_t>(head) * head_dim;
  const int64_t kv_offset = static_cast<int64_t>(head / heads_per_kv) * head_dim;
  float query[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    query[i] = d < head_dim ? q_row[d] : 0.0f;
  }

  float running_max = -INFINITY, running_sum = 0.0f;
  float acc[kDimsPerLane] = {};
  for (int64_t first = begin + warp * kKeysInFlight; first < end; first += kWarps * kKeysInFlight) {
    float keys[kKeysInFlight][kDimsPerLane], values[kKeysInFlight][kDimsPerLane];
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j)
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + i * kWarpSize;
        const bool load = first + j < end && d < head_dim;
        keys[j][i] = load ? k_cache[(first + j) * k_stride + kv_offset + d] : 0.0f;
        values[j][i] = load ? v_cache[(first + j) * v_stride + kv_offset + d] : 0.0f;
      }
    float score[kKeysInFlight];
    float group_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j) {
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) dot = fmaf(query[i], keys[j][i], dot);
      dot = warp_sum(dot);
      score[j] = first + j < end ? dot * scale : -INFINITY;
      group_max = fmaxf(group_max, score[j]);
    }
    const float new_max = fmaxf(running_max, group_max);  // finite: key `first` is in range
    const float correction = expf(running_max - new_max);
    running_sum *= correction;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[i] *= correction;
#pragma unroll
    for (int j = 0; j < kKeysInFlight; ++j) {
      const float weight = expf(score[j] - new_max);  // 0 past the end
      running_sum += weight;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) acc[i] = fmaf(weight, values[j][i], acc[i]);
    }
    running_max = new_max;
  }

  // Merge the warps' states; a warp without keys has max -inf and adds nothing.
  if (lane == 0) merged_max[warp] = running_max, merged_sum[warp] = running_sum;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    if (d < head_dim) merged_acc[warp][d] = acc[i];
  }
  __syncthreads();
  float largest = -INFINITY;
  for (int w = 0; w < kWarps; ++w) largest = fmaxf(largest, merged_max[w]);
  float weights[kWarps], total = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    weights[w] = expf(merged_max[w] - largest);
    total += merged_sum[w] * weights[w];
  }
  for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += kThreads) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += merged_acc[w][d] * weights[w];
    out_row[d] = sum / total;
  }
}

}  // namespace

cudaError_t launch_windowed_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                      const Tensor& v_cache, const Tensor& key_begin, const Tensor& key_end,
                                      int num_heads, int num_kv_heads, int head_dim, float scale,
                                      cudaStream_t stream) {
  if (q.rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(q.rows), static_cast<unsigned int>(num_heads));
  static_assert(kMaxAttentionHeadDim == 8 * kWarpSize, "kernels for 1, 2, 4 and 8 dims per lane");
  const auto kernel = head_dim <= kWarpSize       ? windowed_attention_kernel<1>
                      : head_dim <= 2 * kWarpSize ? windowed_attention_kernel<2>
                      : head_dim <= 4 * kWarpSize ? windowed_attention_kernel<4>
                                                  : windowed_attention_kernel<8>;
  return launch_kernel(kernel, grid, kThreads, 0, stream, out.ptr<float>(), out.stride, q.ptr<const float>(),
                       q.stride, k_cache.ptr<const float>(), k_cache.stride, v_cache.ptr<const float>(),
                       v_cache.stride, key_begin.ptr<const int32_t>(), key_end.ptr<const int32_t>(),
                       k_cache.rows, num_heads / num_kv_heads, head_dim, scale);
}

}  // namespace qspec::cuda
