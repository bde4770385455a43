// out = x W^T on tensor cores for few rows of x (decode, the 16-row verify): W4A16 (K and group_size
// multiples of 32) and BF16 weights. The weights are read once per 16 rows of x, so a step of 16 rows costs
// about what a step of one does.
//
// mma.sync m16n8k16 (BF16 in, FP32 accumulate, sm_80+): A = 16 output features x 16 k, B = 16 k x 8 rows
// of x. A warp owns 16 features; lane (g = lane / 4, q = lane % 4) loads features g and g + 8. Per 32-k
// block of a W4A16 row, lane q loads packed word q (k = 8q .. 8q + 7); the order of k inside one mma is
// free as long as A and B agree, so the mma takes nibble pairs (i, i + 4) — one shift + mask + or makes
// two BF16 values 128 + n, one subtraction gives n - 8 exactly — and x in the same pairs. Both mmas of a
// block lie in one quantization group: the group scale multiplies the block's FP32 sum (exact weights, no
// rounding of n * scale). BF16 weights are loaded 16 bytes per lane and paired the same way with byte
// permutes.
//
// x stays accurate to ~2^-16: each value is split into hi = bf16(x) and lo = bf16(x - hi), and every block
// is multiplied by both (the products are exact; the sum is FP32). The block of 4 warps stages a tile of
// 512 k of x in shared memory already split and paired, and walks K tile by tile; each warp takes 4
// consecutive 32-k blocks of the tile, with the next tile's weights loaded while this one is computed.
// When 16-feature tiles alone leave the GPU short of warps (out_features 2560 at K 9216), K is also split
// over blocks; the last block of a tile to finish sums the partials in a fixed order, so results do not
// depend on timing, nor on how many rows share the call (a row's arithmetic is the same at M = 1 and 16).
//
// Prediction (H200, 4.16 TB/s): ~34 warp-instructions per 256 bytes of W4A16 weights, about half of the
// issue rate that the bandwidth leaves, so [9216, 2560] g32 (13.3 MB) at M = 1..16 should take ~4-5 us.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileFeatures = 16;
constexpr int kTileRows = 16;  // rows of x per pass (two n8 halves)
constexpr int kBlockK = 32;    // k per block: one W4A16 group slice
constexpr int kBlocksPerWarp = 4;
constexpr int kStageBlocks = kWarps * kBlocksPerWarp;            // 16
constexpr int kStageK = kStageBlocks * kBlockK;                  // 512
constexpr int kChunksPerRow = kStageK / 8;                       // 8 values of x per 32-byte chunk
constexpr int kChunkWords = 8;                                   // 4 hi pairs + 4 lo pairs
constexpr int kStageRowWords = kChunksPerRow * kChunkWords + 4;  // + 16 bytes: rows g and g+1 use other banks
constexpr int kTargetBlocks = 4 * 132;  // split K until the grid fills the multiprocessors about 4 times

__device__ inline void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

__device__ inline uint32_t bf16_pair(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ inline float bf16_low(uint32_t pair) {
  return __uint_as_float(pair << 16);
}
__device__ inline float bf16_high(uint32_t pair) {
  return __uint_as_float(pair & 0xFFFF0000u);
}

// Nibbles i and i + 4 of a packed word as the BF16 pair (n_i - 8, n_{i+4} - 8), exact.
template <int kPair>
__device__ inline uint32_t nibble_pair(uint32_t word) {
  const uint32_t biased = ((word >> (4 * kPair)) & 0x000F000Fu) | 0x43004300u;  // 128 + n
  const __nv_bfloat162 value =
      __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased), __floats2bfloat162_rn(136.0f, 136.0f));
  return *reinterpret_cast<const uint32_t*>(&value);
}

// The A fragments of one 32-k block for features g (low) and g + 8 (high): pair i = k values (i, i + 4) of
// the lane's 8. mma 0 takes pairs 0 and 1, mma 1 pairs 2 and 3.
struct BlockFragments {
  uint32_t low[4], high[4];
};

