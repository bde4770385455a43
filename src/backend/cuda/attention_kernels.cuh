// Shared by the attention kernels (attention.cu dispatches; attention_rows.cu: decode, and verify of other
// head_dims, on FP32 cores; attention_verify.cu: verify on tensor cores; attention_prefill.cu: prefill on
// tensor cores). The query rows of one KV head are the pairs
// (token t, grouped head g), numbered i = t * heads_per_kv + g, so one block reads its KV head's keys once
// for all of them. Query row i of token t sees cache rows 0..positions[t]; a position outside the cache
// sees none and gets a NaN output row. With first keys (decode and verify kernels only) it sees
// first_keys[t]..positions[t], or with positions_are_ends first_keys[t]..positions[t] - 1 (the windowed
// attention of the DFlash drafter); a block then reads the keys from its rows' least first key on.
//
// With `splits` > 1 the keys of a block are split over blocks (flash-decoding): each writes, per query
// row and split, a partial [max score (scaled), sum of exp(score - max), the unnormalised weighted values]
// that the merge kernels of attention.cu combine. A split without keys for a row writes max -inf, sum 0,
// values 0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cp_async.cuh"
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
  const int32_t* first_keys;  // null: every row's keys start at 0
  int64_t first_keys_stride;
  bool positions_are_ends;  // positions hold one past each row's last key
  int64_t tokens;
  int num_heads, num_kv_heads, heads_per_kv, head_dim, splits;
  float scale;
  float* partials;  // [tokens * num_heads * splits][2 + head_dim] when splits > 1
};

// The K and V caches converted for the prefill kernel: 2 * parts planes (K parts, then V parts), each
// [num_kv_heads][padded_rows][padded_dim] BF16; zeros past head_dim and past the last key any query row sees.
// One part: x rounded to BF16; two: split BF16, hi = bf16(x) and lo = bf16(x - hi).
struct KvPlanes {
  uint16_t* planes;
  int64_t padded_rows;
  int padded_dim;
  int parts;
  int* key_count;  // max over the rows of (position + 1), 0 for invalid positions
};

inline constexpr int kMaxAttentionSplits = 256;

// One past the last cache row query token t sees: positions[t] + 1 (or positions[t] with
// positions_are_ends), 0 for a position outside the cache.
__device__ inline int64_t row_key_count(const AttentionArgs& a, int64_t t) {
  const int64_t end = int64_t{a.positions[t * a.positions_stride]} + (a.positions_are_ends ? 0 : 1);
  return end >= 1 && end <= a.cache_rows ? end : 0;
}

// The first cache row query token t sees, given one past its last (row_key_count): 0 without first keys; a
// first key outside [0, key_end) leaves the row no keys (returned as key_end).
__device__ inline int64_t row_first_key(const AttentionArgs& a, int64_t t, int64_t key_end) {
  if (a.first_keys == nullptr) return 0;
  const int64_t first = a.first_keys[t * a.first_keys_stride];
  return first >= 0 && first < key_end ? first : key_end;
}

// Whether query token t sees any key (else its output row is NaN).
__device__ inline bool row_has_keys(const AttentionArgs& a, int64_t t) {
  const int64_t end = row_key_count(a, t);
  return row_first_key(a, t, end) < end;
}

// Cache rows [begin, end).
struct KeyRange {
  int64_t begin, end;
};

// The keys a block's rows see together: from the least first key to the most ends, over every token (a
// block serves all tokens of its KV head); rows without keys add none.
__device__ inline KeyRange block_key_span(const AttentionArgs& a) {
  KeyRange span{a.cache_rows, 0};
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t end = row_key_count(a, t), first = row_first_key(a, t, end);
    if (first >= end) continue;
    span.begin = first < span.begin ? first : span.begin;
    span.end = end > span.end ? end : span.end;
  }
  return span.end > 0 ? span : KeyRange{0, 0};
}

// The keys of `split` of a block's span; the split size is a multiple of `granule` so that key tiles do not
// straddle splits.
__device__ inline KeyRange split_key_range(KeyRange span, int splits, int split, int granule) {
  const int64_t keys = span.end - span.begin;
  int64_t per_split = (keys + splits - 1) / splits;
  per_split = (per_split + granule - 1) / granule * granule;
  const int64_t begin = span.begin + split * per_split;
  const int64_t end = begin + per_split < span.end ? begin + per_split : span.end;
  return {begin, end > begin ? end : begin};
}

