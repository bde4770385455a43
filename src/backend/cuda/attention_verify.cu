// Attention of a verify block (up to 64 query rows of one KV head: 16 tokens x 4 grouped heads) on tensor
// cores with split BF16 (attention_kernels.cuh), reading the FP32 caches directly: no converted copy, each
// K/V row is read from memory once per step and serves all 64 rows, so the kernel costs about what a
// decode step's attention costs.
//
// One block of 8 warps per (KV head, key split). Tiles of 32 keys (K and V FP32, 67 KB at head_dim 256)
// are copied into shared memory with cp.async, the next while the current one is computed; keys past the
// split's range are zero-filled, so no stale value meets a zero weight. Warp (row tile r, key group g)
// computes the 16 rows 16r.. against keys 16g..16g+15 of each tile: Q hi/lo (64 KB, padded rows for
// conflict-free ldmatrix) stays in shared memory, K and V fragments are read as float2 pairs and split into
// hi/lo in registers (the padded row strides make these reads conflict-free), the 16 x head_dim output
// accumulators live in registers, with an online softmax per row as in attention_prefill.cu. At the end the
// two key groups of a row tile merge their states through shared memory.
//
// Per 32-key tile a block reads ~448 KB of shared memory (Q 128 KB, K and V 4 x 64 KB each, the copies'
// 64 KB): ~110 cycles per key at 128 B/cycle; 3 x 64 x 256 x 2 multiply-adds per key on the tensor cores
// (~70 cycles). Prediction (H200, Qwen3.5-4B, 33 splits per KV head, one block per multiprocessor):
// context 32768 ~75-85 us per layer (the 256 MiB of K and V take 65 us at 4.16 TB/s; the shared-memory
// work per multiprocessor, ~1000 keys, ~57 us, runs beside it), context 4096 ~15 us + the merge.
#include <cmath>
#include <cstdint>

#include "backend/cuda/attention_kernels.cuh"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kRowTiles = kVerifyRows / 16;
constexpr int kKeyGroups = 2;
constexpr int kWarps = kRowTiles * kKeyGroups;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileKeys = 16 * kKeyGroups;
constexpr int kStages = 2;

template <int kDim>
struct VerifyLayout {
  // Row strides: BF16 Q rows padded by 16 bytes (the 8 rows of an ldmatrix matrix start in 8 different
  // 16-byte bank groups); FP32 K rows by 8 floats and V rows by 4, so that the float2 fragment reads of a
  // half-warp (K: 4 keys x 4 dim pairs; V: 4 key pairs x 4 dim pairs) hit 32 different banks.
  static constexpr int kQueryStride = kDim + 8;
  static constexpr int kKeyStride = kDim + 8;
  static constexpr int kValueStride = kDim + 4;
  static constexpr int kQueryElements = kVerifyRows * kQueryStride;
  static constexpr int kStageFloats = kTileKeys * (kKeyStride + kValueStride);
  // After the keys: per row tile the key group 1 warp's accumulators, running maxima and totals, by lane.
  static constexpr int kExchangeFloats = kDim / 2 + 4;
  static constexpr size_t kBytes =
      sizeof(uint16_t) * 2 * kQueryElements + sizeof(float) * kStages * kStageFloats;
  static_assert(kRowTiles * kExchangeFloats * kWarpSize <= kStages * kStageFloats,
                "exchange fits the stages");
  static_assert(kDim % 32 == 0, "the strides' bank arithmetic assumes head_dim a multiple of 32");
};

