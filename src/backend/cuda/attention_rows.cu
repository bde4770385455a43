// Attention of few query rows (a decode step; a verify block whose head_dim the tensor-core verify kernel of
// attention_verify.cu does not take) on FP32 cores, exact like the CPU op up to summation order. Both kernels
// take one block per (KV head, key split) and serve all query rows of that KV head (tokens x grouped heads),
// so each K/V row is read from memory once per step, not once per query head; the splits fill the GPU
// (attention_kernels.cuh).
//
// Decode (<= 4 query rows: Qwen3.5-4B's 4 grouped heads of one token): the 4 warps of a block take turns of
// 4 consecutive keys; a lane holds 8 of the 256 dims (two float4) of all 4 query rows and of their
// accumulators, loads the 4 keys' K and V rows before reducing the 16 scores over the warp, and keeps an
// online softmax per row; the warps merge in shared memory. 16 KB of loads in flight per warp, ~3 blocks
// per multiprocessor. H200 (8 layers in one graph, merge included): context 4096 (32 MiB of K+V per
// layer) 17 us, was 72 us (~8 us of reads at 4.16 TB/s: blocks of ~40 keys are latency-bound); context
// 32768 71 us, 91% of the bandwidth.
//
// Verify (<= 64 query rows: 16 tokens x 4 grouped heads): tiles of 8 keys (K and V, 64 KB in four stages)
// are copied into shared memory with cp.async, three tiles ahead of the one computed. A warp owns 8 query
// rows, a lane 8 of their 256 dims (two float4), so each K/V value read from shared memory feeds 8 FMAs;
// the 8 partial scores of a key are reduced and scattered over the warp with 9 shuffles, the lane that gets
// a row's score keeps that row's softmax state, and the weights are broadcast back for P V. Per key the
// block does 64 rows x 256 dims x 2 FMAs, 256 cycles of the multiprocessor's FP32 lanes: compute-bound at
// about 2x the read time. H200: context 4096 68 us per layer, 32768 402 us (was 395 us at 4096; the first
// version of this kernel, one row per lane, took 111 us: its 128-bit shared loads were served a quarter-warp
// at a time). Still ~3x over the FP32 bound: 255 registers (40 bytes spilled), 8 warps per multiprocessor,
// the 5 dependent shuffles of each key's reduction. Head_dims 32/64/128/256 now take attention_verify.cu.
#include <cmath>

#include "backend/cuda/attention_kernels.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kChunks = kMaxAttentionHeadDim / 4;  // float4 chunks of a row of head_dim 256

// ---- decode ----
constexpr int kDecodeWarps = 4;
constexpr int kDecodeKeysPerStep = 4;
constexpr int kDecodeChunksPerLane = kChunks / kWarpSize;  // 2