// Two rows of x (halves) times one block's fragments: the hi and lo parts of x, both mmas.
template <int kHalves>
__device__ inline void multiply_block(float (&sum)[kHalves][4], const BlockFragments& a,
                                      const uint4 (&x_hi)[kHalves], const uint4 (&x_lo)[kHalves]) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    mma_bf16(sum[h], a.low[0], a.high[0], a.low[1], a.high[1], x_hi[h].x, x_hi[h].y);
    mma_bf16(sum[h], a.low[2], a.high[2], a.low[3], a.high[3], x_hi[h].z, x_hi[h].w);
    mma_bf16(sum[h], a.low[0], a.high[0], a.low[1], a.high[1], x_lo[h].x, x_lo[h].y);
    mma_bf16(sum[h], a.low[2], a.high[2], a.low[3], a.high[3], x_lo[h].z, x_lo[h].w);
  }
}

// W4A16 (compressed-tensors pack-quantized): word q of a 32-k block of features g and g + 8, and their
// group scales.
template <typename S>
struct PackedInt4Weights {
  const uint32_t* packed;
  int64_t packed_stride;
  const S* scales;
  int64_t scales_stride;
  int group_size;

  // 5 blocks per multiprocessor at one row half: a [9216, K] matrix (576 feature tiles) runs in one wave.
  static constexpr int min_resident_blocks(int halves) { return halves == 1 ? 5 : 4; }

  struct Loaded {
    uint32_t low, high;
    S scale_low, scale_high;
  };

  __device__ Loaded load(int64_t feature_low, int64_t feature_high, int64_t block, int q) const {
    const int64_t word = block * (kBlockK / 8) + q;
    const int64_t group = block * kBlockK / group_size;
    return {__ldcs(packed + feature_low * packed_stride + word),
            __ldcs(packed + feature_high * packed_stride + word), scales[feature_low * scales_stride + group],
            scales[feature_high * scales_stride + group]};
  }

  template <int kHalves>
  __device__ void accumulate(float (&acc)[kHalves][4], const Loaded& w, const uint4 (&x_hi)[kHalves],
                             const uint4 (&x_lo)[kHalves]) const {
    const BlockFragments a{
        {nibble_pair<0>(w.low), nibble_pair<1>(w.low), nibble_pair<2>(w.low), nibble_pair<3>(w.low)},
        {nibble_pair<0>(w.high), nibble_pair<1>(w.high), nibble_pair<2>(w.high), nibble_pair<3>(w.high)}};
    float sum[kHalves][4] = {};
    multiply_block<kHalves>(sum, a, x_hi, x_lo);
    const float scale_low = to_float(w.scale_low), scale_high = to_float(w.scale_high);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      acc[h][0] = fmaf(scale_low, sum[h][0], acc[h][0]);
      acc[h][1] = fmaf(scale_low, sum[h][1], acc[h][1]);
      acc[h][2] = fmaf(scale_high, sum[h][2], acc[h][2]);
      acc[h][3] = fmaf(scale_high, sum[h][3], acc[h][3]);
    }
  }
};

// BF16 weights: 8 values (16 bytes) of a 32-k block per lane and feature.
struct Bf16Weights {
  const uint4* weight;  // rows of in_features / 8 vectors
  int64_t vector_stride;

  static constexpr int min_resident_blocks(int) { return 4; }  // 16-byte loads need the registers

  struct Loaded {
    uint4 low, high;
  };

  __device__ Loaded load(int64_t feature_low, int64_t feature_high, int64_t block, int q) const {
    const int64_t vector = block * (kBlockK / 8) + q;
    return {__ldcs(weight + feature_low * vector_stride + vector),
            __ldcs(weight + feature_high * vector_stride + vector)};
  }

