// out = x W^T for many rows of x (prefill chunks) straight from W4A16 weights on tensor cores. Each weight
// is dequantized in registers to BF16 as (nibble - 8) * scale rounded once, the value of its BF16 copy
// (GemmLinear::dequantize), and x is GemmLinear's BF16 operand, so the products are those of cuBLAS on the
// copy; only the FP32 order of the sums differs. The weights cost a quarter of the copy's bytes, and no copy
// needs to be kept.
//
// The weights are the A operand (16 output features x 16 k a warp), x the B operand (16 k x the rows). Lane
// (g = lane / 4, q = lane % 4) loads packed word q of each 32-k block of its features g and g + 8 (one
// 16-byte load per feature and 128-k chunk in the backend's word order, packed_int4_order.h). A word's nibble
// pairs (i, i + 4) are the k pairs of the A fragments: masked into the mantissa of BF16 128 they read 128 +
// n, one subtraction leaves n - 8 (exact), one multiply by the group scale rounds the weight. The block
// stages a chunk of its rows of x in shared memory in the same k order (one byte permute per pair, once per
// block). The next chunk's weights and x are loaded while this one is computed (weights into registers, x
// through registers into the next stage).
//
// On sm_90a (this file's 90 build is sm_90a code and compute_90 PTX: CMakeLists.txt) the products are wgmma
// m64n64k16 with A from registers and x read from shared memory by the tensor cores (a warpgroup owns two m64
// tiles); elsewhere mma.sync m16n8k16 (a warp owns two 16-feature tiles and loads x's fragments itself). A
// block is 256 features x 64 rows either way.
//
// K is split over blocks only when the tiles leave the GPU short of blocks; the splits' partials are added
// in split order inside a thread block cluster (sm_90+) or by sum_split_partials_kernel (results do not
// depend on timing).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileFeatures = 16;
constexpr int kWarpTiles = 2;
constexpr int kBlockFeatures = kWarps * kWarpTiles * kTileFeatures;
constexpr int kBlockRows = 64;
constexpr int kRowGroups = kBlockRows / 8;  // the mma's n8 columns
constexpr int kChunkK = 128;
constexpr int kChunkBlocks = 4;           // 32-k blocks a chunk
constexpr int kChunkUnits = kChunkK / 8;  // 16-byte units of x (8 values) a row and chunk
constexpr int kChunkWords = kChunkK / 8;  // packed words a feature and chunk
constexpr int kStageUnits = kBlockRows * kChunkUnits;
constexpr int kUnitsPerThread = kStageUnits / kThreads;
static_assert(kStageUnits % kThreads == 0);
// Splits of K of one block's tile form a thread block cluster on sm_90+ (the split rule asks for at most 8
// blocks, tests for up to 16): each block leaves its sums in its shared memory, rows kSumsStride floats apart
// (the lanes of a store, rows 2q and features g, hit distinct banks), and the blocks add them in split order
// over distributed shared memory, each a share of the tile.
constexpr int kMaxClusterSplits = 16;
constexpr int kPortableCluster = 8;
// Fewest chunks a split of K keeps, and what a split costs beside its chunks (its first loads, which nothing
// hides, and its sums), in chunks: fitted to the H200's times of the 4B's shapes at 64-256 rows, where a
// wave of blocks takes (chunks a split + 4.5) x ~1.3 us.
constexpr int64_t kMinChunksPerSplit = 4;
constexpr int64_t kSplitCostChunks = 4;
constexpr int kSumsStride = kBlockFeatures + 4;
// Stages of x in flight: two for mma.sync (a barrier a chunk ends every warp's reads of the stage written
// next), three for wgmma (its reads of a chunk's stage end only at a later chunk's wait).
template <bool kWgmma>
constexpr int kStages = kWgmma ? 3 : 2;
constexpr size_t kStageBytes = kStageUnits * sizeof(uint4);
constexpr size_t kClusterSharedBytes = size_t{kBlockRows} * kSumsStride * sizeof(float);
static_assert(kClusterSharedBytes >= kStages<true> * kStageBytes);
// wgmma's B operand (x) in shared memory, K-major without swizzle: a k16 step of a stage is kRowGroups core
// matrices of 8 rows x 16 bytes for k 0-7 of the step, each followed by the one for k 8-15.
constexpr int kCoreBytes = 128;
constexpr int kWgmmaStepBytes = kRowGroups * 2 * kCoreBytes;
static_assert(kWgmmaStepBytes * kChunkK / 16 == static_cast<int>(kStageBytes));

