// Attention of many query rows (prefill) on tensor cores, flash-attention style (mma.sync m16n8k16, FP32
// accumulation, sm_80+), with the operands q, k, v and the softmax weights p in kParts BF16 parts, chosen
// per call (attention.cu) to match the precision of the chunk's linears:
//  - up to kLinearMmaMaxRows tokens (the linears' FP32-class kernels): split BF16, x = hi + lo with
//    hi = bf16(x) and lo = bf16(x - hi) (x - hi - lo ~ 2^-17 x), each product hi*hi + hi*lo + lo*hi: within
//    ~1e-5 of the FP32 CPU op. None of the three can go: a row that sees 2 keys has weights 1 and p, and
//    either p's or v's lo part weighs ~2^-9 of the output.
//  - longer chunks (the linears are cuBLAS BF16 products, x and weights rounded to BF16): each operand
//    rounded to BF16 once and one mma per product, FlashAttention's BF16 precision (~2^-9 relative per
//    term, a few 1e-3 of the largest output), a third of the tensor-core work and half the shared-memory
//    traffic: prefill of 8,192 tokens 188 -> 170 ms on the H200 (session 9).
// The softmax (running max, exponentials, totals) is FP32 either way.
//
// Three launches: the key count (max position + 1 over the rows), the conversion of K/V rows below it into
// BF16 planes in the workspace (zeros past head_dim and past the last key, so the last tile is finite), and
// the attention kernel. Query rows are the pairs (token, grouped head) of one KV head, so 4 heads share
// every K/V tile. K and V tiles are copied with cp.async (V while the scores are computed, the next K while
// P V is), read with ldmatrix from an XOR-swizzled layout (conflict-free); Q stays in shared memory; the
// scores' accumulators become the P operand of P V; the output accumulators live in registers. Causal: a
// block sees keys up to its rows' largest position; the blocks with the most keys start first. With few
// blocks (short prompts) the keys are also split.
//
// Paired kernel (where its shared memory fits: sm_90): a block of 8 warps takes 128 query rows and walks
// the keys in tiles of 32. Warps 2r and 2r+1 share 32 rows: each computes the scores over its half of the
// dims (Q K^T partial sums), they swap the partial 32 x 32 scores through shared memory (4 KB each way), and
// each accumulates P V for its half of the dims (32 rows x 128 dims = 128 registers): ldmatrix traffic per
// mma is about half the 64-row kernel's (shared-memory traffic bounds these kernels, not the tensor cores).
// Fallback kernel (sm_80/86/89, or QSPEC_PREFILL_ATTENTION=rows64 for testing it): a block of 4 warps takes
// 64 rows, 16 rows per warp, keys in tiles of 16.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/attention_kernels.cuh"
#include "backend/cuda/pdl.cuh"
#include "core/env.h"

