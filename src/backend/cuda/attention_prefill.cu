// Attention of many query rows (prefill) on tensor cores, flash-attention style, with split BF16 so that the
// result stays within ~1e-5 of the FP32 CPU op: every operand x is split into hi = bf16(x) and
// lo = bf16(x - hi) (x - hi - lo ~ 2^-17 x) and each product is hi*hi + hi*lo + lo*hi (mma.sync m16n8k16,
// FP32 accumulation, sm_80+), for the scores Q K^T and for P V alike: 3 mmas where plain BF16 takes one.
// None of the three can go: a row that sees 2 keys has weights 1 and p, and either p's or v's lo part
// weighs ~2^-9 of the output (the test's tolerance is 5e-5).
//
// Three launches: the key count (max position + 1 over the rows), the conversion of K/V rows below it into
// BF16 hi/lo planes in the workspace (zeros past head_dim and past the last key, so the last tile is
// finite), and the attention kernel. Query rows are the pairs (token, grouped head) of one KV head, so
// 4 heads share every K/V tile. K and V tiles are copied with cp.async (V while the scores are computed, the
// next K while P V is), read with ldmatrix from an XOR-swizzled layout (conflict-free); Q hi/lo stays in
// shared memory; the scores' accumulators become the P operand of P V; the output accumulators live in
// registers. Causal: a block sees keys up to its rows' largest position; the blocks with the most keys
// start first. With few blocks (short prompts) the keys are also split.
//
// The bound is shared-memory traffic, not the tensor cores: every mma.sync reads its operands from
// registers that ldmatrix fills, and an m16n8k16 split product needs 512 B of B operand per 3 mmas for each
// 16 query rows a warp holds. So a warp should hold as many rows as its registers allow; the output of
// 16 rows x 256 dims is already 128 registers per thread.
//
// Paired kernel (where its 224 KB of shared memory fit: sm_90): a block of 8 warps takes 128 query rows and
// walks the keys in tiles of 32. Warps 2r and 2r+1 share 32 rows: each computes the scores over its half of
// the dims (Q K^T partial sums), they swap the partial 32 x 32 scores through shared memory (4 KB each way),
// and each accumulates P V for its half of the dims (32 rows x 128 dims = 128 registers). Per warp and tile:
// Q 16 KB, K 16 KB, exchange 8 KB, V 16 KB = 56 KB for 384 mmas (149 B per mma), where the 64-row kernel
// reads 48 KB for 192 (256 B per mma).
// Fallback kernel (sm_80/86/89, 99-163 KB per block): a block of 4 warps takes 64 rows, 16 rows per warp,
// keys in tiles of 16; 96 KB of shared memory.
//
// Prediction (H200, Qwen3.5-4B: 16 heads of 256, 8 layers): 6 products x T^2/2 x 256 x 16 x 2 FLOP per
// layer = 1.65 PFLOP at 8,192 tokens. The 64-row kernel measured 5.9 ms per layer (276 TFLOP/s of mma) at a
// shared-memory bound of ~470 (256 B per mma at 128 B per clock); the paired kernel's bound is ~810, above
// what mma.sync reaches (~550-660), so ~3-4 ms per layer at 8,192. The 1.5 ms target needs ~1.1 PFLOP/s of
// BF16 products: above the H200's dense peak; only wgmma (sm_90a) with fewer products could approach it.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/attention_kernels.cuh"
#include "backend/cuda/pdl.cuh"

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

// 8 floats -> 16 bytes of hi and 16 bytes of lo.
__device__ inline void split_chunk(const float (&x)[8], uint4& hi, uint4& lo) {
  split_pair(x[0], x[1], hi.x, lo.x);
  split_pair(x[2], x[3], hi.y, lo.y);
  split_pair(x[4], x[5], hi.z, lo.z);
  split_pair(x[6], x[7], hi.w, lo.w);
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
__global__ void attention_split_kv_kernel(AttentionArgs a, SplitKvPlanes p) {
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
      uint4 hi, lo;
      split_chunk(x, hi, lo);
      uint16_t* plane = p.planes + 2 * which * plane_elements;
      *reinterpret_cast<uint4*>(plane + offset) = hi;
      *reinterpret_cast<uint4*>(plane + plane_elements + offset) = lo;
    }
  }
}