template <int kDim>
__global__ void __launch_bounds__(kThreads, 1) attention_verify_mma_kernel(AttentionArgs a) {
  wait_for_previous_kernel();
  allow_next_kernel();
  using Layout = VerifyLayout<kDim>;
  constexpr int kQueryStride = Layout::kQueryStride, kKeyStride = Layout::kKeyStride,
                kValueStride = Layout::kValueStride;
  constexpr int kChunks = kDim / 4;  // float4 per row
  extern __shared__ uint4 shared_words[];
  auto* const q_hi = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* const q_lo = q_hi + Layout::kQueryElements;
  auto* const stages = reinterpret_cast<float*>(q_lo + Layout::kQueryElements);

  const int kv = static_cast<int>(blockIdx.x);
  const int split = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int row_tile = warp % kRowTiles, key_group = warp / kRowTiles;
  const int group = lane / 4, pair = lane % 4;                   // mma fragment coordinates
  const int rows = static_cast<int>(a.tokens) * a.heads_per_kv;  // <= kVerifyRows

  // This thread's two rows (fragment rows group and group + 8 of the warp's 16).
  int64_t row_keys[2], row_first[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_tile * 16 + group + 8 * h;
    row_keys[h] = row < rows ? row_key_count(a, row / a.heads_per_kv) : 0;
    row_first[h] = row < rows ? row_first_key(a, row / a.heads_per_kv, row_keys[h]) : 0;
  }
  const KeyRange range = split_key_range(block_key_span(a), a.splits, split, kTileKeys);
  const int64_t row_limit[2] = {row_keys[0] < range.end ? row_keys[0] : range.end,
                                row_keys[1] < range.end ? row_keys[1] : range.end};
  // One past the last key any row of this warp sees: the warp skips the key groups beyond it.
  int64_t warp_limit = row_limit[0] > row_limit[1] ? row_limit[0] : row_limit[1];
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const int64_t other = __shfl_xor_sync(0xffffffffu, warp_limit, offset);
    warp_limit = other > warp_limit ? other : warp_limit;
  }
  const bool rows_present = row_tile * 16 < rows;

  const int64_t kv_offset = int64_t{kv} * kDim;
  const int64_t tile_count = (range.end - range.begin + kTileKeys - 1) / kTileKeys;
  auto load_tile = [&](int64_t tile) {
    float* const keys = stages + (tile % kStages) * Layout::kStageFloats;
    float* const values = keys + kTileKeys * kKeyStride;
    const int64_t first = range.begin + tile * kTileKeys;
    for (int item = static_cast<int>(threadIdx.x); item < kTileKeys * kChunks; item += kThreads) {
      const int key = item / kChunks, chunk = item % kChunks;
      const bool present = first + key < range.end;
      const int64_t row = present ? first + key : 0;
      cp_async_16(keys + key * kKeyStride + 4 * chunk, a.k_cache + row * a.k_stride + kv_offset + 4 * chunk,
                  present ? 16 : 0);
      cp_async_16(values + key * kValueStride + 4 * chunk,
                  a.v_cache + row * a.v_stride + kv_offset + 4 * chunk, present ? 16 : 0);
    }
  };
  if (tile_count > 0) load_tile(0);
  cp_async_commit();

  // Q rows, split; rows past the last are zero.
  for (int item = static_cast<int>(threadIdx.x); item < kVerifyRows * kChunks; item += kThreads) {
    const int r = item / kChunks, chunk = item % kChunks;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < rows)
      x = reinterpret_cast<const float4*>(a.q + r / a.heads_per_kv * a.q_stride +
                                          static_cast<int64_t>(kv * a.heads_per_kv + r % a.heads_per_kv) *
                                              kDim)[chunk];
    uint2 hi, lo;
    split_bf16_pair<2>(x.x, x.y, hi.x, lo.x);
    split_bf16_pair<2>(x.z, x.w, hi.y, lo.y);
    *reinterpret_cast<uint2*>(q_hi + r * kQueryStride + 4 * chunk) = hi;
    *reinterpret_cast<uint2*>(q_lo + r * kQueryStride + 4 * chunk) = lo;
  }

  float out[kDim / 8][4];