struct GemmArgs {
  float* out;  // [rows, features] at out_stride, or the partials [splits][rows][features] when split
  int64_t out_stride;
  int splits;
  bool cluster_sums;  // the splits of a tile are a cluster (out is the output, not partials)
  const uint4* x;     // BF16 [rows, in_features], contiguous
  const uint32_t* packed;
  int64_t packed_stride;   // words
  const uint16_t* scales;  // raw BF16
  int64_t scales_stride;
  int group_size;
  int64_t rows, features, in_features;
  int64_t chunks_per_split;  // the last split may have fewer
};

__device__ inline uint32_t bf16x2_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ inline __nv_bfloat162 as_bf16x2(uint32_t bits) {
  return *reinterpret_cast<const __nv_bfloat162*>(&bits);
}

// A packed word's nibbles as BF16 pairs ((n_i - 8) s, (n_{i+4} - 8) s), i = 0..3, each rounded once: the
// nibble masked into the mantissa of 128 (BF16 has 7 mantissa bits, so a nibble above bit 3 would reach the
// exponent: one shift a pair), 136 subtracted (exact), the scale pair multiplied (one rounding).
__device__ inline void scaled_nibble_pairs(uint32_t word, __nv_bfloat162 scale, uint32_t (&pair)[4]) {
  const __nv_bfloat162 bias = __floats2bfloat162_rn(136.0f, 136.0f);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t biased = and_or<0x000F000Fu, 0x43004300u>(word >> (4 * i));
    pair[i] = bf16x2_bits(__hmul2(__hsub2(as_bf16x2(biased), bias), scale));
  }
}

// A chunk of one lane's weights: word q of each 32-k block for features g and g + 8 of each tile, and their
// group scales as raw BF16 (kScalesPerChunk of them a feature: 4 for group 32, 2 for 64, 1 for a multiple of
// 128), loaded in one go.
template <int kScalesPerChunk>
struct ChunkWeights {
  uint4 words[kWarpTiles][2];
  uint32_t scales[kWarpTiles][2][kScalesPerChunk == 4 ? 2 : 1];
};

template <int kScalesPerChunk>
__device__ inline void load_chunk(ChunkWeights<kScalesPerChunk>& w, const GemmArgs& a,
                                  const int64_t (&feature)[kWarpTiles][2], int64_t chunk, int q) {
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t f = feature[t][h];
      w.words[t][h] =
          __ldg(reinterpret_cast<const uint4*>(a.packed + f * a.packed_stride + chunk * kChunkWords + 4 * q));
      const uint16_t* row_scales = a.scales + f * a.scales_stride;
      if constexpr (kScalesPerChunk == 4) {
        const uint2 s = __ldg(reinterpret_cast<const uint2*>(row_scales + chunk * 4));
        w.scales[t][h][0] = s.x;
        w.scales[t][h][1] = s.y;
      } else if constexpr (kScalesPerChunk == 2) {
        w.scales[t][h][0] = __ldg(reinterpret_cast<const uint32_t*>(row_scales + chunk * 2));
      } else {
        w.scales[t][h][0] = __ldg(row_scales + chunk * kChunkK / a.group_size);
      }
    }
}

// The scale of 32-k block u as a BF16 pair (s, s).
template <int kScalesPerChunk>
__device__ inline __nv_bfloat162 block_scale(const uint32_t (&raw)[kScalesPerChunk == 4 ? 2 : 1], int u) {
  uint32_t half_word;
  if constexpr (kScalesPerChunk == 4)
    half_word = raw[u / 2] >> (16 * (u % 2));
  else if constexpr (kScalesPerChunk == 2)
    half_word = raw[0] >> (16 * (u / 2));
  else
    half_word = raw[0];
  return as_bf16x2(__byte_perm(half_word, 0, 0x1010));
}

