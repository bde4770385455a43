// Shared by the attention kernels (attention.cu dispatches; attention_rows.cu: decode and verify on FP32
// cores; attention_prefill.cu: prefill on tensor cores). The query rows of one KV head are the pairs
// (token t, grouped head g), numbered i = t * heads_per_kv + g, so one block reads its KV head's keys once
// for all of them. Query row i of token t sees cache rows 0..positions[t]; a position outside the cache
// sees none and gets a NaN output row.
//
// With `splits` > 1 the keys of a block are split over blocks (flash-decoding): each writes, per query
// row and split, a partial [max score (scaled), sum of exp(score - max), the unnormalised weighted values]
// that attention_merge_kernel combines. A split without keys for a row writes max -inf, sum 0, values 0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"

namespace qspec::cuda {

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
  int64_t tokens;
  int num_heads, num_kv_heads, heads_per_kv, head_dim, splits;
  float scale;
  float* partials;  // [tokens * num_heads * splits][2 + head_dim] when splits > 1
};

// The K and V caches converted for the tensor-core kernel: 4 planes (K hi, K lo, V hi, V lo), each
// [num_kv_heads][padded_rows][padded_dim] BF16 with hi = bf16(x), lo = bf16(x - hi); zeros past head_dim
// and past the last key any query row sees.
struct SplitKvPlanes {
  uint16_t* planes;
  int64_t padded_rows;
  int padded_dim;
  int* key_count;  // max over the rows of (position + 1), 0 for invalid positions
};

inline constexpr int kMaxAttentionSplits = 256;

// Number of cache rows query token t sees: positions[t] + 1, or 0 for a position outside the cache.
__device__ inline int64_t row_key_count(const AttentionArgs& a, int64_t t) {
  const int32_t position = a.positions[t * a.positions_stride];
  return position >= 0 && position < a.cache_rows ? int64_t{position} + 1 : 0;
}

// The keys [begin, end) of `split` when a block's rows see block_keys keys; the split size is a multiple of
// `granule` so that key tiles do not straddle splits.
struct KeyRange {
  int64_t begin, end;
};
__device__ inline KeyRange split_key_range(int64_t block_keys, int splits, int split, int granule) {
  int64_t per_split = (block_keys + splits - 1) / splits;
  per_split = (per_split + granule - 1) / granule * granule;
  const int64_t begin = split * per_split;
  const int64_t end = begin + per_split < block_keys ? begin + per_split : block_keys;
  return {begin, end > begin ? end : begin};
}

__device__ inline float* output_row(const AttentionArgs& a, int64_t t, int head) {
  return a.out + t * a.out_stride + static_cast<int64_t>(head) * a.head_dim;
}
__device__ inline float* partial_row(const AttentionArgs& a, int64_t t, int head, int split) {
  return a.partials + ((t * a.num_heads + head) * a.splits + split) * (2 + static_cast<int64_t>(a.head_dim));
}

__device__ inline void copy_async_16(void* shared, const void* global) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global) : "memory");
}
__device__ inline void commit_async() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ inline void wait_async() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Launchers of the regimes (attention.cu chooses one and runs attention_merge_kernel after it when split).
cudaError_t launch_attention_decode(const AttentionArgs& args, cudaStream_t stream);
cudaError_t launch_attention_verify(const AttentionArgs& args, cudaStream_t stream);
cudaError_t launch_attention_prefill(const AttentionArgs& args, const SplitKvPlanes& planes,
                                     cudaStream_t stream);

// Query rows per block of each regime.
inline constexpr int kDecodeRows = 4;
inline constexpr int kVerifyRows = 64;
inline constexpr int kPrefillRows = 64;
inline constexpr int kPrefillKeyTile = 16;

}  // namespace qspec::cuda