namespace qspec::cuda {

namespace {

// The 64-row fallback kernel.
constexpr int kRows = 64;
constexpr int kWarps = kRows / 16;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kKeyTile = 16;
// The paired kernel.
constexpr int kPairRows = kPrefillRows;
constexpr int kPairWarps = 8;
constexpr int kPairThreads = kPairWarps * kWarpSize;
constexpr int kPairKeyTile = kPrefillKeyTile;
constexpr int kPairWarpRows = 32;
constexpr int kExchangeFloats = kPairWarpRows * kPairKeyTile;  // one warp's partial scores
static_assert(kPairWarps / 2 * kPairWarpRows == kPairRows && kPairKeyTile % kKeyTile == 0);

// ---- the operands in kParts BF16 parts: one (x rounded to BF16) or two (split: hi = bf16(x), lo =
// bf16(x - hi)). A tile of kParts parts keeps them one after another, part_stride elements apart.

// 8 floats as 16 bytes per part at dst (part p at dst + p * part_stride).
template <int kParts>
__device__ inline void store_chunk(uint16_t* dst, int64_t part_stride, const float (&x)[8]) {
  uint4 hi, lo;
  split_bf16_pair<kParts>(x[0], x[1], hi.x, lo.x);
  split_bf16_pair<kParts>(x[2], x[3], hi.y, lo.y);
  split_bf16_pair<kParts>(x[4], x[5], hi.z, lo.z);
  split_bf16_pair<kParts>(x[6], x[7], hi.w, lo.w);
  *reinterpret_cast<uint4*>(dst) = hi;
  if constexpr (kParts == 2) *reinterpret_cast<uint4*>(dst + part_stride) = lo;
}

// A pair of weights as register i of the parts of a P fragment.
template <int kParts>
__device__ inline void store_pair(float first, float second, uint32_t (&p)[kParts][4], int i) {
  split_bf16_pair<kParts>(first, second, p[0][i], p[kParts - 1][i]);
}

// c += a b for n8 tile n of an ldmatrix x4 B fragment (registers 2n, 2n + 1 of each part).
template <int kParts>
__device__ inline void mma_parts(float (&c)[4], const uint32_t (&a)[kParts][4],
                                 const uint32_t (&b)[kParts][4], int n) {
  if constexpr (kParts == 1)
    mma_bf16(c, a[0], b[0][2 * n], b[0][2 * n + 1]);
  else
    mma_split(c, a[0], a[1], b[0][2 * n], b[0][2 * n + 1], b[1][2 * n], b[1][2 * n + 1]);
}

__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* shared) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][kDim] BF16 tile: chunks are XOR-swizzled
// by the row's low 3 bits so the 8 rows of one ldmatrix matrix hit 8 different bank groups.
template <int kDim>
__device__ inline int swizzled(int row, int chunk) {
  return row * kDim + ((chunk ^ (row & 7)) << 3);
}

// ldmatrix (transposed or not) of every part of a tile at `offset`.
template <int kParts, bool kTransposed>
__device__ inline void ldmatrix_parts(uint32_t (&r)[kParts][4], const uint16_t* tile, int part_stride,
                                      int offset) {
#pragma unroll
  for (int part = 0; part < kParts; ++part) {
    if constexpr (kTransposed)
      ldmatrix_x4_trans(r[part], tile + part * part_stride + offset);
    else
      ldmatrix_x4(r[part], tile + part * part_stride + offset);
  }
}

__global__ void attention_key_count_kernel(AttentionArgs a, int* key_count) {
  wait_for_previous_kernel();
  allow_next_kernel();
  __shared__ int warp_max[32];
  int most = 0;
  for (int64_t t = threadIdx.x; t < a.tokens; t += blockDim.x) {
    const auto keys = static_cast<int>(row_key_count(a, t));
    most = keys > most ? keys : most;
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const int other = __shfl_xor_sync(0xffffffffu, most, offset);
    most = other > most ? other : most;
  }
  if (threadIdx.x % kWarpSize == 0) warp_max[threadIdx.x / kWarpSize] = most;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x) / kWarpSize; ++w)
      most = warp_max[w] > most ? warp_max[w] : most;
    *key_count = most;
  }
}

// Rows below the key count rounded up to the larger key tile; thread = one 8-dim chunk of one (row, KV head).
template <int kParts>
__global__ void attention_kv_to_bf16_kernel(AttentionArgs a, KvPlanes p) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int key_count = *p.key_count;
  const int64_t rows = (int64_t{key_count} + kPairKeyTile - 1) / kPairKeyTile * kPairKeyTile;
  const int chunks = p.padded_dim / 8;
  const int64_t plane_elements = int64_t{a.num_kv_heads} * p.padded_rows * p.padded_dim;
  const int64_t items = rows * a.num_kv_heads * chunks;
  for (int64_t item = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; item < items;
       item += int64_t{gridDim.x} * blockDim.x) {
    const int chunk = static_cast<int>(item % chunks);
    const int kv = static_cast<int>(item / chunks % a.num_kv_heads);
    const int64_t row = item / chunks / a.num_kv_heads;
    const int64_t offset = (kv * p.padded_rows + row) * p.padded_dim + chunk * 8;
    for (int which = 0; which < 2; ++which) {
      const float* source = (which == 0 ? a.k_cache + row * a.k_stride : a.v_cache + row * a.v_stride) +
                            static_cast<int64_t>(kv) * a.head_dim;
      float x[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int d = chunk * 8 + e;
        x[e] = row < key_count && d < a.head_dim ? source[d] : 0.0f;
      }
      store_chunk<kParts>(p.planes + which * kParts * plane_elements + offset, plane_elements, x);
    }
  }
}