// The first output feature (within the block) of tile t of warp `warp`: for mma.sync a warp's tiles are
// adjacent; for wgmma warp w of warpgroup v holds rows 16w .. 16w + 15 of each of the warpgroup's m64 tiles.
template <bool kWgmma>
__device__ inline int tile_feature(int warp, int t) {
  if constexpr (kWgmma)
    return (warp / 4) * kWarpTiles * 64 + t * 64 + (warp % 4) * kTileFeatures;
  else
    return warp * kWarpTiles * kTileFeatures + t * kTileFeatures;
}

// Shared-memory slot of row r's 16-byte unit j of a staged chunk: units are swizzled by the row's parity, so
// the 8 lanes of a 16-byte load phase (rows g and g + 1, units 4u .. 4u + 3) hit 8 distinct bank groups.
__device__ inline int stage_slot(int r, int j) {
  return r * kChunkUnits + (j ^ ((r & 1) << 2));
}

// Which row (of the block's) and which 16-byte unit of a chunk's row thread `thread` stages as its i-th. For
// wgmma, warp w stages rows 8w .. 8w + 7, unit (block u = i, word q = lane % 4), so that its stores cover 32
// banks.
template <bool kWgmma>
__device__ inline void x_unit_of(int thread, int i, int& row, int& unit) {
  if constexpr (kWgmma) {
    const int lane = thread % kWarpSize;
    row = (thread / kWarpSize) * 8 + lane / 4;
    unit = 4 * i + lane % 4;
  } else {
    row = (thread + i * kThreads) / kChunkUnits;
    unit = (thread + i * kThreads) % kChunkUnits;
  }
}

// This thread's units of chunk `chunk` of the block's rows of x, in registers (zeros past the last row).
template <bool kWgmma>
__device__ inline void load_x_units(uint4 (&units)[kUnitsPerThread], const GemmArgs& a, int64_t first_row,
                                    int64_t chunk) {
#pragma unroll
  for (int i = 0; i < kUnitsPerThread; ++i) {
    int r = 0, unit = 0;
    x_unit_of<kWgmma>(static_cast<int>(threadIdx.x), i, r, unit);
    const int64_t row = first_row + r;
    units[i] = row < a.rows ? __ldg(a.x + row * (a.in_features / 8) + chunk * kChunkUnits + unit)
                            : make_uint4(0, 0, 0, 0);
  }
}

// The units into a stage, each one's 8 values (v0 .. v7) as the pairs (v0, v4), (v1, v5), (v2, v6), (v3, v7):
// for mma.sync a lane's 16-byte B fragments of one 32-k block; for wgmma the pairs go to the k16 steps' core
// matrices (pairs 0 and 1: step 2u, k 2q, 2q + 1 of its first and second core matrix; pairs 2 and 3: step
// 2u + 1), matching the A fragments' k order.
template <bool kWgmma>
__device__ inline void store_x_units(uint4* stage, const uint4 (&units)[kUnitsPerThread]) {
#pragma unroll
  for (int i = 0; i < kUnitsPerThread; ++i) {
    int r = 0, unit = 0;
    x_unit_of<kWgmma>(static_cast<int>(threadIdx.x), i, r, unit);
    const uint4 v = units[i];
    const uint32_t pairs[4] = {__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                               __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632)};
    if constexpr (kWgmma) {
      auto* words = reinterpret_cast<uint32_t*>(stage);
      const int u = unit / 4, q = unit % 4;
      const int at = (r / 8) * (2 * kCoreBytes / 4) + (r % 8) * 4 + q;
#pragma unroll
      for (int p = 0; p < 4; ++p)
        words[(2 * u + p / 2) * (kWgmmaStepBytes / 4) + (p % 2) * (kCoreBytes / 4) + at] = pairs[p];
    } else {
      stage[stage_slot(r, unit)] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
    }
  }
}

