// out = x W^T for many rows of x (prefill chunks) straight from W4A16 weights on tensor cores. Each weight
// is dequantized in registers to BF16 as (nibble - 8) * scale rounded once, the value of its BF16 copy
// (GemmLinear::dequantize), and x is GemmLinear's BF16 operand, so the products are those of cuBLAS on the
// copy; only the FP32 order of the sums differs. The weights cost a quarter of the copy's bytes, and no copy
// needs to be kept.
//
// mma.sync m16n8k16 BF16 (sm_80+) in the form of the few-row kernels (linear_mma.cu): A = 16 output features
// x 16 k (the weights), B = 16 k x 8 rows of x. A warp owns kWarpTiles tiles of 16 features and a block
// kBlockRows rows of x, walked in 128-k chunks. Lane (g = lane / 4, q = lane % 4) loads packed word q of each
// 32-k block of its features g and g + 8 (one 16-byte load per feature and chunk in the backend's word
// order, packed_int4_order.h). A word's nibble pairs (i, i + 4) are the mma's k pairs: masked into the
// mantissa of BF16 128 they read 128 + n, one subtraction leaves n - 8 (exact), one multiply by the group
// scale rounds the weight. The block stages a chunk of its rows of x in shared memory in the same pairs (one
// byte permute per pair, once per block), so a lane's B fragments of one 32-k block and 8 rows are one
// 16-byte load, shared by the warp's tiles. The next chunk's weights and x are loaded while this one is
// computed (weights into registers, x through registers into the other stage).
//
// K is split over blocks only when the tiles leave the GPU short of blocks; the splits' partials are then
// added in split order by sum_split_partials_kernel (results do not depend on timing).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

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
// Splits of K of one block's tile form a thread block cluster on sm_90+ (at most 16 blocks):
// each block leaves its sums in its shared memory, rows kSumsStride floats apart (the lanes of a store, rows
// 2q and features g, hit distinct banks), and the blocks add them in split order over distributed shared
// memory, each a share of the tile.
constexpr int kMaxClusterSplits = 16;
constexpr int kPortableCluster = 8;
// Fewest chunks a split of K keeps.
constexpr int64_t kMinChunksPerSplit = 4;
constexpr int kSumsStride = kBlockFeatures + 4;
constexpr size_t kStageBytes = 2 * kStageUnits * sizeof(uint4);
constexpr size_t kClusterSharedBytes = size_t{kBlockRows} * kSumsStride * sizeof(float);
static_assert(kClusterSharedBytes >= kStageBytes);

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

// (value & mask) | bias in one LOP3.
template <uint32_t kMask, uint32_t kBias>
__device__ inline uint32_t and_or(uint32_t value) {
  uint32_t result;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(result) : "r"(value), "n"(kMask), "n"(kBias));
  return result;
}

__device__ inline uint32_t bf16x2_bits(__nv_bfloat162 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ inline __nv_bfloat162 as_bf16x2(uint32_t bits) {
  return *reinterpret_cast<const __nv_bfloat162*>(&bits);
}

// Bytes of a and b chosen by the selector (PRMT).
__device__ inline uint32_t byte_permute(uint32_t a, uint32_t b, uint32_t selector) {
  return __byte_perm(a, b, selector);
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

__device__ inline void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ inline uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
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
  return as_bf16x2(byte_permute(half_word, 0, 0x1010));
}

// Shared-memory slot of row r's 16-byte unit j of a staged chunk: units are swizzled by the row's parity, so
// the 8 lanes of a 16-byte load phase (rows g and g + 1, units 4u .. 4u + 3) hit 8 distinct bank groups.
__device__ inline int stage_slot(int r, int j) {
  return r * kChunkUnits + (j ^ ((r & 1) << 2));
}

// This thread's units of chunk `chunk` of the block's rows of x, in registers (zeros past the last row).
__device__ inline void load_x_units(uint4 (&units)[kUnitsPerThread], const GemmArgs& a, int64_t first_row,
                                    int64_t chunk) {
#pragma unroll
  for (int i = 0; i < kUnitsPerThread; ++i) {
    const int unit = static_cast<int>(threadIdx.x) + i * kThreads;
    const int64_t row = first_row + unit / kChunkUnits;
    units[i] = row < a.rows
                   ? __ldg(a.x + row * (a.in_features / 8) + chunk * kChunkUnits + unit % kChunkUnits)
                   : make_uint4(0, 0, 0, 0);
  }
}

// The units into a stage, each one's 8 values (v0 .. v7) as the pairs (v0, v4), (v1, v5), (v2, v6), (v3, v7).
__device__ inline void store_x_units(uint4* stage, const uint4 (&units)[kUnitsPerThread]) {
#pragma unroll
  for (int i = 0; i < kUnitsPerThread; ++i) {
    const int unit = static_cast<int>(threadIdx.x) + i * kThreads;
    const uint4 v = units[i];
    stage[stage_slot(unit / kChunkUnits, unit % kChunkUnits)] =
        make_uint4(byte_permute(v.x, v.z, 0x5410), byte_permute(v.x, v.z, 0x7632),
                   byte_permute(v.y, v.w, 0x5410), byte_permute(v.y, v.w, 0x7632));
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
        mma_bf16(acc[t][n], low[t][0], high[t][0], low[t][1], high[t][1], x.x, x.y);
        mma_bf16(acc[t][n], low[t][2], high[t][2], low[t][3], high[t][3], x.z, x.w);
      }
    }
  }
}