// Query rows [first_row, first_row + kTileRows) of KV head kv's heads (row = token * heads_per_kv + head),
// in kParts parts, swizzled; rows past `rows` and dims past head_dim are zero.
template <int kDim, int kParts, int kTileRows, int kBlockThreads>
__device__ void stage_query_tile(uint16_t* q_tile, const AttentionArgs& a, int kv, int64_t first_row,
                                 int64_t rows) {
  constexpr int kChunks = kDim / 8;
  for (int item = static_cast<int>(threadIdx.x); item < kTileRows * kChunks; item += kBlockThreads) {
    const int r = item / kChunks, chunk = item % kChunks;
    const int64_t row = first_row + r;
    float x[8];
    const float* query = nullptr;
    if (row < rows)
      query = a.q + row / a.heads_per_kv * a.q_stride +
              static_cast<int64_t>(kv * a.heads_per_kv + row % a.heads_per_kv) * a.head_dim;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int d = chunk * 8 + e;
      x[e] = query != nullptr && d < a.head_dim ? query[d] : 0.0f;
    }
    store_chunk<kParts>(q_tile + swizzled<kDim>(r, chunk), kTileRows * kDim, x);
  }
}

// Keys [first_key, first_key + kTileKeys) of KV head kv from the planes of `which` (0 = K, 1 = V) into a
// swizzled shared-memory tile of kParts parts, by cp.async (one commit group).
template <int kDim, int kParts, int kTileKeys, int kBlockThreads>
__device__ void load_kv_tile(uint16_t* tile, const AttentionArgs& a, const KvPlanes& p, int which, int kv,
                             int64_t first_key) {
  constexpr int kChunks = kDim / 8;
  const int64_t plane_elements = int64_t{a.num_kv_heads} * p.padded_rows * kDim;
  const uint16_t* const planes =
      p.planes + which * kParts * plane_elements + (kv * p.padded_rows + first_key) * kDim;
  for (int item = static_cast<int>(threadIdx.x); item < kTileKeys * kChunks; item += kBlockThreads) {
    const int key = item / kChunks, chunk = item % kChunks;
#pragma unroll
    for (int part = 0; part < kParts; ++part)
      cp_async_16(tile + part * kTileKeys * kDim + swizzled<kDim>(key, chunk),
                  planes + part * plane_elements + key * kDim + chunk * 8);
  }
  cp_async_commit();
}

template <int kDim, int kParts>
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(AttentionArgs a, KvPlanes p) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int kDimTiles = kDim / 8;
  extern __shared__ uint4 shared_words[];
  auto* const q_tile = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* const k_tile = q_tile + kParts * kRows * kDim;
  uint16_t* const v_tile = k_tile + kParts * kKeyTile * kDim;
  __shared__ int warp_keys[kWarps];

  const int row_tiles = static_cast<int>((a.tokens * a.heads_per_kv + kRows - 1) / kRows);
  const int kv = static_cast<int>(blockIdx.x % a.num_kv_heads);
  const int row_tile = row_tiles - 1 - static_cast<int>(blockIdx.x / a.num_kv_heads);  // most keys first
  const int split = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int group = lane / 4, pair = lane % 4;  // mma fragment coordinates
  const int64_t rows = a.tokens * a.heads_per_kv;
  const int64_t tile_first_row = int64_t{row_tile} * kRows;

  // This thread's two rows (fragment rows group and group + 8 of the warp's 16).
  int64_t row_keys[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = tile_first_row + warp * 16 + group + 8 * h;
    row_keys[h] = row < rows ? row_key_count(a, row / a.heads_per_kv) : 0;
  }
  int most = static_cast<int>(row_keys[0] > row_keys[1] ? row_keys[0] : row_keys[1]);
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const int other = __shfl_xor_sync(0xffffffffu, most, offset);
    most = other > most ? other : most;
  }
  if (lane == 0) warp_keys[warp] = most;

  stage_query_tile<kDim, kParts, kRows, kThreads>(q_tile, a, kv, tile_first_row, rows);
  __syncthreads();
  int block_keys = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) block_keys = warp_keys[w] > block_keys ? warp_keys[w] : block_keys;
  const KeyRange range = split_key_range({0, block_keys}, a.splits, split, kKeyTile);
  const int64_t no_first_keys[2] = {0, 0};  // prefill takes no first keys (attention.cu)
  const int64_t row_limit[2] = {row_keys[0] < range.end ? row_keys[0] : range.end,
                                row_keys[1] < range.end ? row_keys[1] : range.end};

  auto load_tile = [&](int which, int64_t first_key) {  // which: 0 = K, 1 = V
    load_kv_tile<kDim, kParts, kKeyTile, kThreads>(which == 0 ? k_tile : v_tile, a, p, which, kv, first_key);
  };

  float out[kDimTiles][4];