__device__ inline float* output_row(const AttentionArgs& a, int64_t t, int head) {
  return a.out + t * a.out_stride + static_cast<int64_t>(head) * a.head_dim;
}
__device__ inline float* partial_row(const AttentionArgs& a, int64_t t, int head, int split) {
  return a.partials + ((t * a.num_heads + head) * a.splits + split) * (2 + static_cast<int64_t>(a.head_dim));
}

// ---- BF16 tensor-core arithmetic (mma.sync m16n8k16, FP32 accumulation, sm_80+) ----
// attention_verify.cu splits every operand x into hi = bf16(x) and lo = bf16(x - hi) (x - hi - lo ~ 2^-17 x)
// and multiplies hi*hi + hi*lo + lo*hi; attention_prefill.cu rounds each operand to BF16 once.

inline constexpr float kLog2e = 1.4426950408889634f;

// Online softmax over one 16-key score tile of a warp's 16 rows: scores[n][e] is key first_key + 8n + 2 pair
// + (e & 1) of row g (e < 2) or g + 8, keys before the row's first or at or past its limit masked. Updates
// the rows' running max (raw scores) and this thread's part of their totals, returns the factor for the
// earlier sums and the weights P in the scores' places: in pairs (weights[n][0], [1]) and ([2], [3]) they are
// the A fragment registers 2n and 2n + 1 of the P V mma (registers 0/1 = keys 0-7 rows g/g+8, 2/3 = keys
// 8-15).
__device__ inline void online_softmax_tile(float (&scores)[2][4], int64_t first_key, int pair,
                                           const int64_t (&row_first)[2], const int64_t (&row_limit)[2],
                                           float scale_log2, float (&running_max)[2], float (&total)[2],
                                           float (&correction)[2], float (&weights)[2][4]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e / 2;
      const int64_t key = first_key + 8 * n + 2 * pair + (e & 1);
      if (key < row_first[h] || key >= row_limit[h]) scores[n][e] = -INFINITY;
      tile_max[h] = fmaxf(tile_max[h], scores[n][e]);
    }
  float max_scaled[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    const float new_max = fmaxf(running_max[h], tile_max[h]);
    const float reference = new_max == -INFINITY ? 0.0f : new_max;  // all masked so far: weights 0
    max_scaled[h] = reference * scale_log2;
    correction[h] = exp2f(running_max[h] * scale_log2 - max_scaled[h]);
    running_max[h] = new_max;
    total[h] *= correction[h];
  }
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      weights[n][e] = exp2f(fmaf(scores[n][e], scale_log2, -max_scaled[e / 2]));
      total[e / 2] += weights[n][e];
    }
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* shared) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// c += (a_hi + a_lo)(b_hi + b_lo) without the lo*lo term; the small terms first.
__device__ inline void mma_split(float (&c)[4], const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4],
                                 uint32_t b_hi0, uint32_t b_hi1, uint32_t b_lo0, uint32_t b_lo1) {
  mma_bf16(c, a_hi, b_lo0, b_lo1);
  mma_bf16(c, a_lo, b_hi0, b_hi1);
  mma_bf16(c, a_hi, b_hi0, b_hi1);
}

// Launchers of the regimes (attention.cu chooses one and runs attention_merge_kernel after it when split).
cudaError_t launch_attention_decode(const AttentionArgs& args, cudaStream_t stream);
cudaError_t launch_attention_verify(const AttentionArgs& args, cudaStream_t stream);
// The tensor-core verify kernel (attention_verify.cu) takes head_dim 32, 64, 128 or 256: the dynamic shared
// memory a block of it needs, 0 for another head_dim.
size_t attention_verify_mma_shared_bytes(int head_dim);
cudaError_t launch_attention_verify_mma(const AttentionArgs& args, cudaStream_t stream);
cudaError_t launch_attention_prefill(const AttentionArgs& args, const KvPlanes& planes, cudaStream_t stream);

// Query rows per block of each regime (prefill: of its paired kernel; the fallback takes 64).
inline constexpr int kDecodeRows = 4;
inline constexpr int kVerifyRows = 64;
inline constexpr int kPrefillRows = 128;
// Prefill key tile of the paired kernel (the fallback's 16 divides it): the K/V planes are padded to it.
inline constexpr int kPrefillKeyTile = 32;

}  // namespace qspec::cuda