// One staged chunk times the lane's weights of it, into acc[tile][row group].
template <int kScalesPerChunk>
__device__ inline void multiply_chunk(float (&acc)[kWarpTiles][kRowGroups][4],
                                      const ChunkWeights<kScalesPerChunk>& w, const uint4* stage, int g,
                                      int q) {
#pragma unroll
  for (int u = 0; u < kChunkBlocks; ++u) {
    uint32_t low[kWarpTiles][4], high[kWarpTiles][4];
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) {
      scaled_nibble_pairs(word_of(w.words[t][0], u), block_scale<kScalesPerChunk>(w.scales[t][0], u), low[t]);
      scaled_nibble_pairs(word_of(w.words[t][1], u), block_scale<kScalesPerChunk>(w.scales[t][1], u),
                          high[t]);
    }
#pragma unroll
    for (int n = 0; n < kRowGroups; ++n) {
      const uint4 x = stage[stage_slot(8 * n + g, 4 * u + q)];
#pragma unroll
      for (int t = 0; t < kWarpTiles; ++t) {
        mma_bf16(acc[t][n], {low[t][0], high[t][0], low[t][1], high[t][1]}, x.x, x.y);
        mma_bf16(acc[t][n], {low[t][2], high[t][2], low[t][3], high[t][3]}, x.z, x.w);
      }
    }
  }
}

// wgmma (sm_90a): the A operand (the dequantized weights) from registers, in the mma.sync fragment layout
// per warp of the warpgroup; B (x) from shared memory through a descriptor: start address, the offset
// between core matrices adjacent in K (LBO) and in N (SBO), no swizzle. Without sm_90a code these are empty
// (the host never launches the wgmma kernel then: w4a16_gemm_init).
__device__ inline uint64_t x_descriptor(const void* step) {
  const auto address = static_cast<uint64_t>(__cvta_generic_to_shared(step));
  return ((address & 0x3FFFF) >> 4) | (uint64_t{kCoreBytes >> 4} << 16) |
         (uint64_t{(2 * kCoreBytes) >> 4} << 32);
}

__device__ inline void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ inline void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int kPending>
__device__ inline void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Stores of x by this thread before the async proxy (wgmma) reads them.
__device__ inline void fence_x_for_wgmma() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Keeps the compiler from moving reads or writes of the accumulators across a wgmma wait.
__device__ inline void pin(float (&d)[kRowGroups][4]) {
#pragma unroll
  for (int n = 0; n < kRowGroups; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[n][i])::"memory");
}

// d (64 features x 64 rows, FP32) += A (4 registers: 16 features x 16 k of this warp) B (x: 16 k x 64 rows).
__device__ inline void wgmma_m64n64k16(float (&d)[kRowGroups][4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
#endif
}

// The lane's A fragments of 32-k block u for every tile: low (feature g) and high (g + 8) pairs 0..3; pairs
// 0, 1 are the k16 step 2u, pairs 2, 3 step 2u + 1.
template <int kScalesPerChunk>
__device__ inline void block_fragments(uint32_t (&f)[kWarpTiles][2][4],
                                       const ChunkWeights<kScalesPerChunk>& w, int u) {
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      scaled_nibble_pairs(word_of(w.words[t][h], u), block_scale<kScalesPerChunk>(w.scales[t][h], u),
                          f[t][h]);
}

// One staged chunk times the warpgroup's weights of it: per 32-k block two k16 steps of kWarpTiles wgmmas,
// one commit group. The next block's fragments are made while this one's run, in the other half of
// `fragments`; a wait for all but the newest group frees that half (it served the block before). The first
// wait frees the half the previous chunk's third block used.
template <int kScalesPerChunk>
__device__ inline void wgmma_chunk(float (&acc)[kWarpTiles][kRowGroups][4],
                                   const ChunkWeights<kScalesPerChunk>& w, const uint4* stage) {
  uint32_t fragments[2][kWarpTiles][2][4];
  wgmma_wait<1>();
  block_fragments(fragments[0], w, 0);
#pragma unroll
  for (int u = 0; u < kChunkBlocks; ++u) {
    const auto& f = fragments[u % 2];
    wgmma_fence();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint64_t b =
          x_descriptor(reinterpret_cast<const char*>(stage) + (2 * u + half) * kWgmmaStepBytes);
#pragma unroll
      for (int t = 0; t < kWarpTiles; ++t)
        wgmma_m64n64k16(acc[t], f[t][0][2 * half], f[t][1][2 * half], f[t][0][2 * half + 1],
                        f[t][1][2 * half + 1], b);
    }
    wgmma_commit();
    if (u + 1 < kChunkBlocks) {
      wgmma_wait<1>();
      block_fragments(fragments[(u + 1) % 2], w, u + 1);
    }
  }
}