#pragma unroll
  for (int n = 0; n < kDimTiles; ++n) out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0.0f;
  float running_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) scores
  float total[2] = {0.0f, 0.0f};                  // this thread's columns only until the end
  const float scale_log2 = a.scale * kLog2e;

  if (range.begin < range.end) load_tile(0, range.begin);
  for (int64_t first_key = range.begin; first_key < range.end; first_key += kKeyTile) {
    cp_async_wait<0>();
    __syncthreads();  // K ready; every warp is done with the previous V
    load_tile(1, first_key);

    // S = Q K^T: 16 rows x 16 keys per warp, as two n8 tiles.
    float scores[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk) {
      uint32_t qf[kParts][4], kf[kParts][4];
      ldmatrix_parts<kParts, false>(qf, q_tile, kRows * kDim,
                                    swizzled<kDim>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
      ldmatrix_parts<kParts, false>(
          kf, k_tile, kKeyTile * kDim,
          swizzled<kDim>((lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)));
      mma_parts<kParts>(scores[0], qf, kf, 0);
      mma_parts<kParts>(scores[1], qf, kf, 1);
    }

    // Mask, online softmax (per row: this thread's 4 columns, then the 4 lanes of the row).
    float correction[2], weights[2][4];
    online_softmax_tile(scores, first_key, pair, no_first_keys, row_limit, scale_log2, running_max, total,
                        correction, weights);
    uint32_t pf[kParts][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      store_pair<kParts>(weights[n][0], weights[n][1], pf, 2 * n);
      store_pair<kParts>(weights[n][2], weights[n][3], pf, 2 * n + 1);
    }
#pragma unroll
    for (int n = 0; n < kDimTiles; ++n) {
      out[n][0] *= correction[0];
      out[n][1] *= correction[0];
      out[n][2] *= correction[1];
      out[n][3] *= correction[1];
    }

    cp_async_wait<0>();
    __syncthreads();  // V ready; every warp is done with this K
    if (first_key + kKeyTile < range.end) load_tile(0, first_key + kKeyTile);

      // O += P V: per pair of n8 dim tiles, V^T fragments by transposing ldmatrix.
#pragma unroll
    for (int dp = 0; dp < kDim / 16; ++dp) {
      uint32_t vf[kParts][4];
      ldmatrix_parts<kParts, true>(
          vf, v_tile, kKeyTile * kDim,
          swizzled<kDim>((lane & 7) + (((lane >> 3) & 1) << 3), 2 * dp + (lane >> 4)));
      mma_parts<kParts>(out[2 * dp], pf, vf, 0);
      mma_parts<kParts>(out[2 * dp + 1], pf, vf, 1);
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    total[h] += __shfl_xor_sync(0xffffffffu, total[h], 1);
    total[h] += __shfl_xor_sync(0xffffffffu, total[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = tile_first_row + warp * 16 + group + 8 * h;
    if (row >= rows) continue;
    const int64_t t = row / a.heads_per_kv;
    const int head = kv * a.heads_per_kv + static_cast<int>(row % a.heads_per_kv);
    if (a.splits == 1) {
      // A valid row has key 0 in the only split, so total >= 1; an invalid one gets NaN.
      const float inverse = row_keys[h] > 0 ? 1.0f / total[h] : NAN;
      float* y = output_row(a, t, head);
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        const int d = 8 * n + 2 * pair;
        if (d < a.head_dim) y[d] = out[n][2 * h] * inverse;
        if (d + 1 < a.head_dim) y[d + 1] = out[n][2 * h + 1] * inverse;
      }
    } else {
      float* partial = partial_row(a, t, head, split);
      if (pair == 0) {
        partial[0] = total[h] > 0.0f ? running_max[h] * a.scale : -INFINITY;
        partial[1] = total[h];
      }
#pragma unroll
      for (int n = 0; n < kDimTiles; ++n) {
        const int d = 8 * n + 2 * pair;
        if (d < a.head_dim) partial[2 + d] = out[n][2 * h];
        if (d + 1 < a.head_dim) partial[2 + d + 1] = out[n][2 * h + 1];
      }
    }
  }
}

// bar.sync on a named barrier of the two warps (64 threads) that share rows; ids 1..4 (0 is __syncthreads).
__device__ inline void pair_barrier(int id) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(id) : "memory");
}

