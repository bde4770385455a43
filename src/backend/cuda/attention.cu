// Causal attention of query rows over an F32 KV cache: query row t sees cache rows 0..positions[t]. The keys
// of one (query row, head) are split into `splits` contiguous ranges, one block each (flash-decoding), so
// that a decode step with few rows still fills the GPU. In a block, each warp takes groups of kKeysPerStep
// consecutive keys (every kWarps-th group), computes their scores with its lanes along the head dims, and
// keeps an online softmax (running max, sum and weighted values) in fp32; the warps are merged in shared
// memory. With one split the block writes the output; otherwise it writes its partial (max, sum, values) and
// a second kernel merges the splits.
#include <cmath>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kKeysPerStep = 4;
constexpr int kDimsPerLane = kMaxAttentionHeadDim / kWarpSize;
constexpr int64_t kTargetBlocks = 528;    // 4 per multiprocessor of an H100/H200
constexpr int64_t kMinKeysPerSplit = 64;  // fewer keys are not worth a partial
constexpr int kMergeBlock = 128;

struct AttentionArgs {
  float* out;
  int64_t out_stride;
  const float* q;
  int64_t q_stride;
  const float* k_cache;
  int64_t k_stride;
  const float* v_cache;
  int64_t v_stride;
  int64_t cache_rows;
  const int32_t* positions;
  int64_t positions_stride;
  int num_heads, heads_per_kv, head_dim, splits;
  float scale;
  float* partials;  // [rows * num_heads * splits][2 + head_dim]: max, sum, unnormalised values
};

__device__ inline bool valid_position(const AttentionArgs& a, int32_t position) {
  return position >= 0 && position < a.cache_rows;
}

__global__ void attention_split_kernel(AttentionArgs a) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_total[kWarps];
  __shared__ float warp_acc[kWarps][kMaxAttentionHeadDim];
  const int64_t t = blockIdx.x / a.num_heads;
  const int head = static_cast<int>(blockIdx.x % a.num_heads);
  const int split = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int head_dim = a.head_dim;
  float* y = a.out + t * a.out_stride + static_cast<int64_t>(head) * head_dim;
  const int32_t position = a.positions[t * a.positions_stride];
  if (!valid_position(a, position)) {
    if (a.splits == 1)
      for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += blockDim.x) y[d] = NAN;
    return;  // with several splits the merge kernel writes the NaN row
  }
  const int64_t keys = int64_t{position} + 1;
  const int64_t per_split = (keys + a.splits - 1) / a.splits;
  const int64_t begin = split * per_split;
  const int64_t end = begin + per_split < keys ? begin + per_split : keys;
  const int64_t kv_offset = static_cast<int64_t>(head / a.heads_per_kv) * head_dim;
  const float* query = a.q + t * a.q_stride + static_cast<int64_t>(head) * head_dim;

  float query_values[kDimsPerLane];
  float acc[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + i * kWarpSize;
    query_values[i] = d < head_dim ? query[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float running_max = -INFINITY, total = 0.0f;
  for (int64_t first = begin + int64_t{warp} * kKeysPerStep; first < end; first += kWarps * kKeysPerStep) {
    float scores[kKeysPerStep];
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      float partial = 0.0f;
      if (first + u < end) {
        const float* key = a.k_cache + (first + u) * a.k_stride + kv_offset;
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
      scores[u] = first + u < end ? warp_sum(scores[u]) * a.scale : -INFINITY;
      new_max = fmaxf(new_max, scores[u]);
    }
    const float correction = expf(running_max - new_max);
    total *= correction;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[i] *= correction;
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      if (first + u >= end) break;
      const float weight = expf(scores[u] - new_max);
      total += weight;
      const float* value = a.v_cache + (first + u) * a.v_stride + kv_offset;
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
  // Warps without keys (total 0, max -inf) are left out, so an empty range gives max -inf and sum 0.
  float block_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w)
    if (warp_total[w] > 0.0f) block_max = fmaxf(block_max, warp_max[w]);
  float block_total = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (warp_total[w] > 0.0f) block_total += warp_total[w] * expf(warp_max[w] - block_max);
  float* partial = a.partials + (static_cast<int64_t>(blockIdx.x) * a.splits + split) * (2 + head_dim);
  if (a.splits > 1 && threadIdx.x == 0) {
    partial[0] = block_max;
    partial[1] = block_total;
  }
  for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (warp_total[w] > 0.0f) sum += warp_acc[w][d] * expf(warp_max[w] - block_max);
    if (a.splits == 1)
      y[d] = sum / block_total;
    else
      partial[2 + d] = sum;
  }
}

