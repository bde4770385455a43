// Causal attention of query rows over F32 KV caches: the choice of kernel by the number of query rows of one
// KV head (tokens x grouped heads), the key splits, the workspace, and the merge of split partials.
//   decode  (<= 4 rows, 16-byte aligned rows):  attention_rows.cu, FP32, memory-bound
//   verify  (<= 64 rows, 16-byte aligned rows):  attention_verify.cu, split-BF16 tensor cores, for head_dim
//           32/64/128/256 where its shared memory fits; else attention_rows.cu, FP32
//   prefill (otherwise):                         attention_prefill.cu, split-BF16 tensor cores up to
//           kLinearMmaMaxRows tokens, BF16 beyond (as the linears)
// The positions live on the device, so the host sizes the grid by the cache's capacity: each block derives
// its keys from the positions and splits them evenly (attention_kernels.cuh), and blocks past the context
// finish at once. Merge: with many splits (decode, verify) a block per (query row, head, 32 dims) whose
// warps share the splits; with few (prefill: 2-3 splits of thousands of rows) a thread per (query row,
// head, 4 dims) that adds the splits in order. (The first kernel alone took 4.9 ms for the 32 merges of a
// 2048-token prefill: 65,536 blocks of 256 threads per 512-token chunk, 7 of 8 warps idle.)
#include <cmath>
#include <cstdint>

#include "backend/cuda/attention_kernels.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

// Resident blocks that fill an H100/H200 (132 multiprocessors) per regime, and the fewest keys worth a split.
// Prefill splits the keys only below one wave of blocks (the paired kernel takes one block per SM): at 2,048
// tokens (256 blocks) two splits and their merge cost 0.8 ms more than one (session 9).
constexpr int64_t kDecodeTargetBlocks = 3 * 132;
constexpr int64_t kVerifyTargetBlocks = 132;
constexpr int64_t kPrefillTargetBlocks = 132;
constexpr int64_t kDecodeMinKeysPerSplit = 32;
constexpr int64_t kVerifyMinKeysPerSplit = 64;
constexpr int64_t kPrefillMinKeysPerSplit = 128;
constexpr int kMergeThreads = 256;
constexpr int kMergeRowsThreads = 256;
constexpr int kMergeRowsMaxSplits = 8;
constexpr size_t kWorkspaceAlignment = 256;

enum class Regime { kDecode, kVerify, kVerifyMma, kPrefill };

struct Plan {
  Regime regime;
  int splits;
  int padded_dim;           // prefill: head_dim rounded up to 64, 128 or 256
  int64_t padded_rows;      // prefill: cache rows rounded up to a key tile
  int parts;                // prefill: BF16 parts per operand (KvPlanes)
  size_t partials_bytes;    // split partials, at the workspace's start
  size_t key_count_offset;  // prefill: one int
  size_t planes_offset;     // prefill: the BF16 K/V planes
  size_t bytes;
};

