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
// n, one subtraction leaves n - 8 (exact), one multiply by the group scale rounds the weight. x must be in
// the same k order. The next chunk's weights are loaded into registers while this one is computed.
//
// On sm_90a (this file's 90 build is sm_90a code and compute_90 PTX: CMakeLists.txt) the products are wgmma
// with A from registers and x read from shared memory by the tensor cores: a block is 128 features x 128 rows
// (m64n128k16, a warpgroup's m64 tile) or, for calls of at most 64 rows, 256 x 64 (m64n64k16, two tiles a
// warpgroup). x is first put once per call in the layout and k order of the block's shared-memory stages
// (w4a16_x_images_kernel), so that one bulk copy (TMA) fills a stage, a chunk ahead. Elsewhere mma.sync
// m16n8k16: 256 features x 64 rows, a warp owning two 16-feature tiles, each block pairing its x (one byte
// permute per pair) into shared memory through registers a chunk ahead.
//
// K is split over blocks where the tiles leave the GPU short of blocks; the splits' partials are added in
// split order inside a thread block cluster (sm_90+) or by sum_split_partials_kernel (results do not depend
// on timing).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cp_async.cuh"  // shared_address, bulk copies and their barriers
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/split_by_waves.h"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileFeatures = 16;
constexpr int kChunkK = 128;
constexpr int kChunkBlocks = 4;           // 32-k blocks a chunk
constexpr int kChunkUnits = kChunkK / 8;  // 16-byte units of x (8 values) a row and chunk
constexpr int kChunkWords = kChunkK / 8;  // packed words a feature and chunk
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
// Stages of x: two for mma.sync (a barrier a chunk ends every warp's reads of the stage written next); for
// wgmma a ring whose images are copied kImagesAhead chunks ahead, beside the stage of the chunk being
// computed and the one the previous chunk's last products may still read. One chunk ahead (96 KB for 128
// rows) beat two (128 KB) at every shape on the H200: M = 2,048 gate|up 427 -> 379 us, M = 128 50 -> 39.
constexpr int kImagesAhead = 1;
// Fewer wgmma stages would refill one that wgmma_chunk's last commit groups may still read.
template <bool kWgmma>
constexpr int kStages = kWgmma ? kImagesAhead + 2 : 2;
// wgmma's B operand (x) in shared memory, K-major without swizzle: a k16 step of a stage is the row groups'
// core matrices of 8 rows x 16 bytes for k 0-7 of the step, each followed by the one for k 8-15.
constexpr int kCoreBytes = 128;

// A block's share of the output: kRows rows of x (64 or 128) by kFeatures output features, with 64 FP32
// sums a thread either way. A warp owns kTiles 16-feature tiles (for wgmma a warpgroup owns kTiles m64 tiles
// and the products are m64 n kRows): with 128 rows each dequantized weight serves twice the rows.
template <int kBlockRows>
struct BlockShape {
  static constexpr int kRows = kBlockRows;
  static constexpr int kTiles = kRows >= 128 ? 1 : 128 / kRows;
  static constexpr int kFeatures = kWarps * kTiles * kTileFeatures;
  static constexpr int kRowGroups = kRows / 8;  // the mma's n8 columns
  static constexpr int kStageUnits = kRows * kChunkUnits;
  static constexpr int kUnitsPerThread = kStageUnits / kThreads;
  static constexpr int kSumsStride = kFeatures + 4;
  static constexpr size_t kStageBytes = kStageUnits * sizeof(uint4);
  static constexpr size_t kSumsBytes = size_t{kRows} * kSumsStride * sizeof(float);
  static constexpr int kWgmmaStepBytes = kRowGroups * 2 * kCoreBytes;
  static_assert(kStageUnits % kThreads == 0 && kTiles * kRowGroups >= 16);
  static_assert(kWgmmaStepBytes * kChunkK / 16 == static_cast<int>(kStageBytes));
  // Dynamic shared memory: the stages of x, which the block's sums reuse for cluster sums, and for wgmma the
  // stages' copy barriers after them.
  static constexpr size_t kWgmmaBarriers =
      ((kStages<true> * kStageBytes > kSumsBytes ? kStages<true> * kStageBytes : kSumsBytes) + 7) / 8 * 8;
  static constexpr size_t shared_bytes(bool wgmma, bool cluster_sums) {
    if (wgmma) return kWgmmaBarriers + kStages<true> * sizeof(uint64_t);
    const size_t stages = kStages<false> * kStageBytes;
    return cluster_sums && kSumsBytes > stages ? kSumsBytes : stages;
  }
};