template <int kDim, int kParts>
__global__ void __launch_bounds__(kPairThreads, 1)
    attention_prefill_pair_kernel(AttentionArgs a, KvPlanes p) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int kHalfDim = kDim / 2;        // the dims of one warp's scores and outputs
  constexpr int kHalfTiles = kHalfDim / 8;  // its n8 output tiles
  constexpr int kScoreTiles = kPairKeyTile / 8;
  extern __shared__ uint4 shared_words[];
  auto* const q_tile = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* const k_tile = q_tile + kParts * kPairRows * kDim;
  uint16_t* const v_tile = k_tile + kParts * kPairKeyTile * kDim;
  auto* const exchange = reinterpret_cast<float4*>(v_tile + kParts * kPairKeyTile * kDim);
  __shared__ int warp_keys[kPairWarps];

  const int row_tiles = static_cast<int>((a.tokens * a.heads_per_kv + kPairRows - 1) / kPairRows);
  const int kv = static_cast<int>(blockIdx.x % a.num_kv_heads);
  const int row_tile = row_tiles - 1 - static_cast<int>(blockIdx.x / a.num_kv_heads);  // most keys first
  const int split = static_cast<int>(blockIdx.y);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int group = lane / 4, pair = lane % 4;  // mma fragment coordinates
  const int row_group = warp / 2;               // the warp's 32 rows of the block's 128
  const int half = warp % 2;                    // and its half of the dims
  const int first_chunk = half * kHalfDim / 8;  // its first 8-dim chunk
  const int64_t rows = a.tokens * a.heads_per_kv;
  const int64_t tile_first_row = int64_t{row_tile} * kPairRows;
  const int warp_first_row = row_group * kPairWarpRows;

  // Keys of this thread's four rows (m16 tile i, fragment row group + 8 h), in 32 bits to save registers:
  // a key count is at most the cache's rows.
  int row_keys[2][2];
  int warp_most = 0;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = tile_first_row + warp_first_row + 16 * i + 8 * h + group;
      row_keys[i][h] = row < rows ? static_cast<int>(row_key_count(a, row / a.heads_per_kv)) : 0;
      warp_most = row_keys[i][h] > warp_most ? row_keys[i][h] : warp_most;
    }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const int other = __shfl_xor_sync(0xffffffffu, warp_most, offset);
    warp_most = other > warp_most ? other : warp_most;
  }
  if (lane == 0) warp_keys[warp] = warp_most;

  stage_query_tile<kDim, kParts, kPairRows, kPairThreads>(q_tile, a, kv, tile_first_row, rows);
  __syncthreads();
  int block_keys = 0;