// One block per (query row, head): out = sum_s values_s exp(max_s - M) / sum_s sum_s exp(max_s - M).
__global__ void attention_merge_kernel(AttentionArgs a) {
  const int64_t t = blockIdx.x / a.num_heads;
  const int head = static_cast<int>(blockIdx.x % a.num_heads);
  const int head_dim = a.head_dim;
  float* y = a.out + t * a.out_stride + static_cast<int64_t>(head) * head_dim;
  if (!valid_position(a, a.positions[t * a.positions_stride])) {
    for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += blockDim.x) y[d] = NAN;
    return;
  }
  const float* partials = a.partials + static_cast<int64_t>(blockIdx.x) * a.splits * (2 + head_dim);
  float global_max = -INFINITY;
  for (int s = 0; s < a.splits; ++s)
    if (partials[s * (2 + head_dim) + 1] > 0.0f) global_max = fmaxf(global_max, partials[s * (2 + head_dim)]);
  float global_total = 0.0f;
  for (int s = 0; s < a.splits; ++s) {
    const float* p = partials + s * (2 + head_dim);
    if (p[1] > 0.0f) global_total += p[1] * expf(p[0] - global_max);
  }
  for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < a.splits; ++s) {
      const float* p = partials + s * (2 + head_dim);
      if (p[1] > 0.0f) sum += p[2 + d] * expf(p[0] - global_max);
    }
    y[d] = sum / global_total;
  }
}

}  // namespace

int attention_splits(int64_t rows, int num_heads, int64_t cache_rows) {
  const int64_t blocks = rows * num_heads;
  if (blocks <= 0) return 1;
  const int64_t by_occupancy = (kTargetBlocks + blocks - 1) / blocks;
  const int64_t by_keys = (cache_rows + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
  const int64_t splits = by_occupancy < by_keys ? by_occupancy : by_keys;
  return static_cast<int>(splits < 1 ? 1 : splits);
}

size_t attention_workspace_floats(int64_t rows, int num_heads, int head_dim, int64_t cache_rows) {
  const int splits = attention_splits(rows, num_heads, cache_rows);
  return splits == 1 ? 0 : static_cast<size_t>(rows * num_heads * splits * (2 + head_dim));
}

cudaError_t launch_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& positions, int num_heads, int num_kv_heads, int head_dim,
                             float scale, float* workspace, cudaStream_t stream) {
  if (q.rows == 0) return cudaSuccess;
  const int splits = attention_splits(q.rows, num_heads, k_cache.rows);
  const AttentionArgs args{out.ptr<float>(),
                           out.stride,
                           q.ptr<const float>(),
                           q.stride,
                           k_cache.ptr<const float>(),
                           k_cache.stride,
                           v_cache.ptr<const float>(),
                           v_cache.stride,
                           k_cache.rows,
                           positions.ptr<const int32_t>(),
                           positions.stride,
                           num_heads,
                           num_heads / num_kv_heads,
                           head_dim,
                           splits,
                           scale,
                           workspace};
  const auto blocks = static_cast<unsigned int>(q.rows * num_heads);
  attention_split_kernel<<<dim3(blocks, static_cast<unsigned int>(splits)), kWarps * kWarpSize, 0, stream>>>(
      args);
  if (splits == 1) return cudaGetLastError();
  if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  attention_merge_kernel<<<blocks, kMergeBlock, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace qspec::cuda