size_t align_up(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

int splits_for(int64_t blocks, int64_t target_blocks, int64_t cache_rows, int64_t min_keys) {
  if (blocks >= target_blocks) return 1;
  int64_t splits = (target_blocks + blocks - 1) / blocks;
  const int64_t by_keys = (cache_rows + min_keys - 1) / min_keys;
  if (splits > by_keys) splits = by_keys;
  if (splits > kMaxAttentionSplits) splits = kMaxAttentionSplits;
  return static_cast<int>(splits < 1 ? 1 : splits);
}

// The tensor-core verify kernel covers this head_dim and its shared memory fits this GPU's blocks.
bool verify_mma_fits(int head_dim) {
  static const int shared_limit = [] {
    int device = 0, bytes = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
      return 0;
    return bytes;
  }();
  const size_t bytes = attention_verify_mma_shared_bytes(head_dim);
  return bytes > 0 && bytes <= static_cast<size_t>(shared_limit);
}

Plan plan_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                    int num_heads, int num_kv_heads, int head_dim) {
  const int64_t rows = q.rows * (num_heads / num_kv_heads);  // query rows per KV head
  const bool vectorizable = head_dim % 4 == 0 && rows_aligned_to_float4(out) && rows_aligned_to_float4(q) &&
                            rows_aligned_to_float4(k_cache) && rows_aligned_to_float4(v_cache);
  Plan plan{};
  const int64_t cache_rows = k_cache.rows;
  if (vectorizable && rows <= kDecodeRows) {
    plan.regime = Regime::kDecode;
    plan.splits = splits_for(num_kv_heads, kDecodeTargetBlocks, cache_rows, kDecodeMinKeysPerSplit);
  } else if (vectorizable && rows <= kVerifyRows) {
    plan.regime = verify_mma_fits(head_dim) ? Regime::kVerifyMma : Regime::kVerify;
    plan.splits = splits_for(num_kv_heads, kVerifyTargetBlocks, cache_rows, kVerifyMinKeysPerSplit);
  } else {
    plan.regime = Regime::kPrefill;
    const int64_t blocks = (rows + kPrefillRows - 1) / kPrefillRows * num_kv_heads;
    plan.splits = splits_for(blocks, kPrefillTargetBlocks, cache_rows, kPrefillMinKeysPerSplit);
    plan.padded_dim = head_dim <= 64 ? 64 : (head_dim <= 128 ? 128 : 256);
    plan.padded_rows = (cache_rows + kPrefillKeyTile - 1) / kPrefillKeyTile * kPrefillKeyTile;
    // Split BF16 (~1e-5 of FP32) for chunks that the linears take in their FP32-class kernels; longer
    // chunks, whose linears are BF16 products (cuBLAS), round q, k, v and p to BF16 once: a third of the
    // tensor-core work (attention_prefill.cu).
    plan.parts = q.rows <= kLinearMmaMaxRows ? 2 : 1;
  }
  plan.partials_bytes =
      plan.splits == 1
          ? 0
          : sizeof(float) * static_cast<size_t>(q.rows * num_heads * plan.splits * (2 + head_dim));
  plan.bytes = align_up(plan.partials_bytes);
  if (plan.regime == Regime::kPrefill) {
    plan.key_count_offset = plan.bytes;
    plan.planes_offset = plan.bytes + kWorkspaceAlignment;
    plan.bytes = plan.planes_offset + sizeof(uint16_t) * 2 * static_cast<size_t>(plan.parts * num_kv_heads) *
                                          static_cast<size_t>(plan.padded_rows) *
                                          static_cast<size_t>(plan.padded_dim);
  }
  return plan;
}

__device__ inline float block_max(float v, float* scratch) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float result = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x) / kWarpSize; ++w) result = fmaxf(result, scratch[w]);
  __syncthreads();
  return result;
}

// One block per (query token, head, 32 dims): out = sum_s values_s w_s / sum_s sum_s w_s with
// w_s = exp(max_s - max); splits without keys for the row (sum 0, values 0) get weight 0. Warp w sums the
// splits w, w + 8, ... for its 32 dims (lane = dim), so each thread has only splits / 8 loads, all in flight.
__global__ void __launch_bounds__(kMergeThreads) attention_merge_kernel(AttentionArgs a) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int kMergeWarps = kMergeThreads / kWarpSize;
  __shared__ float weights[kMaxAttentionSplits];
  __shared__ float scratch[kMergeWarps];
  __shared__ float warp_sums[kMergeWarps][kWarpSize];
  const int64_t t = blockIdx.x / a.num_heads;
  const int head = static_cast<int>(blockIdx.x % a.num_heads);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int d = static_cast<int>(blockIdx.y) * kWarpSize + lane;
  float* y = output_row(a, t, head);
  if (!row_has_keys(a, t)) {
    if (warp == 0 && d < a.head_dim) y[d] = NAN;
    return;
  }
  const float* first = partial_row(a, t, head, 0);
  const int64_t partial_size = 2 + int64_t{a.head_dim};
  float local_max = -INFINITY;
  for (int s = static_cast<int>(threadIdx.x); s < a.splits; s += kMergeThreads)
    if (first[s * partial_size + 1] > 0.0f) local_max = fmaxf(local_max, first[s * partial_size]);
  const float global_max = block_max(local_max, scratch);
  float local_total = 0.0f;
  for (int s = static_cast<int>(threadIdx.x); s < a.splits; s += kMergeThreads) {
    const float sum = first[s * partial_size + 1];
    weights[s] = sum > 0.0f ? expf(first[s * partial_size] - global_max) : 0.0f;
    local_total += weights[s] * sum;
  }
  const float total = block_sum(local_total, scratch);  // its barriers also publish `weights`
  float sum = 0.0f;
  if (d < a.head_dim) {
#pragma unroll 4
    for (int s = warp; s < a.splits; s += kMergeWarps) sum += first[s * partial_size + 2 + d] * weights[s];
  }
  warp_sums[warp][lane] = sum;
  __syncthreads();
  if (warp != 0 || d >= a.head_dim) return;
  float result = 0.0f;
#pragma unroll
  for (int w = 0; w < kMergeWarps; ++w) result += warp_sums[w][lane];
  y[d] = result / total;
}