#pragma unroll
  for (int w = 0; w < kPairWarps; ++w) block_keys = warp_keys[w] > block_keys ? warp_keys[w] : block_keys;
  const KeyRange range = split_key_range({0, block_keys}, a.splits, split, kPairKeyTile);
  const int range_begin = static_cast<int>(range.begin), range_end = static_cast<int>(range.end);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) row_keys[i][h] = row_keys[i][h] < range_end ? row_keys[i][h] : range_end;

  auto load_tile = [&](int which, int first_key) {  // which: 0 = K, 1 = V
    load_kv_tile<kDim, kParts, kPairKeyTile, kPairThreads>(which == 0 ? k_tile : v_tile, a, p, which, kv,
                                                           first_key);
  };

  float out[2][kHalfTiles][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int n = 0; n < kHalfTiles; ++n) out[i][n][0] = out[i][n][1] = out[i][n][2] = out[i][n][3] = 0.0f;
  float running_max[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};  // raw (unscaled) scores
  float total[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // this thread's columns only until the end
  const float scale_log2 = a.scale * kLog2e;
  float4* const my_partial = exchange + warp * (kExchangeFloats / 4);
  const float4* const partner_partial = exchange + (warp ^ 1) * (kExchangeFloats / 4);

  // Whether each row sees a key at all (with one split: else its output is NaN; clamping keeps that).
  bool row_valid[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) row_valid[i][h] = row_keys[i][h] > 0;

  if (range_begin < range_end) load_tile(0, range_begin);
  for (int first_key = range_begin; first_key < range_end; first_key += kPairKeyTile) {
    cp_async_wait<0>();
    __syncthreads();  // K ready; every warp is done with the previous V and the previous exchange
    load_tile(1, first_key);

    // Partial S = Q K^T over this warp's half of the dims: 32 rows x 32 keys, 2 x 4 (m16, n8) tiles; each
    // Q fragment feeds 4 key tiles, each K fragment 2 row tiles.
    float scores[2][kScoreTiles][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n)
        scores[i][n][0] = scores[i][n][1] = scores[i][n][2] = scores[i][n][3] = 0.0f;
#pragma unroll 2  // fully unrolled, ptxas spills more (255 registers either way)
    for (int kk = 0; kk < kHalfDim / 16; ++kk) {
      const int chunk = first_chunk + 2 * kk;
      uint32_t qf[2][kParts][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        ldmatrix_parts<kParts, false>(
            qf[i], q_tile, kPairRows * kDim,
            swizzled<kDim>(warp_first_row + 16 * i + (lane & 15), chunk + (lane >> 4)));
#pragma unroll
      for (int j = 0; j < kPairKeyTile / 16; ++j) {
        uint32_t kf[kParts][4];
        ldmatrix_parts<kParts, false>(
            kf, k_tile, kPairKeyTile * kDim,
            swizzled<kDim>(16 * j + (lane & 7) + ((lane >> 4) << 3), chunk + ((lane >> 3) & 1)));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_parts<kParts>(scores[i][2 * j], qf[i], kf, 0);
          mma_parts<kParts>(scores[i][2 * j + 1], qf[i], kf, 1);
        }
      }
    }

    // The partner warp holds the other half's sums at the same fragment coordinates: swap and add (a + b ==
    // b + a in FP32, so both warps get the same scores bit for bit).
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n)
        my_partial[(i * kScoreTiles + n) * kWarpSize + lane] =
            make_float4(scores[i][n][0], scores[i][n][1], scores[i][n][2], scores[i][n][3]);
    pair_barrier(1 + row_group);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n) {
        const float4 other = partner_partial[(i * kScoreTiles + n) * kWarpSize + lane];
        scores[i][n][0] += other.x;
        scores[i][n][1] += other.y;
        scores[i][n][2] += other.z;
        scores[i][n][3] += other.w;
      }

    // Mask, online softmax (per row: this thread's 8 columns, then the 4 lanes of the row).
    float correction[2][2], max_scaled[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kScoreTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          const int key = first_key + 8 * n + 2 * pair + (e & 1);
          if (key >= row_keys[i][h]) scores[i][n][e] = -INFINITY;
          tile_max[h] = fmaxf(tile_max[h], scores[i][n][e]);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        const float new_max = fmaxf(running_max[i][h], tile_max[h]);
        const float reference = new_max == -INFINITY ? 0.0f : new_max;  // all masked so far: weights 0
        max_scaled[i][h] = reference * scale_log2;
        correction[i][h] = exp2f(running_max[i][h] * scale_log2 - max_scaled[i][h]);
        running_max[i][h] = new_max;
        total[i][h] *= correction[i][h];
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int n = 0; n < kHalfTiles; ++n) {
        out[i][n][0] *= correction[i][0];
        out[i][n][1] *= correction[i][0];
        out[i][n][2] *= correction[i][1];
        out[i][n][3] *= correction[i][1];
      }

    cp_async_wait<0>();
    __syncthreads();  // V ready; every warp is done with this K and has read its partner's scores
    if (first_key + kPairKeyTile < range_end) load_tile(0, first_key + kPairKeyTile);

      // O += P V over this warp's half of the dims, 16 keys at a time (the weights made just before, to keep
      // registers down): P as A fragments (registers 0/1 = keys 0-7 rows g/g+8, 2/3 = keys 8-15), V^T
      // fragments by transposing ldmatrix, each feeding the 2 row tiles.