struct GemmArgs {
  float* out;  // [rows, features] at out_stride, or the partials [splits][rows][features] when split
  int64_t out_stride;
  int splits;
  bool cluster_sums;  // the splits of a tile are a cluster (out is the output, not partials)
  const uint4* x;     // BF16 [rows, in_features], contiguous; for wgmma its images (w4a16_x_images_kernel)
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
template <int kScalesPerChunk, int kTiles>
struct ChunkWeights {
  uint4 words[kTiles][2];
  uint32_t scales[kTiles][2][kScalesPerChunk == 4 ? 2 : 1];
};

template <int kScalesPerChunk, int kTiles>
__device__ inline void load_chunk(ChunkWeights<kScalesPerChunk, kTiles>& w, const GemmArgs& a,
                                  const int64_t (&feature)[kTiles][2], int64_t chunk, int q) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
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
template <bool kWgmma, int kTiles>
__device__ inline int tile_feature(int warp, int t) {
  if constexpr (kWgmma)
    return (warp / 4) * kTiles * 64 + t * 64 + (warp % 4) * kTileFeatures;
  else
    return warp * kTiles * kTileFeatures + t * kTileFeatures;
}

// Shared-memory slot of row r's 16-byte unit j of a staged chunk: units are swizzled by the row's parity, so
// the 8 lanes of a 16-byte load phase (rows g and g + 1, units 4u .. 4u + 3) hit 8 distinct bank groups.
__device__ inline int stage_slot(int r, int j) {
  return r * kChunkUnits + (j ^ ((r & 1) << 2));
}

// A 16-byte unit of x (values v0 .. v7) as the pairs (v0, v4), (v1, v5), (v2, v6), (v3, v7): the k order of
// the A fragments' nibble pairs.
__device__ inline void value_pairs(const uint4& v, uint32_t (&pairs)[4]) {
  pairs[0] = __byte_perm(v.x, v.z, 0x5410);
  pairs[1] = __byte_perm(v.x, v.z, 0x7632);
  pairs[2] = __byte_perm(v.y, v.w, 0x5410);
  pairs[3] = __byte_perm(v.y, v.w, 0x7632);
}

// mma.sync: which row (of the block's) and which 16-byte unit of a chunk's row thread `thread` stages as its
// i-th.
__device__ inline void x_unit_of(int thread, int i, int& row, int& unit) {
  row = (thread + i * kThreads) / kChunkUnits;
  unit = (thread + i * kThreads) % kChunkUnits;
}

// mma.sync: this thread's units of chunk `chunk` of the block's rows of x, in registers (zeros past the last
// row).
template <int kUnits>
__device__ inline void load_x_units(uint4 (&units)[kUnits], const GemmArgs& a, int64_t first_row,
                                    int64_t chunk) {
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    int r = 0, unit = 0;
    x_unit_of(static_cast<int>(threadIdx.x), i, r, unit);
    const int64_t row = first_row + r;
    units[i] = row < a.rows ? __ldg(a.x + row * (a.in_features / 8) + chunk * kChunkUnits + unit)
                            : make_uint4(0, 0, 0, 0);
  }
}

// mma.sync: the units into a stage as their pairs (value_pairs), a lane's 16-byte B fragments of one 32-k
// block.
template <int kUnits>
__device__ inline void store_x_units(uint4* stage, const uint4 (&units)[kUnits]) {
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    int r = 0, unit = 0;
    x_unit_of(static_cast<int>(threadIdx.x), i, r, unit);
    uint32_t pairs[4];
    value_pairs(units[i], pairs);
    stage[stage_slot(r, unit)] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
  }
}