  // (v0 v1)(v2 v3)(v4 v5)(v6 v7) -> pairs (v0 v4)(v1 v5)(v2 v6)(v3 v7)
  __device__ static void pairs(const uint4& v, uint32_t (&out)[4]) {
    out[0] = __byte_perm(v.x, v.z, 0x5410);
    out[1] = __byte_perm(v.x, v.z, 0x7632);
    out[2] = __byte_perm(v.y, v.w, 0x5410);
    out[3] = __byte_perm(v.y, v.w, 0x7632);
  }

  template <int kHalves>
  __device__ void accumulate(float (&acc)[kHalves][4], const Loaded& w, const uint4 (&x_hi)[kHalves],
                             const uint4 (&x_lo)[kHalves]) const {
    BlockFragments a;
    pairs(w.low, a.low);
    pairs(w.high, a.high);
    multiply_block<kHalves>(acc, a, x_hi, x_lo);
  }
};

struct MmaArgs {
  float* out;
  int64_t out_stride;
  const float* x;
  int64_t x_stride;
  int64_t rows, out_features, in_features;
  int stages_per_split;
  float* partials;     // [splits][rows][out_features] when split
  unsigned* counters;  // one per (feature tile, pass of rows), zero between calls
};

// Stages 512 k of x rows [first_row, first_row + rows_here) as (hi, lo) BF16 pairs (i, i + 4) per 8 values.
template <bool kAlignedX>
__device__ void stage_x(uint32_t* x_stage, const MmaArgs& a, int64_t first_row, int rows_here, int64_t k0) {
  for (int i = static_cast<int>(threadIdx.x); i < rows_here * kChunksPerRow; i += kThreads) {
    const int r = i / kChunksPerRow, c = i % kChunksPerRow;
    const int64_t k = k0 + 8 * c;
    float v[8];
    if (k < a.in_features) {
      const float* p = a.x + (first_row + r) * a.x_stride + k;
      if constexpr (kAlignedX) {
        const float4 v0 = reinterpret_cast<const float4*>(p)[0], v1 = reinterpret_cast<const float4*>(p)[1];
        v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z,
        v[7] = v1.w;
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = p[j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = 0.0f;
    }
    uint32_t* chunk = x_stage + r * kStageRowWords + c * kChunkWords;
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      hi[p] = bf16_pair(v[p], v[p + 4]);
      lo[p] = bf16_pair(v[p] - bf16_low(hi[p]), v[p + 4] - bf16_high(hi[p]));
    }
    reinterpret_cast<uint4*>(chunk)[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    reinterpret_cast<uint4*>(chunk)[1] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
}

template <typename Weights, int kHalves, bool kAlignedX>
__global__ void __launch_bounds__(kThreads, Weights::min_resident_blocks(kHalves))
    linear_mma_kernel(MmaArgs a, Weights weights) {
  __shared__ uint4 x_stage_storage[kHalves * 8 * kStageRowWords / 4];
  __shared__ float reduce[kWarps][kHalves][4][kWarpSize];
  __shared__ bool last_block;
  uint32_t* x_stage = reinterpret_cast<uint32_t*>(x_stage_storage);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, q = lane % 4;
  const int64_t first_feature = static_cast<int64_t>(blockIdx.x) * kTileFeatures;
  // Features past the end read the last one; their sums are not written.
  const int64_t feature_low = min64(first_feature + g, a.out_features - 1);
  const int64_t feature_high = min64(first_feature + g + 8, a.out_features - 1);
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kTileRows;
  const int rows_here = static_cast<int>(min64(a.rows - first_row, kHalves * 8));
  const int64_t blocks = a.in_features / kBlockK;
  const int64_t first_stage = static_cast<int64_t>(blockIdx.z) * a.stages_per_split;
  const int64_t end_block = min64(blocks, (first_stage + a.stages_per_split) * kStageBlocks);

  using Loaded = typename Weights::Loaded;
  Loaded current[kBlocksPerWarp] = {}, next[kBlocksPerWarp] = {};
  auto load_stage = [&](int64_t stage, Loaded(&into)[kBlocksPerWarp]) {
#pragma unroll
    for (int u = 0; u < kBlocksPerWarp; ++u) {
      const int64_t block = stage * kStageBlocks + warp * kBlocksPerWarp + u;
      if (block < end_block) into[u] = weights.load(feature_low, feature_high, block, q);
    }
  };
  float acc[kHalves][4] = {};
  load_stage(first_stage, current);
  for (int64_t stage = first_stage; stage * kStageBlocks < end_block; ++stage) {
    if ((stage + 1) * kStageBlocks < end_block) load_stage(stage + 1, next);
    __syncthreads();  // the previous stage's x is consumed
    stage_x<kAlignedX>(x_stage, a, first_row, rows_here, stage * kStageK);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kBlocksPerWarp; ++u) {
      const int local_block = warp * kBlocksPerWarp + u;
      if (stage * kStageBlocks + local_block < end_block) {
        uint4 x_hi[kHalves], x_lo[kHalves];
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          const int r = h * 8 + g;
          if (r < rows_here) {
            const uint4* chunk = reinterpret_cast<const uint4*>(x_stage + r * kStageRowWords +
                                                                (local_block * 4 + q) * kChunkWords);
            x_hi[h] = chunk[0];
            x_lo[h] = chunk[1];
          } else {
            x_hi[h] = x_lo[h] = make_uint4(0, 0, 0, 0);
          }
        }
        weights.template accumulate<kHalves>(acc, current[u], x_hi, x_lo);
      }
    }
#pragma unroll
    for (int u = 0; u < kBlocksPerWarp; ++u) current[u] = next[u];
  }

  // Sum the warps' partial tiles in a fixed order. acc[h][i]: feature g + 8 (i / 2), row 8h + 2q + i % 2.
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int i = 0; i < 4; ++i) reduce[warp][h][i][lane] = acc[h][i];
  __syncthreads();
  const bool split = gridDim.z > 1;
  float* target = split ? a.partials + static_cast<int64_t>(blockIdx.z) * a.rows * a.out_features : a.out;
  const int64_t target_stride = split ? a.out_features : a.out_stride;
  for (int e = static_cast<int>(threadIdx.x); e < kHalves * 4 * kWarpSize; e += kThreads) {
    const int h = e / (4 * kWarpSize), i = (e / kWarpSize) % 4, l = e % kWarpSize;
    const int64_t feature = first_feature + l / 4 + 8 * (i / 2);
    const int r = 8 * h + 2 * (l % 4) + i % 2;
    if (feature < a.out_features && r < rows_here) {
      float total = 0.0f;
      for (int w = 0; w < kWarps; ++w) total += reduce[w][h][i][l];
      target[(first_row + r) * target_stride + feature] = total;
    }
  }
  if (!split) return;

  // Split K: the last block of this tile to finish adds the splits' partials in split order.
  __threadfence();  // this block's partials are visible to the block that sums them
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* counter = a.counters + blockIdx.y * gridDim.x + blockIdx.x;
    last_block = atomicAdd(counter, 1u) == gridDim.z - 1;
    if (last_block) *counter = 0;  // ready for the next call (and the next replay of a step graph)
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  for (int e = static_cast<int>(threadIdx.x); e < kTileFeatures * rows_here; e += kThreads) {
    const int64_t feature = first_feature + e % kTileFeatures;
    const int64_t row = first_row + e / kTileFeatures;
    if (feature < a.out_features) {
      float total = 0.0f;
      for (unsigned s = 0; s < gridDim.z; ++s)
        total += __ldcg(a.partials + (static_cast<int64_t>(s) * a.rows + row) * a.out_features + feature);
      a.out[row * a.out_stride + feature] = total;
    }
  }
}