// The block's sums into its shared memory ([row][feature], kSumsStride apart; the stages are done with), one
// cluster barrier, then block `split` writes its share of the tile (float4 units split, split + splits, ...
// in turns of the block's threads), each value its splits' sums added in split order from zero; a second
// barrier keeps every block's shared memory until all have read it.
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
        sums[(8 * n + 2 * q + i % 2) * kSumsStride + warp * kWarpTiles * kTileFeatures + kTileFeatures * t +
             g + 8 * (i / 2)] = acc[t][n][i];
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

// Grid: (feature blocks x splits of K, row blocks). The chunks of a split are walked two at a time so that
// the loaded weights of the next chunk sit in registers of their own (a copy between them would wait for the
// load).
template <int kScalesPerChunk>
__global__ void __launch_bounds__(kThreads) w4a16_gemm_kernel(GemmArgs a) {
  extern __shared__ uint4 shared[];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, q = lane % 4;
  const int split = static_cast<int>(blockIdx.x) % a.splits;
  const int64_t block_feature = static_cast<int64_t>(blockIdx.x) / a.splits * kBlockFeatures;
  const int64_t first_feature = block_feature + warp * kWarpTiles * kTileFeatures;
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
      const int64_t f = first_feature + kTileFeatures * t + g + 8 * h;
      feature[t][h] = f < a.features ? f : a.features - 1;
    }

  // Weights are never written by a kernel: the first chunk's load may overlap the previous kernel (pdl.cuh).
  ChunkWeights<kScalesPerChunk> even, odd;
  load_chunk(even, a, feature, begin, q);
  wait_for_previous_kernel();
  allow_next_kernel();
  uint4 units[kUnitsPerThread];
  load_x_units(units, a, first_row, begin);
  store_x_units(shared, units);
  __syncthreads();

  float acc[kWarpTiles][kRowGroups][4] = {};
  // Chunk c is computed from stage c & 1 while chunk c + 1 is loaded and then staged into the other one; the
  // barrier after it makes the stage whole, and it also ends every warp's reads of the stage written next.
  const auto step = [&](int64_t c, ChunkWeights<kScalesPerChunk>& current,
                        ChunkWeights<kScalesPerChunk>& next) {
    const bool more = c + 1 < end;
    if (more) {
      load_chunk(next, a, feature, c + 1, q);
      load_x_units(units, a, first_row, c + 1);
    }
    multiply_chunk(acc, current, shared + ((c - begin) & 1) * kStageUnits, g, q);
    if (more) store_x_units(shared + ((c + 1 - begin) & 1) * kStageUnits, units);
    __syncthreads();
  };
  for (int64_t c = begin; c < end; c += 2) {
    step(c, even, odd);
    if (c + 1 < end) step(c + 1, odd, even);
  }

  if (a.cluster_sums) {
    add_cluster_splits(a, acc, reinterpret_cast<float*>(shared), block_feature, first_row, split);
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
        const int64_t f = first_feature + kTileFeatures * t + g + 8 * (i / 2);
        const int64_t row = first_row + 8 * n + 2 * q + i % 2;
        if (f < a.features && row < a.rows) target[row * target_stride + f] = acc[t][n][i];
      }
}

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