// wgmma reads x from shared memory in a layout and k order that no copy can make, so x is put in it once
// per call (w4a16_x_images_kernel) instead of once per block and chunk: the image of (row block, chunk) is
// the stage a block reads, kStageBytes contiguous, which one bulk copy brings in. In it the k16 step 2u + h
// of the chunk's 32-k block u holds, per group of 8 rows, core matrix c = 0, 1 (8 rows x 16 bytes): the
// row's pair p = 2h + c (value_pairs) of the values 8q .. 8q + 7 for q = 0..3, i.e. its 8 k values of the
// step in the A fragments' order. Rows past the last are zeros. A thread per (row block, chunk, u, row), the
// row fastest, so that 8 threads write one core matrix.
template <typename Shape>
__global__ void w4a16_x_images_kernel(const uint4* x, uint4* images, int64_t rows, int64_t chunks) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t items = (rows + Shape::kRows - 1) / Shape::kRows * chunks * kChunkBlocks * Shape::kRows;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(item % Shape::kRows);
    const int u = static_cast<int>(item / Shape::kRows % kChunkBlocks);
    const int64_t image = item / Shape::kRows / kChunkBlocks;  // row block * chunks + chunk
    const int64_t row = image / chunks * Shape::kRows + r, chunk = image % chunks;
    uint32_t pairs[4][4] = {};  // [q][p]
    if (row < rows)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        value_pairs(x[row * chunks * kChunkUnits + chunk * kChunkUnits + 4 * u + q], pairs[q]);
    char* stage = reinterpret_cast<char*>(images) + image * static_cast<int64_t>(Shape::kStageBytes);
#pragma unroll
    for (int p = 0; p < 4; ++p)
      *reinterpret_cast<uint4*>(stage + (2 * u + p / 2) * Shape::kWgmmaStepBytes + (r / 8) * 2 * kCoreBytes +
                                (p % 2) * kCoreBytes + (r % 8) * 16) =
          make_uint4(pairs[0][p], pairs[1][p], pairs[2][p], pairs[3][p]);
  }
}

// d (64 features x 256 rows, FP32) += A (this warp's 16 features x 16 k) B (x: 16 k x 256 rows).
__device__ inline void wgmma_bf16(float (&d)[32][4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                  uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
      "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, "
      "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, "
      "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, "
      "p, 1, 1, 0;\n}\n "
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]), "+f"(d[16][0]), "+f"(d[16][1]),
        "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),
        "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]),
        "+f"(d[19][2]), "+f"(d[19][3]), "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]),
        "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]), "+f"(d[22][0]), "+f"(d[22][1]),
        "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),
        "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]),
        "+f"(d[25][2]), "+f"(d[25][3]), "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]),
        "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]), "+f"(d[28][0]), "+f"(d[28][1]),
        "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),
        "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]),
        "+f"(d[31][2]), "+f"(d[31][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
#endif
}

// The lane's A fragments of 32-k block u for every tile: low (feature g) and high (g + 8) pairs 0..3; pairs
// 0, 1 are the k16 step 2u, pairs 2, 3 step 2u + 1.
template <int kScalesPerChunk, int kTiles>
__device__ inline void block_fragments(uint32_t (&f)[kTiles][2][4],
                                       const ChunkWeights<kScalesPerChunk, kTiles>& w, int u) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      scaled_nibble_pairs(word_of(w.words[t][h], u), block_scale<kScalesPerChunk>(w.scales[t][h], u),
                          f[t][h]);
}