struct MmaGrid {
  int64_t feature_tiles, row_passes, stages, splits, stages_per_split;
};

MmaGrid mma_grid(int64_t rows, int64_t out_features, int64_t in_features) {
  MmaGrid grid;
  grid.feature_tiles = (out_features + kTileFeatures - 1) / kTileFeatures;
  grid.row_passes = (rows + kTileRows - 1) / kTileRows;
  grid.stages = (in_features + kStageK - 1) / kStageK;
  const int64_t tiles = grid.feature_tiles * grid.row_passes;
  const int64_t wanted = (kTargetBlocks + tiles - 1) / tiles;
  grid.stages_per_split = (grid.stages + wanted - 1) / wanted;
  grid.splits = (grid.stages + grid.stages_per_split - 1) / grid.stages_per_split;
  return grid;
}

template <typename Weights, int kHalves>
cudaError_t launch_mma(const Tensor& out, const Tensor& x, int64_t out_features, int64_t in_features,
                       const Weights& weights, const LinearMmaWorkspace& workspace, cudaStream_t stream) {
  const MmaGrid grid = mma_grid(x.rows, out_features, in_features);
  const MmaArgs args{out.ptr<float>(),
                     out.stride,
                     x.ptr<const float>(),
                     x.stride,
                     x.rows,
                     out_features,
                     in_features,
                     static_cast<int>(grid.stages_per_split),
                     workspace.partials,
                     workspace.counters};
  const dim3 blocks(static_cast<unsigned>(grid.feature_tiles), static_cast<unsigned>(grid.row_passes),
                    static_cast<unsigned>(grid.splits));
  const bool aligned_x = reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && (x.rows <= 1 || x.stride % 4 == 0);
  if (aligned_x)
    linear_mma_kernel<Weights, kHalves, true><<<blocks, kThreads, 0, stream>>>(args, weights);
  else
    linear_mma_kernel<Weights, kHalves, false><<<blocks, kThreads, 0, stream>>>(args, weights);
  return cudaGetLastError();
}