#pragma unroll
    for (int c = 0; c < kPairKeyTile / 16; ++c) {
      uint32_t pf[2][kParts][4];
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int half_tile = 0; half_tile < 2; ++half_tile) {
          const int n = 2 * c + half_tile;
          float weight[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            weight[e] = exp2f(fmaf(scores[i][n][e], scale_log2, -max_scaled[i][e / 2]));
            total[i][e / 2] += weight[e];
          }
          store_pair<kParts>(weight[0], weight[1], pf[i], 2 * half_tile);
          store_pair<kParts>(weight[2], weight[3], pf[i], 2 * half_tile + 1);
        }
#pragma unroll
      for (int dp = 0; dp < kHalfDim / 16; ++dp) {
        uint32_t vf[kParts][4];
        ldmatrix_parts<kParts, true>(vf, v_tile, kPairKeyTile * kDim,
                                     swizzled<kDim>(16 * c + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                    first_chunk + 2 * dp + (lane >> 4)));
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_parts<kParts>(out[i][2 * dp], pf[i], vf, 0);
          mma_parts<kParts>(out[i][2 * dp + 1], pf[i], vf, 1);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      total[i][h] += __shfl_xor_sync(0xffffffffu, total[i][h], 1);
      total[i][h] += __shfl_xor_sync(0xffffffffu, total[i][h], 2);
    }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = tile_first_row + warp_first_row + 16 * i + 8 * h + group;
      if (row >= rows) continue;
      const int64_t t = row / a.heads_per_kv;
      const int head = kv * a.heads_per_kv + static_cast<int>(row % a.heads_per_kv);
      if (a.splits == 1) {
        // A valid row has key 0 in the only split, so total >= 1; an invalid one gets NaN.
        const float inverse = row_valid[i][h] ? 1.0f / total[i][h] : NAN;
        float* y = output_row(a, t, head);
#pragma unroll
        for (int n = 0; n < kHalfTiles; ++n) {
          const int d = half * kHalfDim + 8 * n + 2 * pair;
          if (d < a.head_dim) y[d] = out[i][n][2 * h] * inverse;
          if (d + 1 < a.head_dim) y[d + 1] = out[i][n][2 * h + 1] * inverse;
        }
      } else {
        float* partial = partial_row(a, t, head, split);
        if (half == 0 && pair == 0) {
          partial[0] = total[i][h] > 0.0f ? running_max[i][h] * a.scale : -INFINITY;
          partial[1] = total[i][h];
        }
#pragma unroll
        for (int n = 0; n < kHalfTiles; ++n) {
          const int d = half * kHalfDim + 8 * n + 2 * pair;
          if (d < a.head_dim) partial[2 + d] = out[i][n][2 * h];
          if (d + 1 < a.head_dim) partial[2 + d + 1] = out[i][n][2 * h + 1];
        }
      }
    }
}