// One staged chunk times the lane's weights of it, into acc[tile][row group].
template <typename Shape, int kScalesPerChunk>
__device__ inline void multiply_chunk(float (&acc)[Shape::kTiles][Shape::kRowGroups][4],
                                      const ChunkWeights<kScalesPerChunk, Shape::kTiles>& w,
                                      const uint4* stage, int g, int q) {
  constexpr int kTiles = Shape::kTiles;
#pragma unroll
  for (int u = 0; u < kChunkBlocks; ++u) {
    uint32_t f[kTiles][2][4];
    block_fragments(f, w, u);
#pragma unroll
    for (int n = 0; n < Shape::kRowGroups; ++n) {
      const uint4 x = stage[stage_slot(8 * n + g, 4 * u + q)];
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        mma_bf16(acc[t][n], {f[t][0][0], f[t][1][0], f[t][0][1], f[t][1][1]}, x.x, x.y);
        mma_bf16(acc[t][n], {f[t][0][2], f[t][1][2], f[t][0][3], f[t][1][3]}, x.z, x.w);
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

// Keeps the compiler from moving reads or writes of the accumulators across a wgmma wait.
template <int kRowGroups>
__device__ inline void pin(float (&d)[kRowGroups][4]) {
#pragma unroll
  for (int n = 0; n < kRowGroups; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[n][i])::"memory");
}

// d (64 features x 64 rows, FP32) += A (4 registers: 16 features x 16 k of this warp) B (x: 16 k x 64 rows).
__device__ inline void wgmma_bf16(float (&d)[8][4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                  uint64_t b) {
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

// d (64 features x 128 rows, FP32) += A (this warp's 16 features x 16 k) B (x: 16 k x 128 rows).
__device__ inline void wgmma_bf16(float (&d)[16][4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                  uint64_t b) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
#endif
}

// One staged chunk times the warpgroup's weights of it: per 32-k block two k16 steps of kTiles wgmmas, one
// commit group. The next block's fragments are made while this one's run, in the other half of
// `fragments`; a wait for all but the newest group frees that half (it served the block before). The first
// wait frees the half the previous chunk's third block used.
template <typename Shape, int kScalesPerChunk>
__device__ inline void wgmma_chunk(float (&acc)[Shape::kTiles][Shape::kRowGroups][4],
                                   const ChunkWeights<kScalesPerChunk, Shape::kTiles>& w,
                                   const uint4* stage) {
  constexpr int kTiles = Shape::kTiles;
  uint32_t fragments[2][kTiles][2][4];
  wgmma_wait<1>();
  block_fragments(fragments[0], w, 0);
#pragma unroll
  for (int u = 0; u < kChunkBlocks; ++u) {
    const auto& f = fragments[u % 2];
    wgmma_fence();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint64_t b =
          x_descriptor(reinterpret_cast<const char*>(stage) + (2 * u + half) * Shape::kWgmmaStepBytes);
#pragma unroll
      for (int t = 0; t < kTiles; ++t)
        wgmma_bf16(acc[t], f[t][0][2 * half], f[t][1][2 * half], f[t][0][2 * half + 1], f[t][1][2 * half + 1],
                   b);
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
template <typename Shape, bool kWgmma>
__device__ inline void add_cluster_splits(const GemmArgs& a,
                                          const float (&acc)[Shape::kTiles][Shape::kRowGroups][4],
                                          float* sums, int64_t block_feature, int64_t first_row, int split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kStride = Shape::kSumsStride;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int t = 0; t < Shape::kTiles; ++t)
#pragma unroll
    for (int n = 0; n < Shape::kRowGroups; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        sums[(8 * n + 2 * q + i % 2) * kStride + tile_feature<kWgmma, Shape::kTiles>(warp, t) + g +
             8 * (i / 2)] = acc[t][n][i];
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();
  constexpr int kUnitsPerRow = Shape::kFeatures / 4;
  for (int unit = split * kThreads + static_cast<int>(threadIdx.x); unit < Shape::kRows * kUnitsPerRow;
       unit += a.splits * kThreads) {
    const int r = unit / kUnitsPerRow, c = 4 * (unit % kUnitsPerRow);
    float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < a.splits; ++s) {
      const float4 part =
          *reinterpret_cast<const float4*>(cluster.map_shared_rank(sums, s) + r * kStride + c);
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
// sit in registers of their own (a copy between them would wait for the load). x: for mma.sync chunk c + 1
// is loaded into registers while c is computed, then paired into the other stage; for wgmma its image is
// copied kImagesAhead chunks ahead into a ring of stages, by one thread's bulk copy.
template <typename Shape, int kScalesPerChunk, bool kWgmma>
__global__ void __launch_bounds__(kThreads) w4a16_gemm_kernel(GemmArgs a) {
  constexpr int kTiles = Shape::kTiles;
  using Weights = ChunkWeights<kScalesPerChunk, kTiles>;
  extern __shared__ __align__(128) uint4 shared[];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, q = lane % 4;
  const int split = static_cast<int>(blockIdx.x) % a.splits;
  const int64_t block_feature = static_cast<int64_t>(blockIdx.x) / a.splits * Shape::kFeatures;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * Shape::kRows;
  const int64_t chunks = a.in_features / kChunkK;
  const int64_t begin = split * a.chunks_per_split;
  const int64_t end = begin + a.chunks_per_split < chunks ? begin + a.chunks_per_split : chunks;
  // Features past the last are read as the last one (their sums are not stored).
  int64_t feature[kTiles][2];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t f = block_feature + tile_feature<kWgmma, kTiles>(warp, t) + g + 8 * h;
      feature[t][h] = f < a.features ? f : a.features - 1;
    }
  auto stage_of = [&](int64_t c) { return shared + (c - begin) % kStages<kWgmma> * Shape::kStageUnits; };

  // Weights are never written by a kernel: the first chunk's load may overlap the previous kernel (pdl.cuh).
  Weights even, odd;
  load_chunk(even, a, feature, begin, q);
  wait_for_previous_kernel();
  allow_next_kernel();
  [[maybe_unused]] uint4 units[kWgmma ? 1 : Shape::kUnitsPerThread];
  // wgmma: stage s's barrier completes a phase when a copy into it lands (the copies of one stage complete
  // phases 0, 1, 0, ... in turn); the image of chunk c for row block blockIdx.y.
  auto* const barriers = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(shared) + Shape::kWgmmaBarriers);
  const auto copy_image = [&](int64_t c) {
    const int64_t image = static_cast<int64_t>(blockIdx.y) * chunks + c;
    bulk_copy(stage_of(c), a.x + image * Shape::kStageUnits, static_cast<unsigned>(Shape::kStageBytes),
              &barriers[(c - begin) % kStages<true>]);
  };
  if constexpr (kWgmma) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages<true>; ++s) barrier_init(&barriers[s]);
      fence_barrier_init();
      for (int64_t c = begin; c < begin + kImagesAhead && c < end; ++c) copy_image(c);
    }
    __syncthreads();  // the barriers are initialised before anyone waits on them
  } else {
    load_x_units(units, a, first_row, begin);
    store_x_units(shared, units);
    __syncthreads();
  }

  float acc[kTiles][Shape::kRowGroups][4] = {};
  const auto step = [&](int64_t c, Weights& current, Weights& next) {
    const bool more = c + 1 < end;
    if constexpr (kWgmma) {
      // The stage refilled here was last read by chunk c - 2's products, which each warpgroup waited for
      // before this barrier (wgmma_chunk); chunk c's image has landed once its barrier's phase completes.
      __syncthreads();
      if (threadIdx.x == 0 && c + kImagesAhead < end) copy_image(c + kImagesAhead);
      if (more) load_chunk(next, a, feature, c + 1, q);
      barrier_wait(&barriers[(c - begin) % kStages<true>],
                   static_cast<unsigned>((c - begin) / kStages<true>) & 1u);
      __syncwarp();  // the wait's lanes may leave its loop apart; wgmma's instructions are warp-aligned
      wgmma_chunk<Shape>(acc, current, stage_of(c));
    } else {
      // Chunk c is computed from its stage while chunk c + 1 is loaded and then staged into the next one; the
      // barrier after it makes that stage whole and ends every warp's reads of this one.
      if (more) {
        load_chunk(next, a, feature, c + 1, q);
        load_x_units(units, a, first_row, c + 1);
      }
      multiply_chunk<Shape>(acc, current, stage_of(c), g, q);
      if (more) store_x_units(stage_of(c + 1), units);
      __syncthreads();
    }
  };
  for (int64_t c = begin; c < end; c += 2) {
    step(c, even, odd);
    if (c + 1 < end) step(c + 1, odd, even);
  }
  if constexpr (kWgmma) {
    wgmma_wait<0>();
#pragma unroll
    for (int t = 0; t < kTiles; ++t) pin(acc[t]);
    __syncthreads();  // every warpgroup's products are done with the stages the sums reuse
  }

  if (a.cluster_sums) {
    add_cluster_splits<Shape, kWgmma>(a, acc, reinterpret_cast<float*>(shared), block_feature, first_row,
                                      split);
    return;
  }
  float* target = a.out + (a.splits > 1 ? split * a.rows * a.features : 0);
  const int64_t target_stride = a.splits > 1 ? a.features : a.out_stride;
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int n = 0; n < Shape::kRowGroups; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t f = block_feature + tile_feature<kWgmma, kTiles>(warp, t) + g + 8 * (i / 2);
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
// blocks over s; per block shape (its registers and shared memory), in the product form the device runs.
struct ShapeOccupancy {
  int resident_blocks = 1;
  int concurrent_clusters[kPortableCluster + 1] = {};  // [s]: clusters of s blocks at once
};
struct GemmDevice {
  int multiprocessors = 1;
  int max_cluster = 0;
  bool wgmma = false;                       // the code the device runs was built for sm_90a
  ShapeOccupancy rows64, rows128, rows256;  // rows256: wgmma only
};

// Every instance of the kernel of one block shape, and what each needs before its first launch: the dynamic
// shared memory of its stages and cluster sums (above the default 48 KB), clusters of up to 16 blocks
// (tuning may ask for them).
template <typename Shape, bool kWgmma>
cudaError_t prepare_kernels() {
  for (auto* kernel : {w4a16_gemm_kernel<Shape, 4, kWgmma>, w4a16_gemm_kernel<Shape, 2, kWgmma>,
                       w4a16_gemm_kernel<Shape, 1, kWgmma>}) {
    cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(Shape::shared_bytes(kWgmma, true)));
    if (status == cudaSuccess && clusters_supported())
      status = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

// A launch of `blocks` blocks in one cluster (0: no cluster) with `shared` bytes of dynamic shared memory.
cudaLaunchConfig_t cluster_config(int blocks, size_t shared, cudaLaunchAttribute& attribute) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(std::max(blocks, 1)));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared;
  if (blocks > 0) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(blocks);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  return config;
}

using RowBlocks64 = BlockShape<64>;
using RowBlocks128 = BlockShape<128>;
using RowBlocks256 = BlockShape<256>;  // wgmma only (m64n256k16: 128 sums a thread)

// A block shape's occupancy (ShapeOccupancy), and in `shape_max_cluster` the largest cluster of its blocks
// the GPU can schedule, up to `max_cluster` (0: no clusters).
template <typename Shape, bool kWgmma>
ShapeOccupancy occupancy(int multiprocessors, int max_cluster, int& shape_max_cluster) {
  auto* const kernel = w4a16_gemm_kernel<Shape, 4, kWgmma>;
  const size_t shared = Shape::shared_bytes(kWgmma, true);
  ShapeOccupancy o;
  int per_multiprocessor = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, kThreads, shared),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor (W4A16 kernel)");
  o.resident_blocks = std::max(1, per_multiprocessor) * multiprocessors;
  shape_max_cluster = 0;
  if (max_cluster == 0) return o;
  cudaLaunchAttribute attribute{};
  cudaLaunchConfig_t config = cluster_config(0, shared, attribute);
  config.gridDim = dim3(static_cast<unsigned>(max_cluster));
  check_cuda(cudaOccupancyMaxPotentialClusterSize(&shape_max_cluster, kernel, &config),
             "cudaOccupancyMaxPotentialClusterSize (W4A16 kernel)");
  shape_max_cluster = std::min(shape_max_cluster, max_cluster);
  for (int s = 2; s <= std::min(shape_max_cluster, kPortableCluster); ++s) {
    config = cluster_config(s, shared, attribute);
    check_cuda(cudaOccupancyMaxActiveClusters(&o.concurrent_clusters[s], kernel, &config),
               "cudaOccupancyMaxActiveClusters (W4A16 kernel)");
  }
  return o;
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
    check_cuda(prepare_kernels<RowBlocks64, false>(), "W4A16 kernel attributes");
    check_cuda(prepare_kernels<RowBlocks64, true>(), "W4A16 kernel attributes");
    check_cuda(prepare_kernels<RowBlocks128, false>(), "W4A16 kernel attributes");
    check_cuda(prepare_kernels<RowBlocks128, true>(), "W4A16 kernel attributes");
    check_cuda(prepare_kernels<RowBlocks256, true>(), "W4A16 kernel attributes");
    const int max_cluster = clusters_supported() ? kMaxClusterSplits : 0;
    int max64 = 0, max128 = 0, max256 = max_cluster;
    if (d.wgmma) {
      d.rows64 = occupancy<RowBlocks64, true>(d.multiprocessors, max_cluster, max64);
      d.rows128 = occupancy<RowBlocks128, true>(d.multiprocessors, max_cluster, max128);
      d.rows256 = occupancy<RowBlocks256, true>(d.multiprocessors, max_cluster, max256);
    } else {
      d.rows64 = occupancy<RowBlocks64, false>(d.multiprocessors, max_cluster, max64);
      d.rows128 = occupancy<RowBlocks128, false>(d.multiprocessors, max_cluster, max128);
    }
    d.max_cluster = std::min({max64, max128, max256});
    return d;
  }();
  return device;
}

bool takes_wgmma(const W4a16GemmTuning& tuning) {
  return tuning.wgmma && gemm_device().wgmma;
}

// Rows of x a block takes: with wgmma 128 (each dequantized weight serves twice the rows) unless the call
// has at most 64; with mma.sync 64 (at 128 its registers spill); or what the tuning says.
int block_rows(int64_t rows, const W4a16GemmTuning& tuning) {
  if (tuning.block_rows != 0) return tuning.block_rows;
  if (!takes_wgmma(tuning) || rows <= RowBlocks64::kRows) return RowBlocks64::kRows;
  return rows <= RowBlocks128::kRows ? RowBlocks128::kRows : RowBlocks256::kRows;
}

// The split of K with the least estimated time (splits_by_waves): waves of blocks x (chunks a split +
// kSplitCostChunks), over splits of at least kMinChunksPerSplit chunks, at most 8 (the portable cluster
// size); added inside clusters where the GPU has them (up to max_cluster), else left as partials for the
// sums kernel. A forced split (tuning) may be any count.
template <typename Shape>
Split gemm_split(int64_t rows, int64_t out_features, int64_t in_features, const W4a16GemmTuning& tuning) {
  const GemmDevice& device = gemm_device();
  const int64_t chunks = in_features / kChunkK;
  const bool clusters = tuning.cluster_sums && device.max_cluster > 0;
  auto split_of = [&](int64_t wanted) {
    const KSplit split = split_k(chunks, wanted);
    return Split{split.splits, split.chunks_per_split,
                 split.splits > 1 && clusters && split.splits <= device.max_cluster};
  };
  if (tuning.splits > 0) return split_of(tuning.splits);
  const int64_t tiles =
      ((out_features + Shape::kFeatures - 1) / Shape::kFeatures) * ((rows + Shape::kRows - 1) / Shape::kRows);
  const ShapeOccupancy& o = Shape::kRows == RowBlocks256::kRows   ? device.rows256
                            : Shape::kRows == RowBlocks128::kRows ? device.rows128
                                                                  : device.rows64;
  const auto concurrent = [&](int64_t wanted) -> int64_t {
    if (wanted == 1) return o.resident_blocks;
    return split_of(wanted).cluster_sums ? o.concurrent_clusters[wanted] : o.resident_blocks / wanted;
  };
  return split_of(
      splits_by_waves(tiles, chunks, kPortableCluster, kMinChunksPerSplit, kSplitCostChunks, concurrent));
}

Split gemm_split(int64_t rows, const LinearWeight& w, const W4a16GemmTuning& tuning) {
  const int rows_per_block = block_rows(rows, tuning);
  if (rows_per_block == RowBlocks256::kRows)
    return gemm_split<RowBlocks256>(rows, w.out_features, w.in_features, tuning);
  return rows_per_block == RowBlocks128::kRows
             ? gemm_split<RowBlocks128>(rows, w.out_features, w.in_features, tuning)
             : gemm_split<RowBlocks64>(rows, w.out_features, w.in_features, tuning);
}

template <typename Shape, int kScalesPerChunk>
cudaError_t launch_gemm(const GemmArgs& a, bool wgmma, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.features + Shape::kFeatures - 1) / Shape::kFeatures * a.splits),
                  static_cast<unsigned>((a.rows + Shape::kRows - 1) / Shape::kRows));
  const unsigned cluster = a.cluster_sums ? static_cast<unsigned>(a.splits) : 1u;
  const size_t shared = Shape::shared_bytes(wgmma, a.cluster_sums);
  if constexpr (Shape::kRows > RowBlocks128::kRows) {
    if (!wgmma) return cudaErrorInvalidValue;
    return launch_kernel_in_clusters(w4a16_gemm_kernel<Shape, kScalesPerChunk, true>, grid, kThreads, shared,
                                     cluster, stream, a);
  } else {
    return wgmma ? launch_kernel_in_clusters(w4a16_gemm_kernel<Shape, kScalesPerChunk, true>, grid, kThreads,
                                             shared, cluster, stream, a)
                 : launch_kernel_in_clusters(w4a16_gemm_kernel<Shape, kScalesPerChunk, false>, grid, kThreads,
                                             shared, cluster, stream, a);
  }
}