template <typename Weights>
cudaError_t launch_for_rows(const Tensor& out, const Tensor& x, int64_t out_features, int64_t in_features,
                            const Weights& weights, const LinearMmaWorkspace& workspace,
                            cudaStream_t stream) {
  if (x.rows <= 8)
    return launch_mma<Weights, 1>(out, x, out_features, in_features, weights, workspace, stream);
  return launch_mma<Weights, 2>(out, x, out_features, in_features, weights, workspace, stream);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

LinearMmaWorkspaceSize linear_mma_workspace_size(int64_t rows, int64_t out_features, int64_t in_features) {
  const MmaGrid grid = mma_grid(rows, out_features, in_features);
  if (grid.splits == 1) return {};
  return {static_cast<size_t>(grid.splits * rows * out_features),
          static_cast<size_t>(grid.feature_tiles * grid.row_passes)};
}

bool linear_mma_supports(const Tensor& x, const LinearWeight& w) {
  if (x.rows == 0 || x.rows > kLinearMmaMaxRows) return false;
  if (w.quantized()) return w.in_features % kBlockK == 0 && w.group_size % kBlockK == 0;
  return w.weight.dtype == DType::BF16 && w.in_features % kBlockK == 0 && aligned16(w.weight.data) &&
         (w.weight.rows <= 1 || w.weight.stride % 8 == 0);
}

cudaError_t launch_linear_mma(const Tensor& out, const Tensor& x, const LinearWeight& w,
                              const LinearMmaWorkspace& workspace, cudaStream_t stream) {
  if (w.quantized()) {
    return with_weight_type(w.scales.dtype, [&](auto type) {
      using S = decltype(type);
      const PackedInt4Weights<S> weights{w.packed.ptr<const uint32_t>(), w.packed.stride,
                                         w.scales.ptr<const S>(), w.scales.stride, w.group_size};
      return launch_for_rows(out, x, w.out_features, w.in_features, weights, workspace, stream);
    });
  }
  const Bf16Weights weights{w.weight.ptr<const uint4>(), w.weight.stride / 8};
  return launch_for_rows(out, x, w.out_features, w.in_features, weights, workspace, stream);
}

}  // namespace qspec::cuda