// The block's sums into its shared memory ([row][feature], kSumsStride apart; the stages are done with), one
// cluster barrier, then block `split` writes its share of the tile (float4 units split, split + splits, ...
// in turns of the block's threads), each value its splits' sums added in split order from zero; a second
// barrier keeps every block's shared memory until all have read it.
template <bool kWgmma>
__device__ inline void add_cluster_splits(const GemmArgs& a, const float (&acc)[kWarpTiles][kRowGroups][4],
                                          float* sums, int64_t block_feature, int64_t first_row, int split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t)
#pragma unroll
    for (int n = 0; n < kRowGroups; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        sums[(8 * n + 2 * q + i % 2) * kSumsStride + tile_feature<kWgmma>(warp, t) + g + 8 * (i / 2)] =
            acc[t][n][i];
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();
  constexpr int kUnitsPerRow = kBlockFeatures / 4;
  for (int unit = split * kThreads + static_cast<int>(threadIdx.x); unit < kBlockRows * kUnitsPerRow;
       unit += a.splits * kThreads) {
    const int r = unit / kUnitsPerRow, c = 4 * (unit % kUnitsPerRow);
    float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < a.splits; ++s) {
      const float4 part =
          *reinterpret_cast<const float4*>(cluster.map_shared_rank(sums, s) + r * kSumsStride + c);
      total.x += part.x;
      total.y += part.y;
      total.z += part.z;
      total.w += part.w;
    }
    const int64_t row = first_row + r;
    const float values[4] = {total.x, total.y, total.z, total.w};
    if (row < a.rows)
      for (int e = 0; e < 4; ++e)
        if (block_feature + c + e < a.features) a.out[row * a.out_stride + block_feature + c + e] = values[e];
  }
  cluster.sync();
#endif
}