// What the split depends on: the SMs, and the largest cluster of the kernel's blocks the GPU can schedule
// (0 without clusters; up to 16 with the non-portable size where the GPU allows it, as the H200 does).
struct GemmDevice {
  int multiprocessors = 1;
  int max_cluster = 0;
};

const GemmDevice& gemm_device() {
  static const GemmDevice device = [] {
    GemmDevice d;
    int id = 0;
    if (cudaGetDevice(&id) != cudaSuccess ||
        cudaDeviceGetAttribute(&d.multiprocessors, cudaDevAttrMultiProcessorCount, id) != cudaSuccess)
      return GemmDevice{};
    if (!clusters_supported()) return d;
    for (auto* kernel : {w4a16_gemm_kernel<4>, w4a16_gemm_kernel<2>, w4a16_gemm_kernel<1>}) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kClusterSharedBytes)) != cudaSuccess ||
          cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
        return d;
    }
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(kMaxClusterSplits);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kClusterSharedBytes;
    int blocks = 0;
    if (cudaOccupancyMaxPotentialClusterSize(&blocks, w4a16_gemm_kernel<4>, &config) == cudaSuccess)
      d.max_cluster = std::min(blocks, kMaxClusterSplits);
    static_cast<void>(cudaGetLastError());
    return d;
  }();
  return device;
}

// Splits of K that fill the GPU with one wave of blocks (one block an SM): as many as fit beside the tiles,
// each of at least kMinChunksPerSplit chunks, at most max_cluster (added inside the cluster) where the GPU
// has clusters (8, the portable size, unless tuned), else left as partials for the sums kernel. More splits
// than fit in one wave ran slower at 64 rows of x (the tiles of a second wave; clusters of 13-16 blocks
// waiting for free SMs of one GPC).
Split gemm_split(int64_t rows, int64_t out_features, int64_t in_features, const W4a16GemmTuning& tuning) {
  const GemmDevice& device = gemm_device();
  const int64_t chunks = in_features / kChunkK;
  const bool clusters = tuning.cluster_sums && device.max_cluster > 0;
  int64_t wanted = tuning.splits;
  if (wanted <= 0) {
    const int64_t tiles =
        ((out_features + kBlockFeatures - 1) / kBlockFeatures) * ((rows + kBlockRows - 1) / kBlockRows);
    wanted = std::max<int64_t>(1, device.multiprocessors / tiles);
    wanted = std::min(wanted, std::max<int64_t>(1, chunks / kMinChunksPerSplit));
    if (clusters) wanted = std::min<int64_t>(wanted, std::min(device.max_cluster, kPortableCluster));
  }
  const int64_t per_split = (chunks + wanted - 1) / wanted;
  const int64_t splits = (chunks + per_split - 1) / per_split;
  return {splits, per_split, splits > 1 && clusters && splits <= device.max_cluster};
}

template <int kScalesPerChunk>
cudaError_t launch_gemm(const GemmArgs& a, dim3 grid, cudaStream_t stream) {
  auto* const kernel = w4a16_gemm_kernel<kScalesPerChunk>;
  static const cudaError_t allowed = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                          static_cast<int>(kClusterSharedBytes));
  if (allowed != cudaSuccess) return allowed;
  return launch_kernel_in_clusters(kernel, grid, kThreads, a.cluster_sums ? kClusterSharedBytes : kStageBytes,
                                   a.cluster_sums ? static_cast<unsigned>(a.splits) : 1u, stream, a);
}

}  // namespace

bool w4a16_gemm_supports(const LinearWeight& w) {
  const int per_chunk = scales_per_chunk(w.group_size);
  return w.quantized() && w.scales.dtype == DType::BF16 && w.in_features % kChunkK == 0 && per_chunk > 0 &&
         w.packed.stride % 4 == 0 && aligned(w.packed.data, 16) && w.scales.stride % per_chunk == 0 &&
         aligned(w.scales.data, 2 * static_cast<uintptr_t>(per_chunk));
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
  const cudaError_t status = per_chunk == 4   ? launch_gemm<4>(a, grid, stream)
                             : per_chunk == 2 ? launch_gemm<2>(a, grid, stream)
                                              : launch_gemm<1>(a, grid, stream);
  if (status != cudaSuccess || !partial) return status;
  return launch_split_partial_sums(out, partials, static_cast<int>(split.splits), stream);
}

}  // namespace qspec::cuda