// wgmma: x's images (w4a16_x_images_kernel) into `images`, then the kernel reading them.
template <typename Shape>
cudaError_t launch_gemm(GemmArgs a, int per_chunk, bool wgmma, void* images, cudaStream_t stream) {
  if (wgmma) {
    constexpr int kImageThreads = 256;
    const int64_t items =
        (a.rows + Shape::kRows - 1) / Shape::kRows * a.in_features / kChunkK * kChunkBlocks * Shape::kRows;
    const auto grid =
        static_cast<unsigned>(std::min<int64_t>((items + kImageThreads - 1) / kImageThreads, 8192));
    const cudaError_t status =
        launch_kernel(w4a16_x_images_kernel<Shape>, grid, kImageThreads, 0, stream, a.x,
                      static_cast<uint4*>(images), a.rows, a.in_features / kChunkK);
    if (status != cudaSuccess) return status;
    a.x = static_cast<const uint4*>(images);
  }
  return per_chunk == 4   ? launch_gemm<Shape, 4>(a, wgmma, stream)
         : per_chunk == 2 ? launch_gemm<Shape, 2>(a, wgmma, stream)
                          : launch_gemm<Shape, 1>(a, wgmma, stream);
}

// The workspace of a call: x's images (wgmma: whole row blocks), then the split partials that no cluster
// adds.
struct Workspace {
  size_t images_bytes, partial_floats;
};