// Grid: (feature blocks x splits of K, row blocks); kWgmma: the tensor-core products by wgmma (sm_90a), else
// by mma.sync. The chunks of a split are walked two at a time so that the loaded weights of the next chunk
// sit in registers of their own (a copy between them would wait for the load).
template <int kScalesPerChunk, bool kWgmma>
__global__ void __launch_bounds__(kThreads) w4a16_gemm_kernel(GemmArgs a) {
  extern __shared__ __align__(128) uint4 shared[];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, q = lane % 4;
  const int split = static_cast<int>(blockIdx.x) % a.splits;
  const int64_t block_feature = static_cast<int64_t>(blockIdx.x) / a.splits * kBlockFeatures;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kBlockRows;
  const int64_t chunks = a.in_features / kChunkK;
  const int64_t begin = split * a.chunks_per_split;
  const int64_t end = begin + a.chunks_per_split < chunks ? begin + a.chunks_per_split : chunks;
  // Features past the last are read as the last one (their sums are not stored).
  int64_t feature[kWarpTiles][2];
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t f = block_feature + tile_feature<kWgmma>(warp, t) + g + 8 * h;
      feature[t][h] = f < a.features ? f : a.features - 1;
    }

  // Weights are never written by a kernel: the first chunk's load may overlap the previous kernel (pdl.cuh).
  ChunkWeights<kScalesPerChunk> even, odd;
  load_chunk(even, a, feature, begin, q);
  wait_for_previous_kernel();
  allow_next_kernel();
  uint4 units[kUnitsPerThread];
  load_x_units<kWgmma>(units, a, first_row, begin);
  store_x_units<kWgmma>(shared, units);
  if constexpr (kWgmma) fence_x_for_wgmma();
  __syncthreads();

  float acc[kWarpTiles][kRowGroups][4] = {};
  // Chunk c is computed from its stage while chunk c + 1 is loaded and then staged into the next one; the
  // barrier after it makes that stage whole (kStages says why it ends the reads of the stage written next).
  const auto step = [&](int64_t c, ChunkWeights<kScalesPerChunk>& current,
                        ChunkWeights<kScalesPerChunk>& next) {
    const bool more = c + 1 < end;
    if (more) {
      load_chunk(next, a, feature, c + 1, q);
      load_x_units<kWgmma>(units, a, first_row, c + 1);
    }
    const uint4* stage = shared + (c - begin) % kStages<kWgmma> * kStageUnits;
    if constexpr (kWgmma)
      wgmma_chunk(acc, current, stage);
    else
      multiply_chunk(acc, current, stage, g, q);
    if (more) {
      store_x_units<kWgmma>(shared + (c + 1 - begin) % kStages<kWgmma> * kStageUnits, units);
      if constexpr (kWgmma) fence_x_for_wgmma();
    }
    __syncthreads();
  };
  for (int64_t c = begin; c < end; c += 2) {
    step(c, even, odd);
    if (c + 1 < end) step(c + 1, odd, even);
  }
  if constexpr (kWgmma) {
    wgmma_wait<0>();
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) pin(acc[t]);
    __syncthreads();  // every warpgroup's products are done with the stages the sums reuse
  }

  if (a.cluster_sums) {
    add_cluster_splits<kWgmma>(a, acc, reinterpret_cast<float*>(shared), block_feature, first_row, split);
    return;
  }
  float* target = a.out + (a.splits > 1 ? split * a.rows * a.features : 0);
  const int64_t target_stride = a.splits > 1 ? a.features : a.out_stride;
#pragma unroll
  for (int t = 0; t < kWarpTiles; ++t)
#pragma unroll
    for (int n = 0; n < kRowGroups; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t f = block_feature + tile_feature<kWgmma>(warp, t) + g + 8 * (i / 2);
        const int64_t row = first_row + 8 * n + 2 * q + i % 2;
        if (f < a.features && row < a.rows) target[row * target_stride + f] = acc[t][n][i];
      }
}

// Set to 1 in the code built for sm_90a (wgmma), read by the host once (w4a16_gemm_init).
__device__ int w4a16_wgmma_built =
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    1;
#else
    0;
#endif

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int scales_per_chunk(int group_size) {
  if (group_size == 32 || group_size == 64) return kChunkK / group_size;
  return group_size % kChunkK == 0 ? 1 : 0;
}

struct Split {
  int64_t splits, chunks_per_split;
  bool cluster_sums;
};

// What the split depends on: the SMs, the largest cluster of the kernel's blocks the GPU can schedule (0
// without clusters; up to 16 with the non-portable size where the GPU allows it, as the H200 does), and how
// many tiles can run at once split s ways: in clusters of s blocks, the clusters the GPU holds at once (a
// cluster's blocks share a GPC, so sizes that do not divide a GPC's SMs leave some idle), else the resident
// blocks over s.
struct GemmDevice {
  int multiprocessors = 1;
  int max_cluster = 0;
  bool wgmma = false;  // the code the device runs was built for sm_90a
  int resident_blocks = 1;
  int concurrent_clusters[kPortableCluster + 1] = {};  // [s]: clusters of s blocks at once
};