// Query rows [first_row, first_row + kTileRows) of KV head kv's heads (row = token * heads_per_kv + head),
// split and swizzled into q_hi / q_lo; rows past `rows` and dims past head_dim are zero.
template <int kDim, int kTileRows, int kBlockThreads>
__device__ void stage_query_tile(uint16_t* q_hi, uint16_t* q_lo, const AttentionArgs& a, int kv,
                                 int64_t first_row, int64_t rows) {
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
    uint4 hi, lo;
    split_chunk(x, hi, lo);
    *reinterpret_cast<uint4*>(q_hi + swizzled<kDim>(r, chunk)) = hi;
    *reinterpret_cast<uint4*>(q_lo + swizzled<kDim>(r, chunk)) = lo;
  }
}

template <int kDim>
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(AttentionArgs a, SplitKvPlanes p) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int kChunks = kDim / 8;
  constexpr int kDimTiles = kDim / 8;
  extern __shared__ uint4 shared_words[];
  auto* const q_hi = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* const q_lo = q_hi + kRows * kDim;
  uint16_t* const k_hi = q_lo + kRows * kDim;
  uint16_t* const k_lo = k_hi + kKeyTile * kDim;
  uint16_t* const v_hi = k_lo + kKeyTile * kDim;
  uint16_t* const v_lo = v_hi + kKeyTile * kDim;
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

  stage_query_tile<kDim, kRows, kThreads>(q_hi, q_lo, a, kv, tile_first_row, rows);
  __syncthreads();
  int block_keys = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) block_keys = warp_keys[w] > block_keys ? warp_keys[w] : block_keys;
  const KeyRange range = split_key_range(block_keys, a.splits, split, kKeyTile);
  const int64_t row_limit[2] = {row_keys[0] < range.end ? row_keys[0] : range.end,
                                row_keys[1] < range.end ? row_keys[1] : range.end};

  const int64_t plane_elements = int64_t{a.num_kv_heads} * p.padded_rows * kDim;
  const uint16_t* const planes[4] = {p.planes, p.planes + plane_elements, p.planes + 2 * plane_elements,
                                     p.planes + 3 * plane_elements};
  auto load_tile = [&](int which, int64_t first_key) {  // which: 0 = K, 1 = V
    uint16_t* hi = which == 0 ? k_hi : v_hi;
    uint16_t* lo = which == 0 ? k_lo : v_lo;
    const int64_t base = (kv * p.padded_rows + first_key) * kDim;
    for (int item = static_cast<int>(threadIdx.x); item < kKeyTile * kChunks; item += kThreads) {
      const int key = item / kChunks, chunk = item % kChunks;
      const int64_t source = base + int64_t{key} * kDim + chunk * 8;
      cp_async_16(hi + swizzled<kDim>(key, chunk), planes[2 * which] + source);
      cp_async_16(lo + swizzled<kDim>(key, chunk), planes[2 * which + 1] + source);
    }
    cp_async_commit();
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
      uint32_t qh[4], ql[4], kh[4], kl[4];
      const int q_offset = swizzled<kDim>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4));
      ldmatrix_x4(qh, q_hi + q_offset);
      ldmatrix_x4(ql, q_lo + q_offset);
      const int k_offset = swizzled<kDim>((lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1));
      ldmatrix_x4(kh, k_hi + k_offset);
      ldmatrix_x4(kl, k_lo + k_offset);
      mma_split(scores[0], qh, ql, kh[0], kh[1], kl[0], kl[1]);
      mma_split(scores[1], qh, ql, kh[2], kh[3], kl[2], kl[3]);
    }

    // Mask, online softmax (per row: this thread's 4 columns, then the 4 lanes of the row).
    float correction[2];
    uint32_t p_hi[4], p_lo[4];
    online_softmax_tile(scores, first_key, pair, row_limit, scale_log2, running_max, total, correction, p_hi,
                        p_lo);
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
      uint32_t vh[4], vl[4];
      const int v_offset = swizzled<kDim>((lane & 7) + (((lane >> 3) & 1) << 3), 2 * dp + (lane >> 4));
      ldmatrix_x4_trans(vh, v_hi + v_offset);
      ldmatrix_x4_trans(vl, v_lo + v_offset);
      mma_split(out[2 * dp], p_hi, p_lo, vh[0], vh[1], vl[0], vl[1]);
      mma_split(out[2 * dp + 1], p_hi, p_lo, vh[2], vh[3], vl[2], vl[3]);
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