__global__ void __launch_bounds__(kDecodeWarps* kWarpSize, 3) attention_decode_kernel(AttentionArgs a) {
  wait_for_previous_kernel();
  allow_next_kernel();
  __shared__ float warp_max[kDecodeWarps][kDecodeRows];
  __shared__ float warp_total[kDecodeWarps][kDecodeRows];
  __shared__ float4 warp_acc[kDecodeWarps][kDecodeRows][kChunks];
  const int kv = static_cast<int>(blockIdx.x);
  const int split = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int rows = static_cast<int>(a.tokens) * a.heads_per_kv;  // <= kDecodeRows
  const int chunks = a.head_dim / 4;

  int64_t row_keys[kDecodeRows], row_first[kDecodeRows];
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r) {
    row_keys[r] = r < rows ? row_key_count(a, r / a.heads_per_kv) : 0;
    row_first[r] = r < rows ? row_first_key(a, r / a.heads_per_kv, row_keys[r]) : 0;
  }
  const KeyRange range = split_key_range(block_key_span(a), a.splits, split, 1);
  const int64_t kv_offset = static_cast<int64_t>(kv) * a.head_dim;

  float4 query[kDecodeRows][kDecodeChunksPerLane];
  float4 acc[kDecodeRows][kDecodeChunksPerLane];
  float running_max[kDecodeRows], total[kDecodeRows];
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r) {
    running_max[r] = -INFINITY;
    total[r] = 0.0f;
    const int head = kv * a.heads_per_kv + r % a.heads_per_kv;
#pragma unroll
    for (int c = 0; c < kDecodeChunksPerLane; ++c) {
      const int chunk = lane + c * kWarpSize;
      query[r][c] = r < rows && chunk < chunks
                        ? reinterpret_cast<const float4*>(a.q + (r / a.heads_per_kv) * a.q_stride +
                                                          static_cast<int64_t>(head) * a.head_dim)[chunk]
                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      acc[r][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }

  for (int64_t first = range.begin + int64_t{warp} * kDecodeKeysPerStep; first < range.end;
       first += kDecodeWarps * kDecodeKeysPerStep) {
    float4 keys[kDecodeKeysPerStep][kDecodeChunksPerLane], values[kDecodeKeysPerStep][kDecodeChunksPerLane];
#pragma unroll
    for (int u = 0; u < kDecodeKeysPerStep; ++u) {
      const bool present = first + u < range.end;
      const auto* key = reinterpret_cast<const float4*>(a.k_cache + (first + u) * a.k_stride + kv_offset);
      const auto* value = reinterpret_cast<const float4*>(a.v_cache + (first + u) * a.v_stride + kv_offset);
#pragma unroll
      for (int c = 0; c < kDecodeChunksPerLane; ++c) {
        const int chunk = lane + c * kWarpSize;
        const bool load = present && chunk < chunks;
        keys[u][c] = load ? __ldg(key + chunk) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        values[u][c] = load ? __ldg(value + chunk) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int r = 0; r < kDecodeRows; ++r) {
      float scores[kDecodeKeysPerStep];
      float step_max = -INFINITY;
#pragma unroll
      for (int u = 0; u < kDecodeKeysPerStep; ++u) {
        float partial = 0.0f;
#pragma unroll
        for (int c = 0; c < kDecodeChunksPerLane; ++c) {
          partial += query[r][c].x * keys[u][c].x + query[r][c].y * keys[u][c].y +
                     query[r][c].z * keys[u][c].z + query[r][c].w * keys[u][c].w;
        }
        const float score = warp_sum(partial) * a.scale;
        const int64_t key = first + u;
        scores[u] = key < range.end && key >= row_first[r] && key < row_keys[r] ? score : -INFINITY;
        step_max = fmaxf(step_max, scores[u]);
      }
      if (step_max == -INFINITY) continue;  // no key of this step is visible to row r
      const float new_max = fmaxf(running_max[r], step_max);
      const float correction = expf(running_max[r] - new_max);
      total[r] *= correction;
#pragma unroll
      for (int c = 0; c < kDecodeChunksPerLane; ++c) {
        acc[r][c].x *= correction;
        acc[r][c].y *= correction;
        acc[r][c].z *= correction;
        acc[r][c].w *= correction;
      }
#pragma unroll
      for (int u = 0; u < kDecodeKeysPerStep; ++u) {
        const float weight = expf(scores[u] - new_max);
        total[r] += weight;
#pragma unroll
        for (int c = 0; c < kDecodeChunksPerLane; ++c) {
          acc[r][c].x += weight * values[u][c].x;
          acc[r][c].y += weight * values[u][c].y;
          acc[r][c].z += weight * values[u][c].z;
          acc[r][c].w += weight * values[u][c].w;
        }
      }
      running_max[r] = new_max;
    }
  }

#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r) {
    if (lane == 0) {
      warp_max[warp][r] = running_max[r];
      warp_total[warp][r] = total[r];
    }
#pragma unroll
    for (int c = 0; c < kDecodeChunksPerLane; ++c) warp_acc[warp][r][lane + c * kWarpSize] = acc[r][c];
  }
  __syncthreads();
  // Thread (row r, chunk) merges the warps; warps without keys for the row (total 0) are left out.
  for (int item = static_cast<int>(threadIdx.x); item < rows * chunks; item += kDecodeWarps * kWarpSize) {
    const int r = item / chunks, chunk = item % chunks;
    const int64_t t = r / a.heads_per_kv;
    const int head = kv * a.heads_per_kv + r % a.heads_per_kv;
    float block_max = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w)
      if (warp_total[w][r] > 0.0f) block_max = fmaxf(block_max, warp_max[w][r]);
    float block_total = 0.0f;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int w = 0; w < kDecodeWarps; ++w) {
      if (warp_total[w][r] <= 0.0f) continue;
      const float weight = expf(warp_max[w][r] - block_max);
      block_total += warp_total[w][r] * weight;
      const float4 part = warp_acc[w][r][chunk];
      sum.x += weight * part.x;
      sum.y += weight * part.y;
      sum.z += weight * part.z;
      sum.w += weight * part.w;
    }
    if (a.splits == 1) {
      // A valid row has its first key in the only split, so block_total >= 1.
      const float4 result = row_has_keys(a, t) ? make_float4(sum.x / block_total, sum.y / block_total,
                                                             sum.z / block_total, sum.w / block_total)
                                               : make_float4(NAN, NAN, NAN, NAN);
      reinterpret_cast<float4*>(output_row(a, t, head))[chunk] = result;
    } else {
      float* partial = partial_row(a, t, head, split);
      if (chunk == 0) {
        partial[0] = block_max;
        partial[1] = block_total;
      }
      float* values = partial + 2;
      values[4 * chunk] = sum.x;
      values[4 * chunk + 1] = sum.y;
      values[4 * chunk + 2] = sum.z;
      values[4 * chunk + 3] = sum.w;
    }
  }
}