// Every instance of the kernel, and what each needs before its first launch: the dynamic shared memory of
// cluster sums (above the default 48 KB), clusters of up to 16 blocks (tuning may ask for them).
template <bool kWgmma>
cudaError_t prepare_kernels() {
  for (auto* kernel :
       {w4a16_gemm_kernel<4, kWgmma>, w4a16_gemm_kernel<2, kWgmma>, w4a16_gemm_kernel<1, kWgmma>}) {
    cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(kClusterSharedBytes));
    if (status == cudaSuccess && clusters_supported())
      status = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

// The clusters of `blocks` blocks (cluster sums' shared memory) the GPU holds at once.
int clusters_at_once(void (*kernel)(GemmArgs), int blocks) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(blocks);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kClusterSharedBytes;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config),
             "cudaOccupancyMaxActiveClusters (W4A16 kernel)");
  return clusters;
}

const GemmDevice& gemm_device() {
  static const GemmDevice device = [] {
    GemmDevice d;
    int id = 0;
    check_cuda(cudaGetDevice(&id), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&d.multiprocessors, cudaDevAttrMultiProcessorCount, id),
               "cudaDeviceGetAttribute (SMs)");
    int built = 0;
    check_cuda(cudaMemcpyFromSymbol(&built, w4a16_wgmma_built, sizeof(built)), "W4A16 kernel (sm_90a probe)");
    d.wgmma = built == 1;
    check_cuda(prepare_kernels<false>(), "W4A16 kernel attributes");
    check_cuda(prepare_kernels<true>(), "W4A16 kernel attributes");
    auto* const kernel = d.wgmma ? w4a16_gemm_kernel<4, true> : w4a16_gemm_kernel<4, false>;
    int per_multiprocessor = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, kThreads,
                                                             kClusterSharedBytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor (W4A16 kernel)");
    d.resident_blocks = std::max(1, per_multiprocessor) * d.multiprocessors;
    if (!clusters_supported()) return d;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kMaxClusterSplits);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kClusterSharedBytes;
    int blocks = 0;
    check_cuda(cudaOccupancyMaxPotentialClusterSize(&blocks, kernel, &config),
               "cudaOccupancyMaxPotentialClusterSize (W4A16 kernel)");
    d.max_cluster = std::min(blocks, kMaxClusterSplits);
    for (int s = 2; s <= std::min(d.max_cluster, kPortableCluster); ++s)
      d.concurrent_clusters[s] = clusters_at_once(kernel, s);
    return d;
  }();
  return device;
}

// The split of K with the least estimated time: waves of blocks x (chunks a split + kSplitCostChunks), over
// splits of at least kMinChunksPerSplit chunks, at most 8 (the portable cluster size); added inside
// clusters where the GPU has them (up to max_cluster), else left as partials for the sums kernel. Ties go
// to fewer splits. A forced split (tuning) may be any count.
Split gemm_split(int64_t rows, int64_t out_features, int64_t in_features, const W4a16GemmTuning& tuning) {
  const GemmDevice& device = gemm_device();
  const int64_t chunks = in_features / kChunkK;
  const bool clusters = tuning.cluster_sums && device.max_cluster > 0;
  auto split_of = [&](int64_t wanted) {
    const int64_t per_split = (chunks + wanted - 1) / wanted;
    const int64_t splits = (chunks + per_split - 1) / per_split;
    return Split{splits, per_split, splits > 1 && clusters && splits <= device.max_cluster};
  };
  if (tuning.splits > 0) return split_of(tuning.splits);
  const int64_t tiles =
      ((out_features + kBlockFeatures - 1) / kBlockFeatures) * ((rows + kBlockRows - 1) / kBlockRows);
  Split best = split_of(1);
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (int64_t wanted = 1; wanted <= kPortableCluster; ++wanted) {
    const Split split = split_of(wanted);
    if (split.splits != wanted || (wanted > 1 && split.chunks_per_split < kMinChunksPerSplit)) continue;
    const int64_t at_once = wanted == 1          ? device.resident_blocks
                            : split.cluster_sums ? device.concurrent_clusters[wanted]
                                                 : device.resident_blocks / wanted;
    if (at_once <= 0) continue;
    const int64_t waves = (tiles + at_once - 1) / at_once;
    const int64_t cost = waves * (split.chunks_per_split + kSplitCostChunks);
    if (cost < best_cost) {
      best = split;
      best_cost = cost;
    }
  }
  return best;
}