#pragma unroll
  for (int n = 0; n < kDim / 8; ++n) out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0.0f;
  float running_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) scores
  float total[2] = {0.0f, 0.0f};                  // this thread's columns only until the end
  const float scale_log2 = a.scale * kLog2e;
  // ldmatrix rows of this lane: matrices (rows 0-7 | 8-15) x (dims 0-7 | 8-15) of a 16-dim slice.
  const int query_offset = (row_tile * 16 + (lane & 15)) * kQueryStride + (lane >> 4) * 8;

  for (int64_t tile = 0; tile < tile_count; ++tile) {
    if (tile + 1 < tile_count) load_tile(tile + 1);
    cp_async_commit();
    cp_async_wait<1>();  // this tile's copies are done (the next one's may still run)
    __syncthreads();     // ... for every thread; the Q rows too
    const int64_t first_key = range.begin + tile * kTileKeys + 16 * key_group;
    if (rows_present && first_key < warp_limit) {
      const float* const keys =
          stages + (tile % kStages) * Layout::kStageFloats + 16 * key_group * kKeyStride;
      const float* const values = stages + (tile % kStages) * Layout::kStageFloats + kTileKeys * kKeyStride +
                                  16 * key_group * kValueStride;

      // S = Q K^T: 16 rows x 16 keys as two n8 tiles; B fragment (key n = group, dims 2 pair.., +8).
      float scores[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kk = 0; kk < kDim / 16; ++kk) {
        uint32_t qh[4], ql[4];
        ldmatrix_x4(qh, q_hi + query_offset + 16 * kk);
        ldmatrix_x4(ql, q_lo + query_offset + 16 * kk);
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float* key = keys + (8 * n + group) * kKeyStride + 16 * kk + 2 * pair;
          const float2 low = *reinterpret_cast<const float2*>(key);
          const float2 high = *reinterpret_cast<const float2*>(key + 8);
          uint32_t kh0, kl0, kh1, kl1;
          split_bf16_pair<2>(low.x, low.y, kh0, kl0);
          split_bf16_pair<2>(high.x, high.y, kh1, kl1);
          mma_split(scores[n], qh, ql, kh0, kh1, kl0, kl1);
        }
      }

      // Mask, online softmax (per row: this thread's 4 columns, then the 4 lanes of the row).
      float correction[2], weights[2][4];
      online_softmax_tile(scores, first_key, pair, row_first, row_limit, scale_log2, running_max, total,
                          correction, weights);
      uint32_t p_hi[4], p_lo[4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        split_bf16_pair<2>(weights[n][0], weights[n][1], p_hi[2 * n], p_lo[2 * n]);
        split_bf16_pair<2>(weights[n][2], weights[n][3], p_hi[2 * n + 1], p_lo[2 * n + 1]);
      }
#pragma unroll
      for (int n = 0; n < kDim / 8; ++n) {
        out[n][0] *= correction[0];
        out[n][1] *= correction[0];
        out[n][2] *= correction[1];
        out[n][3] *= correction[1];
      }

      // O += P V. The dims of a pair of n8 tiles are interleaved: column c of tile 2j is dim 16j + 2c, of
      // tile 2j + 1 dim 16j + 2c + 1, so one float2 read of a V row feeds both tiles' B fragments (keys
      // 2 pair, 2 pair + 1 and + 8, + 9; column = group).
      const float* const value_pair = values + 2 * pair * kValueStride + 2 * group;
#pragma unroll
      for (int j = 0; j < kDim / 16; ++j) {
        const float* v = value_pair + 16 * j;
        const float2 key0 = *reinterpret_cast<const float2*>(v);
        const float2 key1 = *reinterpret_cast<const float2*>(v + kValueStride);
        const float2 key8 = *reinterpret_cast<const float2*>(v + 8 * kValueStride);
        const float2 key9 = *reinterpret_cast<const float2*>(v + 9 * kValueStride);
        uint32_t even_hi0, even_lo0, even_hi1, even_lo1, odd_hi0, odd_lo0, odd_hi1, odd_lo1;
        split_bf16_pair<2>(key0.x, key1.x, even_hi0, even_lo0);
        split_bf16_pair<2>(key8.x, key9.x, even_hi1, even_lo1);
        split_bf16_pair<2>(key0.y, key1.y, odd_hi0, odd_lo0);
        split_bf16_pair<2>(key8.y, key9.y, odd_hi1, odd_lo1);
        mma_split(out[2 * j], p_hi, p_lo, even_hi0, even_hi1, even_lo0, even_lo1);
        mma_split(out[2 * j + 1], p_hi, p_lo, odd_hi0, odd_hi1, odd_lo0, odd_lo1);
      }
    }
    __syncthreads();  // the next iteration's copies overwrite this stage
  }
  cp_async_wait<0>();
  __syncthreads();  // no copy in flight: the stages hold the key groups' exchange now

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    total[h] += __shfl_xor_sync(0xffffffffu, total[h], 1);
    total[h] += __shfl_xor_sync(0xffffffffu, total[h], 2);
  }
  // Key group 1 hands its state to key group 0 of the same row tile, [value][lane].
  float* const exchange = stages + row_tile * Layout::kExchangeFloats * kWarpSize + lane;
  if (key_group == 1) {
#pragma unroll
    for (int n = 0; n < kDim / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) exchange[(4 * n + e) * kWarpSize] = out[n][e];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      exchange[(kDim / 2 + h) * kWarpSize] = running_max[h];
      exchange[(kDim / 2 + 2 + h) * kWarpSize] = total[h];
    }
  }
  __syncthreads();
  if (key_group == 1 || !rows_present) return;
  float mine[2], theirs[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // A state without keys has max -inf and total 0; its weight is exp2(-inf) = 0.
    const float other_max = exchange[(kDim / 2 + h) * kWarpSize];
    const float other_total = exchange[(kDim / 2 + 2 + h) * kWarpSize];
    const float new_max = fmaxf(running_max[h], other_max);
    const float reference = (new_max == -INFINITY ? 0.0f : new_max) * scale_log2;
    mine[h] = exp2f(running_max[h] * scale_log2 - reference);
    theirs[h] = exp2f(other_max * scale_log2 - reference);
    running_max[h] = new_max;
    total[h] = total[h] * mine[h] + other_total * theirs[h];
  }