// ---- verify ----
constexpr int kVerifyWarps = 8;
constexpr int kVerifyThreads = kVerifyWarps * kWarpSize;
constexpr int kVerifyRowsPerWarp = kVerifyRows / kVerifyWarps;  // 8
constexpr int kVerifyChunksPerLane = kChunks / kWarpSize;       // 2
constexpr int kVerifyTileKeys = 8;
constexpr int kVerifyStages = 4;
constexpr size_t kVerifySharedBytes =
    sizeof(float4) * kVerifyStages * 2 * kVerifyTileKeys * kChunks;  // 64 KB
static_assert(kVerifyRowsPerWarp == 8, "the score reduction below scatters 8 rows over 32 lanes");

// Sums each of v[0..7] over the warp and leaves the sum of v[(lane >> 2) & 7] in every lane: halving steps
// (each lane keeps the half its partner sends away) then two plain butterfly steps; 9 shuffles, not 40.
__device__ inline float reduce_scatter_8(const float (&v)[8], int lane) {
  const bool upper4 = (lane >> 4) & 1, upper3 = (lane >> 3) & 1, upper2 = (lane >> 2) & 1;
  float four[4], two[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float keep = upper4 ? v[i + 4] : v[i], send = upper4 ? v[i] : v[i + 4];
    four[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float keep = upper3 ? four[i + 2] : four[i], send = upper3 ? four[i] : four[i + 2];
    two[i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
  }
  float one = (upper2 ? two[1] : two[0]) + __shfl_xor_sync(0xffffffffu, upper2 ? two[0] : two[1], 4);
  one += __shfl_xor_sync(0xffffffffu, one, 2);
  one += __shfl_xor_sync(0xffffffffu, one, 1);
  return one;
}

__global__ void __launch_bounds__(kVerifyThreads, 1) attention_verify_kernel(AttentionArgs a) {
  wait_for_previous_kernel();
  allow_next_kernel();
  extern __shared__ float4 tiles[];  // [stage][K, V][key][chunk]
  const int kv = static_cast<int>(blockIdx.x);
  const int split = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int rows = static_cast<int>(a.tokens) * a.heads_per_kv;  // <= kVerifyRows
  const int chunks = a.head_dim / 4;
  const int first_row = warp * kVerifyRowsPerWarp;
  // The row whose softmax state this lane keeps (4 lanes share one).
  const int own = (lane >> 2) & 7;
  const int own_row = first_row + own;
  const int64_t own_keys = own_row < rows ? row_key_count(a, own_row / a.heads_per_kv) : 0;
  const int64_t own_first = own_row < rows ? row_first_key(a, own_row / a.heads_per_kv, own_keys) : 0;
  const KeyRange range = split_key_range(block_key_span(a), a.splits, split, kVerifyTileKeys);
  const int64_t kv_offset = static_cast<int64_t>(kv) * a.head_dim;

  float4 query[kVerifyRowsPerWarp][kVerifyChunksPerLane], acc[kVerifyRowsPerWarp][kVerifyChunksPerLane];
#pragma unroll
  for (int r = 0; r < kVerifyRowsPerWarp; ++r) {
    const int row = first_row + r;
    const float4* q = reinterpret_cast<const float4*>(
        a.q + row / a.heads_per_kv * a.q_stride +
        static_cast<int64_t>(kv * a.heads_per_kv + row % a.heads_per_kv) * a.head_dim);
#pragma unroll
    for (int c = 0; c < kVerifyChunksPerLane; ++c) {
      const int chunk = lane + c * kWarpSize;
      query[r][c] = row < rows && chunk < chunks ? q[chunk] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      acc[r][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  float running_max = -INFINITY, total = 0.0f;  // of row `own`

  const int64_t tile_count = (range.end - range.begin + kVerifyTileKeys - 1) / kVerifyTileKeys;
  auto load_tile = [&](int64_t tile) {
    float4* stage = tiles + (tile % kVerifyStages) * 2 * kVerifyTileKeys * kChunks;
    const int64_t first = range.begin + tile * kVerifyTileKeys;
    for (int item = static_cast<int>(threadIdx.x); item < kVerifyTileKeys * chunks; item += kVerifyThreads) {
      const int key = item / chunks, chunk = item % chunks;
      if (first + key >= range.end) continue;
      cp_async_16(stage + key * kChunks + chunk,
                  a.k_cache + (first + key) * a.k_stride + kv_offset + 4 * chunk);
      cp_async_16(stage + (kVerifyTileKeys + key) * kChunks + chunk,
                  a.v_cache + (first + key) * a.v_stride + kv_offset + 4 * chunk);
    }
  };
  for (int stage = 0; stage < kVerifyStages - 1; ++stage) {
    if (stage < tile_count) load_tile(stage);
    cp_async_commit();
  }
  for (int64_t tile = 0; tile < tile_count; ++tile) {
    if (tile + kVerifyStages - 1 < tile_count) load_tile(tile + kVerifyStages - 1);
    cp_async_commit();
    cp_async_wait<kVerifyStages - 1>();  // this tile's copies are done (the next ones' may still run)
    __syncthreads();
    const float4* key_tile = tiles + (tile % kVerifyStages) * 2 * kVerifyTileKeys * kChunks;
    const float4* value_tile = key_tile + kVerifyTileKeys * kChunks;
    const int64_t first = range.begin + tile * kVerifyTileKeys;

    // Scores: 8 rows x this lane's 8 dims per key, reduced and scattered so this lane gets row `own`'s.
    // Keys past the range read stale shared memory; their scores are replaced by -inf.
    float scores[kVerifyTileKeys];
    float tile_max = -INFINITY;
#pragma unroll
    for (int u = 0; u < kVerifyTileKeys; ++u) {
      float4 k[kVerifyChunksPerLane];
#pragma unroll
      for (int c = 0; c < kVerifyChunksPerLane; ++c) {
        // Chunks past head_dim were never copied: their stale bits (NaN possibly) must not meet the zero
        // query there.
        const int chunk = lane + c * kWarpSize;
        k[c] = chunk < chunks ? key_tile[u * kChunks + chunk] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      float partial[kVerifyRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kVerifyRowsPerWarp; ++r) {
        partial[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < kVerifyChunksPerLane; ++c)
          partial[r] += query[r][c].x * k[c].x + query[r][c].y * k[c].y + query[r][c].z * k[c].z +
                        query[r][c].w * k[c].w;
      }
      const float score = reduce_scatter_8(partial, lane) * a.scale;
      const int64_t key = first + u;
      scores[u] = key < range.end && key >= own_first && key < own_keys ? score : -INFINITY;
      tile_max = fmaxf(tile_max, scores[u]);
    }
    // Online softmax of row `own`; weights of masked keys are 0.
    const float new_max = fmaxf(running_max, tile_max);
    const float reference = new_max == -INFINITY ? 0.0f : new_max;
    const float own_correction = expf(running_max - reference);
    running_max = new_max;
    total *= own_correction;
#pragma unroll
    for (int u = 0; u < kVerifyTileKeys; ++u) {
      scores[u] = expf(scores[u] - reference);
      total += scores[u];
    }
    // O += P V for the 8 rows: each row's correction and weights come from the lanes that own it.
#pragma unroll
    for (int r = 0; r < kVerifyRowsPerWarp; ++r) {
      const float correction = __shfl_sync(0xffffffffu, own_correction, 4 * r);
#pragma unroll
      for (int c = 0; c < kVerifyChunksPerLane; ++c) {
        acc[r][c].x *= correction;
        acc[r][c].y *= correction;
        acc[r][c].z *= correction;
        acc[r][c].w *= correction;
      }
    }
#pragma unroll
    for (int u = 0; u < kVerifyTileKeys; ++u) {
      // A key past the range (the same for the whole warp) has weight 0 for every row, and its stale values
      // may be NaN: it is skipped, not multiplied by 0.
      if (first + u >= range.end) continue;
      float4 v[kVerifyChunksPerLane];
#pragma unroll
      for (int c = 0; c < kVerifyChunksPerLane; ++c) v[c] = value_tile[u * kChunks + lane + c * kWarpSize];
#pragma unroll
      for (int r = 0; r < kVerifyRowsPerWarp; ++r) {
        const float weight = __shfl_sync(0xffffffffu, scores[u], 4 * r);
#pragma unroll
        for (int c = 0; c < kVerifyChunksPerLane; ++c) {
          acc[r][c].x += weight * v[c].x;
          acc[r][c].y += weight * v[c].y;
          acc[r][c].z += weight * v[c].z;
          acc[r][c].w += weight * v[c].w;
        }
      }
    }
    __syncthreads();  // the next iteration's copies overwrite this stage
  }

#pragma unroll
  for (int r = 0; r < kVerifyRowsPerWarp; ++r) {
    const int row = first_row + r;
    const float row_total = __shfl_sync(0xffffffffu, total, 4 * r);
    const float row_max = __shfl_sync(0xffffffffu, running_max, 4 * r);
    if (row >= rows) continue;
    const int64_t t = row / a.heads_per_kv;
    const int head = kv * a.heads_per_kv + row % a.heads_per_kv;
    if (a.splits == 1) {
      // A valid row has its first key in the only split, so row_total >= 1.
      const bool valid = row_has_keys(a, t);
      float4* out = reinterpret_cast<float4*>(output_row(a, t, head));
#pragma unroll
      for (int c = 0; c < kVerifyChunksPerLane; ++c) {
        const int chunk = lane + c * kWarpSize;
        if (chunk >= chunks) continue;
        out[chunk] = valid ? make_float4(acc[r][c].x / row_total, acc[r][c].y / row_total,
                                         acc[r][c].z / row_total, acc[r][c].w / row_total)
                           : make_float4(NAN, NAN, NAN, NAN);
      }
      continue;
    }
    float* partial = partial_row(a, t, head, split);
    if (lane == 0) {
      partial[0] = row_max;
      partial[1] = row_total;
    }
#pragma unroll
    for (int c = 0; c < kVerifyChunksPerLane; ++c) {
      const int chunk = lane + c * kWarpSize;
      if (chunk >= chunks) continue;
      float* values = partial + 2 + 4 * chunk;
      values[0] = acc[r][c].x;
      values[1] = acc[r][c].y;
      values[2] = acc[r][c].z;
      values[3] = acc[r][c].w;
    }
  }
}

}  // namespace

cudaError_t launch_attention_decode(const AttentionArgs& args, cudaStream_t stream) {
  return launch_kernel(attention_decode_kernel,
                       dim3(static_cast<unsigned>(args.num_kv_heads), static_cast<unsigned>(args.splits)),
                       kDecodeWarps * kWarpSize, 0, stream, args);
}

cudaError_t launch_attention_verify(const AttentionArgs& args, cudaStream_t stream) {
  static const cudaError_t attribute =
      cudaFuncSetAttribute(attention_verify_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kVerifySharedBytes));
  if (attribute != cudaSuccess) return attribute;
  return launch_kernel(attention_verify_kernel,
                       dim3(static_cast<unsigned>(args.num_kv_heads), static_cast<unsigned>(args.splits)),
                       kVerifyThreads, kVerifySharedBytes, stream, args);
}

}  // namespace qspec::cuda