template <int kDim>
__global__ void __launch_bounds__(kPairThreads, 1)
    attention_prefill_pair_kernel(AttentionArgs a, SplitKvPlanes p) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int kChunks = kDim / 8;
  constexpr int kHalfDim = kDim / 2;        // the dims of one warp's scores and outputs
  constexpr int kHalfTiles = kHalfDim / 8;  // its n8 output tiles
  constexpr int kScoreTiles = kPairKeyTile / 8;
  extern __shared__ uint4 shared_words[];
  auto* const q_hi = reinterpret_cast<uint16_t*>(shared_words);
  uint16_t* const q_lo = q_hi + kPairRows * kDim;
  uint16_t* const k_hi = q_lo + kPairRows * kDim;
  uint16_t* const k_lo = k_hi + kPairKeyTile * kDim;
  uint16_t* const v_hi = k_lo + kPairKeyTile * kDim;
  uint16_t* const v_lo = v_hi + kPairKeyTile * kDim;
  auto* const exchange = reinterpret_cast<float4*>(v_lo + kPairKeyTile * kDim);
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

  stage_query_tile<kDim, kPairRows, kPairThreads>(q_hi, q_lo, a, kv, tile_first_row, rows);
  __syncthreads();
  int block_keys = 0;
#pragma unroll
  for (int w = 0; w < kPairWarps; ++w) block_keys = warp_keys[w] > block_keys ? warp_keys[w] : block_keys;
  const KeyRange range = split_key_range(block_keys, a.splits, split, kPairKeyTile);
  const int range_begin = static_cast<int>(range.begin), range_end = static_cast<int>(range.end);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) row_keys[i][h] = row_keys[i][h] < range_end ? row_keys[i][h] : range_end;

  auto load_tile = [&](int which, int first_key) {  // which: 0 = K, 1 = V
    uint16_t* hi = which == 0 ? k_hi : v_hi;
    uint16_t* lo = which == 0 ? k_lo : v_lo;
    const int64_t plane_elements = int64_t{a.num_kv_heads} * p.padded_rows * kDim;
    const uint16_t* const source_hi =
        p.planes + 2 * which * plane_elements + (kv * p.padded_rows + first_key) * kDim;
    const uint16_t* const source_lo = source_hi + plane_elements;
    for (int item = static_cast<int>(threadIdx.x); item < kPairKeyTile * kChunks; item += kPairThreads) {
      const int key = item / kChunks, chunk = item % kChunks;
      const int source = key * kDim + chunk * 8;
      cp_async_16(hi + swizzled<kDim>(key, chunk), source_hi + source);
      cp_async_16(lo + swizzled<kDim>(key, chunk), source_lo + source);
    }
    cp_async_commit();
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
#pragma unroll 2  // fully unrolled, ptxas spills twice as much (255 registers either way)
    for (int kk = 0; kk < kHalfDim / 16; ++kk) {
      const int chunk = first_chunk + 2 * kk;
      uint32_t qh[2][4], ql[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int q_offset = swizzled<kDim>(warp_first_row + 16 * i + (lane & 15), chunk + (lane >> 4));
        ldmatrix_x4(qh[i], q_hi + q_offset);
        ldmatrix_x4(ql[i], q_lo + q_offset);
      }
#pragma unroll
      for (int j = 0; j < kPairKeyTile / 16; ++j) {
        uint32_t kh[4], kl[4];
        const int k_offset =
            swizzled<kDim>(16 * j + (lane & 7) + ((lane >> 4) << 3), chunk + ((lane >> 3) & 1));
        ldmatrix_x4(kh, k_hi + k_offset);
        ldmatrix_x4(kl, k_lo + k_offset);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_split(scores[i][2 * j], qh[i], ql[i], kh[0], kh[1], kl[0], kl[1]);
          mma_split(scores[i][2 * j + 1], qh[i], ql[i], kh[2], kh[3], kl[2], kl[3]);
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
      uint32_t p_hi[2][4], p_lo[2][4];
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
          split_pair(weight[0], weight[1], p_hi[i][2 * half_tile], p_lo[i][2 * half_tile]);
          split_pair(weight[2], weight[3], p_hi[i][2 * half_tile + 1], p_lo[i][2 * half_tile + 1]);
        }
#pragma unroll
      for (int dp = 0; dp < kHalfDim / 16; ++dp) {
        uint32_t vh[4], vl[4];
        const int v_offset = swizzled<kDim>(16 * c + (lane & 7) + (((lane >> 3) & 1) << 3),
                                            first_chunk + 2 * dp + (lane >> 4));
        ldmatrix_x4_trans(vh, v_hi + v_offset);
        ldmatrix_x4_trans(vl, v_lo + v_offset);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_split(out[i][2 * dp], p_hi[i], p_lo[i], vh[0], vh[1], vl[0], vl[1]);
          mma_split(out[i][2 * dp + 1], p_hi[i], p_lo[i], vh[2], vh[3], vl[2], vl[3]);
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

// The paired kernel where this GPU gives a block its shared memory (Q, K and V tiles, the score exchange, and
// the static warp_keys), else the 64-row kernel.
template <int kDim>
cudaError_t launch_prefill_kernel(const AttentionArgs& args, const SplitKvPlanes& planes,
                                  cudaStream_t stream) {
  constexpr size_t pair_shared_bytes = sizeof(uint16_t) * 2 * (kPairRows + 2 * kPairKeyTile) * kDim +
                                       sizeof(float) * kPairWarps * kExchangeFloats;
  static const bool pair_fits = [] {
    int device = 0, limit = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
      return false;
    return pair_shared_bytes + sizeof(int) * kPairWarps <= static_cast<size_t>(limit);
  }();
  if (pair_fits) {
    static const cudaError_t attribute =
        cudaFuncSetAttribute(attention_prefill_pair_kernel<kDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(pair_shared_bytes));
    if (attribute != cudaSuccess) return attribute;
    const int64_t row_tiles = (args.tokens * args.heads_per_kv + kPairRows - 1) / kPairRows;
    const dim3 grid(static_cast<unsigned>(row_tiles * args.num_kv_heads), static_cast<unsigned>(args.splits));
    return launch_kernel(attention_prefill_pair_kernel<kDim>, grid, kPairThreads, pair_shared_bytes, stream,
                         args, planes);
  }
  constexpr size_t shared_bytes = sizeof(uint16_t) * 2 * (kRows + 2 * kKeyTile) * kDim;
  static const cudaError_t attribute =
      cudaFuncSetAttribute(attention_prefill_kernel<kDim>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(shared_bytes));
  if (attribute != cudaSuccess) return attribute;
  const int64_t row_tiles = (args.tokens * args.heads_per_kv + kRows - 1) / kRows;
  const dim3 grid(static_cast<unsigned>(row_tiles * args.num_kv_heads), static_cast<unsigned>(args.splits));
  return launch_kernel(attention_prefill_kernel<kDim>, grid, kThreads, shared_bytes, stream, args, planes);
}

}  // namespace

cudaError_t launch_attention_prefill(const AttentionArgs& args, const SplitKvPlanes& planes,
                                     cudaStream_t stream) {
  if (const cudaError_t status =
          launch_kernel(attention_key_count_kernel, 1, 1024, 0, stream, args, planes.key_count);
      status != cudaSuccess)
    return status;
  constexpr int kConvertBlock = 256;
  const int64_t items = planes.padded_rows * args.num_kv_heads * (planes.padded_dim / 8);
  const int64_t blocks = (items + kConvertBlock - 1) / kConvertBlock;
  constexpr int64_t kMaxConvertBlocks = 8 * 132;  // grid-stride beyond: a few waves of the largest GPU
  if (const cudaError_t status =
          launch_kernel(attention_split_kv_kernel,
                        static_cast<unsigned>(blocks < kMaxConvertBlocks ? blocks : kMaxConvertBlocks),
                        kConvertBlock, 0, stream, args, planes);
      status != cudaSuccess)
    return status;
  switch (planes.padded_dim) {
    case 64:
      return launch_prefill_kernel<64>(args, planes, stream);
    case 128:
      return launch_prefill_kernel<128>(args, planes, stream);
    case 256:
      return launch_prefill_kernel<256>(args, planes, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace qspec::cuda