// Few splits: thread = (query token, head, 4 dims); the splits' maxima and sums are read by every thread of
// a (token, head) (cached), the values once.
__global__ void __launch_bounds__(kMergeRowsThreads) attention_merge_rows_kernel(AttentionArgs a) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int chunks = (a.head_dim + 3) / 4;
  const int64_t item = blockIdx.x * int64_t{kMergeRowsThreads} + threadIdx.x;
  if (item >= a.tokens * a.num_heads * chunks) return;
  const int first_dim = 4 * static_cast<int>(item % chunks);
  const int64_t t = item / chunks / a.num_heads;
  const int head = static_cast<int>(item / chunks % a.num_heads);
  const int dims = a.head_dim - first_dim < 4 ? a.head_dim - first_dim : 4;
  float* const y = output_row(a, t, head) + first_dim;
  if (!row_has_keys(a, t)) {
    for (int e = 0; e < dims; ++e) y[e] = NAN;
    return;
  }
  const float* const first = partial_row(a, t, head, 0);
  const int64_t partial_size = 2 + int64_t{a.head_dim};
  float global_max = -INFINITY;
  for (int s = 0; s < a.splits; ++s)
    if (first[s * partial_size + 1] > 0.0f) global_max = fmaxf(global_max, first[s * partial_size]);
  float total = 0.0f;
  float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s = 0; s < a.splits; ++s) {
    const float* const partial = first + s * partial_size;
    const float split_sum = partial[1];
    if (split_sum <= 0.0f) continue;
    const float weight = expf(partial[0] - global_max);
    total += weight * split_sum;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (e < dims) sum[e] += weight * partial[2 + first_dim + e];
  }
#pragma unroll
  for (int e = 0; e < 4; ++e)
    if (e < dims) y[e] = sum[e] / total;
}

}  // namespace

size_t attention_workspace_bytes(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                 const Tensor& v_cache, int num_heads, int num_kv_heads, int head_dim) {
  if (q.rows == 0) return 0;
  return plan_attention(out, q, k_cache, v_cache, num_heads, num_kv_heads, head_dim).bytes;
}

bool attention_takes_first_keys(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache, int num_heads, int num_kv_heads, int head_dim) {
  return plan_attention(out, q, k_cache, v_cache, num_heads, num_kv_heads, head_dim).regime !=
         Regime::kPrefill;
}

cudaError_t launch_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& positions, int num_heads, int num_kv_heads, int head_dim,
                             float scale, void* workspace, cudaStream_t stream, const KeyRanges& ranges) {
  if (q.rows == 0) return cudaSuccess;
  const Plan plan = plan_attention(out, q, k_cache, v_cache, num_heads, num_kv_heads, head_dim);
  const bool first_keys = ranges.first_keys.data != nullptr;
  if (first_keys && plan.regime == Regime::kPrefill) return cudaErrorInvalidValue;
  auto* const base = static_cast<char*>(workspace);
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
                           first_keys ? ranges.first_keys.ptr<const int32_t>() : nullptr,
                           ranges.first_keys.stride,
                           ranges.positions_are_ends,
                           q.rows,
                           num_heads,
                           num_kv_heads,
                           num_heads / num_kv_heads,
                           head_dim,
                           plan.splits,
                           scale,
                           reinterpret_cast<float*>(base)};
  cudaError_t status = cudaSuccess;
  switch (plan.regime) {
    case Regime::kDecode:
      status = launch_attention_decode(args, stream);
      break;
    case Regime::kVerify:
      status = launch_attention_verify(args, stream);
      break;
    case Regime::kVerifyMma:
      status = launch_attention_verify_mma(args, stream);
      break;
    case Regime::kPrefill: {
      const KvPlanes planes{reinterpret_cast<uint16_t*>(base + plan.planes_offset), plan.padded_rows,
                            plan.padded_dim, plan.parts,
                            reinterpret_cast<int*>(base + plan.key_count_offset)};
      status = launch_attention_prefill(args, planes, stream);
      break;
    }
  }
  if (status != cudaSuccess || plan.splits == 1) return status;
  if (plan.splits <= kMergeRowsMaxSplits) {
    const int64_t items = q.rows * num_heads * ((head_dim + 3) / 4);
    return launch_kernel(attention_merge_rows_kernel,
                         static_cast<unsigned>((items + kMergeRowsThreads - 1) / kMergeRowsThreads),
                         kMergeRowsThreads, 0, stream, args);
  }
  const dim3 merge_grid(static_cast<unsigned>(q.rows * num_heads),
                        static_cast<unsigned>((head_dim + kWarpSize - 1) / kWarpSize));
  return launch_kernel(attention_merge_kernel, merge_grid, kMergeThreads, 0, stream, args);
}

}  // namespace qspec::cuda