Workspace workspace_of(int64_t rows, const LinearWeight& w, const W4a16GemmTuning& tuning) {
  const Split split = gemm_split(rows, w, tuning);
  const int64_t block = block_rows(rows, tuning);
  const size_t images =
      takes_wgmma(tuning) ? static_cast<size_t>((rows + block - 1) / block * block * w.in_features) * 2 : 0;
  const size_t partials =
      split.splits > 1 && !split.cluster_sums ? static_cast<size_t>(split.splits * rows * w.out_features) : 0;
  return {images, partials};
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
  return gemm_split(rows, w, tuning).splits;
}

size_t w4a16_gemm_workspace_bytes(int64_t rows, const LinearWeight& w, const W4a16GemmTuning& tuning) {
  const Workspace workspace = workspace_of(rows, w, tuning);
  return workspace.images_bytes + workspace.partial_floats * sizeof(float);
}

cudaError_t launch_w4a16_gemm(const Tensor& out, const void* x_bf16, const LinearWeight& w, void* workspace,
                              cudaStream_t stream, const W4a16GemmTuning& tuning) {
  if (out.rows == 0 || w.out_features == 0) return cudaSuccess;
  const int rows_per_block = block_rows(out.rows, tuning);
  if (rows_per_block != RowBlocks64::kRows && rows_per_block != RowBlocks128::kRows &&
      rows_per_block != RowBlocks256::kRows)
    return cudaErrorInvalidValue;
  const Split split = gemm_split(out.rows, w, tuning);
  const Workspace parts = workspace_of(out.rows, w, tuning);
  if (parts.images_bytes + parts.partial_floats > 0 && (workspace == nullptr || !aligned(workspace, 16)))
    return cudaErrorInvalidValue;
  float* partials = parts.partial_floats > 0
                        ? reinterpret_cast<float*>(static_cast<char*>(workspace) + parts.images_bytes)
                        : nullptr;
  const GemmArgs a{partials != nullptr ? partials : out.ptr<float>(),
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
  const int per_chunk = scales_per_chunk(w.group_size);
  const bool wgmma = takes_wgmma(tuning);
  const cudaError_t status = rows_per_block == RowBlocks256::kRows
                                 ? launch_gemm<RowBlocks256>(a, per_chunk, wgmma, workspace, stream)
                             : rows_per_block == RowBlocks128::kRows
                                 ? launch_gemm<RowBlocks128>(a, per_chunk, wgmma, workspace, stream)
                                 : launch_gemm<RowBlocks64>(a, per_chunk, wgmma, workspace, stream);
  if (status != cudaSuccess || partials == nullptr) return status;
  return launch_split_partial_sums(
      out, UnsummedSplits::packed(partials, static_cast<int>(split.splits), out.rows, out.cols), stream);
}

}  // namespace qspec::cuda