// Whether QSPEC_PREFILL_ATTENTION=rows64 asks for the 64-row kernel on every GPU (to test it where the
// paired kernel fits); read once.
bool rows64_kernel_forced() {
  static const bool forced = env_choice("QSPEC_PREFILL_ATTENTION", {"rows64"}).has_value();
  return forced;
}

// The paired kernel where this GPU gives a block its shared memory (Q, K and V tiles, the score exchange, and
// the static warp_keys), else the 64-row kernel.
template <int kDim, int kParts>
cudaError_t launch_prefill_kernel(const AttentionArgs& args, const KvPlanes& planes, cudaStream_t stream) {
  constexpr size_t pair_shared_bytes = sizeof(uint16_t) * kParts * (kPairRows + 2 * kPairKeyTile) * kDim +
                                       sizeof(float) * kPairWarps * kExchangeFloats;
  static const bool pair_fits = [] {
    int device = 0, limit = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
      return false;
    return pair_shared_bytes + sizeof(int) * kPairWarps <= static_cast<size_t>(limit);
  }();
  if (pair_fits && !rows64_kernel_forced()) {
    static const cudaError_t attribute = cudaFuncSetAttribute(attention_prefill_pair_kernel<kDim, kParts>,
                                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                              static_cast<int>(pair_shared_bytes));
    if (attribute != cudaSuccess) return attribute;
    const int64_t row_tiles = (args.tokens * args.heads_per_kv + kPairRows - 1) / kPairRows;
    const dim3 grid(static_cast<unsigned>(row_tiles * args.num_kv_heads), static_cast<unsigned>(args.splits));
    return launch_kernel(attention_prefill_pair_kernel<kDim, kParts>, grid, kPairThreads, pair_shared_bytes,
                         stream, args, planes);
  }
  constexpr size_t shared_bytes = sizeof(uint16_t) * kParts * (kRows + 2 * kKeyTile) * kDim;
  static const cudaError_t attribute =
      cudaFuncSetAttribute(attention_prefill_kernel<kDim, kParts>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes));
  if (attribute != cudaSuccess) return attribute;
  const int64_t row_tiles = (args.tokens * args.heads_per_kv + kRows - 1) / kRows;
  const dim3 grid(static_cast<unsigned>(row_tiles * args.num_kv_heads), static_cast<unsigned>(args.splits));
  return launch_kernel(attention_prefill_kernel<kDim, kParts>, grid, kThreads, shared_bytes, stream, args,
                       planes);
}

template <int kParts>
cudaError_t launch_prefill(const AttentionArgs& args, const KvPlanes& planes, cudaStream_t stream) {
  constexpr int kConvertBlock = 256;
  const int64_t items = planes.padded_rows * args.num_kv_heads * (planes.padded_dim / 8);
  const int64_t blocks = (items + kConvertBlock - 1) / kConvertBlock;
  constexpr int64_t kMaxConvertBlocks = 8 * 132;  // grid-stride beyond: a few waves of the largest GPU
  if (const cudaError_t status =
          launch_kernel(attention_kv_to_bf16_kernel<kParts>,
                        static_cast<unsigned>(blocks < kMaxConvertBlocks ? blocks : kMaxConvertBlocks),
                        kConvertBlock, 0, stream, args, planes);
      status != cudaSuccess)
    return status;
  switch (planes.padded_dim) {
    case 64:
      return launch_prefill_kernel<64, kParts>(args, planes, stream);
    case 128:
      return launch_prefill_kernel<128, kParts>(args, planes, stream);
    case 256:
      return launch_prefill_kernel<256, kParts>(args, planes, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_attention_prefill(const AttentionArgs& args, const KvPlanes& planes, cudaStream_t stream) {
  if (const cudaError_t status =
          launch_kernel(attention_key_count_kernel, 1, 1024, 0, stream, args, planes.key_count);
      status != cudaSuccess)
    return status;
  if (planes.parts == 1) return launch_prefill<1>(args, planes, stream);
  if (planes.parts == 2) return launch_prefill<2>(args, planes, stream);
  return cudaErrorInvalidValue;
}

}  // namespace qspec::cuda