template <int kScalesPerChunk, bool kWgmma>
cudaError_t launch_gemm(const GemmArgs& a, dim3 grid, cudaStream_t stream) {
  return launch_kernel_in_clusters(w4a16_gemm_kernel<kScalesPerChunk, kWgmma>, grid, kThreads,
                                   a.cluster_sums ? kClusterSharedBytes : kStages<kWgmma> * kStageBytes,
                                   a.cluster_sums ? static_cast<unsigned>(a.splits) : 1u, stream, a);
}

template <int kScalesPerChunk>
cudaError_t launch_gemm(const GemmArgs& a, dim3 grid, bool wgmma, cudaStream_t stream) {
  return wgmma ? launch_gemm<kScalesPerChunk, true>(a, grid, stream)
               : launch_gemm<kScalesPerChunk, false>(a, grid, stream);
}

}  // namespace

void w4a16_gemm_init() {
  static_cast<void>(gemm_device());
}

bool w4a16_gemm_uses_wgmma() {
  return gemm_device().wgmma;
}

bool w4a16_gemm_supports(const LinearWeight& w) {
  const int per_chunk = scales_per_chunk(w.group_size);
  return w.quantized() && w.scales.dtype == DType::BF16 && w.in_features > 0 &&
         w.in_features % kChunkK == 0 && per_chunk > 0 && w.packed.stride % 4 == 0 &&
         aligned(w.packed.data, 16) && w.scales.stride % per_chunk == 0 &&
         aligned(w.scales.data, 2 * static_cast<uintptr_t>(per_chunk));
}

int64_t w4a16_gemm_splits(int64_t rows, const LinearWeight& w, const W4a16GemmTuning& tuning) {
  return gemm_split(rows, w.out_features, w.in_features, tuning).splits;
}

size_t w4a16_gemm_partial_floats(int64_t rows, const LinearWeight& w, const W4a16GemmTuning& tuning) {
  const Split split = gemm_split(rows, w.out_features, w.in_features, tuning);
  return split.splits > 1 && !split.cluster_sums ? static_cast<size_t>(split.splits * rows * w.out_features)
                                                 : 0;
}

cudaError_t launch_w4a16_gemm(const Tensor& out, const void* x_bf16, const LinearWeight& w, float* partials,
                              cudaStream_t stream, const W4a16GemmTuning& tuning) {
  if (out.rows == 0 || w.out_features == 0) return cudaSuccess;
  const Split split = gemm_split(out.rows, w.out_features, w.in_features, tuning);
  const bool partial = split.splits > 1 && !split.cluster_sums;
  if (partial && partials == nullptr) return cudaErrorInvalidValue;
  const GemmArgs a{partial ? partials : out.ptr<float>(),
                   out.rows <= 1 ? w.out_features : out.stride,
                   static_cast<int>(split.splits),
                   split.cluster_sums,
                   static_cast<const uint4*>(x_bf16),
                   w.packed.ptr<const uint32_t>(),
                   w.packed.stride,
                   static_cast<const uint16_t*>(w.scales.data),
                   w.scales.stride,
                   w.group_size,
                   out.rows,
                   w.out_features,
                   w.in_features,
                   split.chunks_per_split};
  const dim3 grid(
      static_cast<unsigned>((w.out_features + kBlockFeatures - 1) / kBlockFeatures * split.splits),
      static_cast<unsigned>((out.rows + kBlockRows - 1) / kBlockRows));
  const int per_chunk = scales_per_chunk(w.group_size);
  const bool wgmma = tuning.wgmma && gemm_device().wgmma;
  const cudaError_t status = per_chunk == 4   ? launch_gemm<4>(a, grid, wgmma, stream)
                             : per_chunk == 2 ? launch_gemm<2>(a, grid, wgmma, stream)
                                              : launch_gemm<1>(a, grid, wgmma, stream);
  if (status != cudaSuccess || !partial) return status;
  return launch_split_partial_sums(out, partials, static_cast<int>(split.splits), stream);
}

}  // namespace qspec::cuda