#pragma unroll
  for (int n = 0; n < kDim / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      out[n][e] = out[n][e] * mine[e / 2] + exchange[(4 * n + e) * kWarpSize] * theirs[e / 2];

      // Lane (group, pair) holds dims 16j + 4 pair .. + 3 of its rows: tiles 2j, 2j + 1, 2j, 2j + 1.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_tile * 16 + group + 8 * h;
    if (row >= rows) continue;
    const int64_t t = row / a.heads_per_kv;
    const int head = kv * a.heads_per_kv + row % a.heads_per_kv;
    if (a.splits == 1) {
      // A valid row has its first key in the only split, so total >= 1; an invalid one gets NaN.
      const float inverse = row_first[h] < row_keys[h] ? 1.0f / total[h] : NAN;
      float* const y = output_row(a, t, head) + 4 * pair;
#pragma unroll
      for (int j = 0; j < kDim / 16; ++j)
        *reinterpret_cast<float4*>(y + 16 * j) =
            make_float4(out[2 * j][2 * h] * inverse, out[2 * j + 1][2 * h] * inverse,
                        out[2 * j][2 * h + 1] * inverse, out[2 * j + 1][2 * h + 1] * inverse);
    } else {
      float* const partial = partial_row(a, t, head, split);
      if (pair == 0) {
        partial[0] = total[h] > 0.0f ? running_max[h] * a.scale : -INFINITY;
        partial[1] = total[h];
      }
      float* const values = partial + 2 + 4 * pair;  // 8-byte aligned: partial rows are 2 + head_dim floats
#pragma unroll
      for (int j = 0; j < kDim / 16; ++j) {
        *reinterpret_cast<float2*>(values + 16 * j) = make_float2(out[2 * j][2 * h], out[2 * j + 1][2 * h]);
        *reinterpret_cast<float2*>(values + 16 * j + 2) =
            make_float2(out[2 * j][2 * h + 1], out[2 * j + 1][2 * h + 1]);
      }
    }
  }
}

template <int kDim>
cudaError_t launch_verify_mma(const AttentionArgs& args, cudaStream_t stream) {
  constexpr size_t bytes = VerifyLayout<kDim>::kBytes;
  static const cudaError_t attribute =
      cudaFuncSetAttribute(attention_verify_mma_kernel<kDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(bytes));
  if (attribute != cudaSuccess) return attribute;
  return launch_kernel(attention_verify_mma_kernel<kDim>,
                       dim3(static_cast<unsigned>(args.num_kv_heads), static_cast<unsigned>(args.splits)),
                       kThreads, bytes, stream, args);
}

}  // namespace

size_t attention_verify_mma_shared_bytes(int head_dim) {
  switch (head_dim) {
    case 32:
      return VerifyLayout<32>::kBytes;
    case 64:
      return VerifyLayout<64>::kBytes;
    case 128:
      return VerifyLayout<128>::kBytes;
    case 256:
      return VerifyLayout<256>::kBytes;
    default:
      return 0;
  }
}

cudaError_t launch_attention_verify_mma(const AttentionArgs& args, cudaStream_t stream) {
  switch (args.head_dim) {
    case 32:
      return launch_verify_mma<32>(args, stream);
    case 64:
      return launch_verify_mma<64>(args, stream);
    case 128:
      return launch_verify_mma<128>(args, stream);
    case 256:
      return launch_verify_mma<256>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace qspec::cuda
