// out = x W^T for dense (BF16/F16/F32) and W4A16 (compressed-tensors pack-quantized) weights, for few rows.
// W4A16 with K % 32 == 0 and group_size % 32 == 0: one warp per 4 output features, the lanes stride along K
// one 16-byte vector (4 words, 32 values, one scale) per feature at a time and use each weight vector for up
// to 8 rows of x, staged in shared memory by the block; the nibbles become floats with integer ops only.
// Everything else: the general kernel, one warp per output feature, 8 output features and up to 8 rows of x
// per block; the lanes stride along K (coalesced weight reads), accumulate in fp32 and reduce with shuffles.
// More rows of x are more blocks along grid.y (the weight is read again per pass of rows, mostly from L2).
#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kFeaturesPerBlock = 8;  // one warp each
constexpr int kRowsPerBlock = 8;

// Dense weight read 8 elements (16 bytes for BF16/F16, 32 for F32) at a time; needs K % 8 == 0 and 16-byte
// aligned rows.
template <typename W>
struct DenseVector8 {
  static constexpr int kWidth = 8;
  const W* weight;
  int64_t stride;
  int64_t in_features;

  __device__ int64_t steps() const { return in_features / kWidth; }
  __device__ void load(int64_t n, int64_t step, float (&w)[kWidth]) const {
    const W* p = weight + n * stride + step * kWidth;
    if constexpr (sizeof(W) == 2) {
      const uint4 raw = *reinterpret_cast<const uint4*>(p);
      const W* values = reinterpret_cast<const W*>(&raw);
#pragma unroll
      for (int i = 0; i < kWidth; ++i) w[i] = to_float(values[i]);
    } else {
      const float4 low = reinterpret_cast<const float4*>(p)[0];
      const float4 high = reinterpret_cast<const float4*>(p)[1];
      w[0] = low.x, w[1] = low.y, w[2] = low.z, w[3] = low.w;
      w[4] = high.x, w[5] = high.y, w[6] = high.z, w[7] = high.w;
    }
  }
};

// Dense weight of any K or alignment, one element at a time.
template <typename W>
struct DenseScalar {
  static constexpr int kWidth = 1;
  const W* weight;
  int64_t stride;
  int64_t in_features;

  __device__ int64_t steps() const { return in_features; }
  __device__ void load(int64_t n, int64_t step, float (&w)[kWidth]) const {
    w[0] = to_float(weight[n * stride + step]);
  }
};

// W4A16: one int32 word = 8 nibbles along K, lowest first; value = (nibble - 8) * scale[n][k / group_size].
// kGroupHoldsWord: group_size % 8 == 0, so one scale serves the whole word.
template <typename S, bool kGroupHoldsWord>
struct PackedInt4 {
  static constexpr int kWidth = 8;
  const uint32_t* packed;
  int64_t packed_stride;
  const S* scales;
  int64_t scales_stride;
  int64_t in_features;
  int group_size;

  __device__ int64_t steps() const { return in_features / kWidth; }
  __device__ void load(int64_t n, int64_t step, float (&w)[kWidth]) const {
    const uint32_t word = packed[n * packed_stride + step];
    const S* row_scales = scales + n * scales_stride;
    const int64_t k0 = step * kWidth;
    const float word_scale = kGroupHoldsWord ? to_float(row_scales[k0 / group_size]) : 0.0f;
#pragma unroll
    for (int i = 0; i < kWidth; ++i) {
      const int nibble = static_cast<int>((word >> (4 * i)) & 0xFu);
      const float scale = kGroupHoldsWord ? word_scale : to_float(row_scales[(k0 + i) / group_size]);
      w[i] = static_cast<float>(nibble - 8) * scale;
    }
  }
};

// x values k0..k0+kWidth-1 of one row; kAligned: float4 loads (16-byte aligned rows, kWidth == 8).
template <int kWidth, bool kAligned>
__device__ inline void load_x(const float* p, float (&v)[kWidth]) {
  if constexpr (kAligned && kWidth == 8) {
    const float4 low = reinterpret_cast<const float4*>(p)[0];
    const float4 high = reinterpret_cast<const float4*>(p)[1];
    v[0] = low.x, v[1] = low.y, v[2] = low.z, v[3] = low.w;
    v[4] = high.x, v[5] = high.y, v[6] = high.z, v[7] = high.w;
  } else {
#pragma unroll
    for (int i = 0; i < kWidth; ++i) v[i] = p[i];
  }
}

template <typename WeightSource, bool kAlignedX>
__global__ void linear_kernel(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t rows,
                              int64_t out_features, WeightSource weights) {
  constexpr int kWidth = WeightSource::kWidth;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kFeaturesPerBlock + warp;
  if (n >= out_features) return;  // whole warps leave; the kernel has no block barrier
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock;
  const int64_t rows_here = rows - first_row < kRowsPerBlock ? rows - first_row : kRowsPerBlock;
  const float* x_rows = x + first_row * x_stride;
  float acc[kRowsPerBlock] = {};
  for (int64_t step = lane; step < weights.steps(); step += kWarpSize) {
    float w[kWidth];
    weights.load(n, step, w);
#pragma unroll
    for (int r = 0; r < kRowsPerBlock; ++r) {
      if (r < rows_here) {
        float xv[kWidth];
        load_x<kWidth, kAlignedX>(x_rows + r * x_stride + step * kWidth, xv);
#pragma unroll
        for (int i = 0; i < kWidth; ++i) acc[r] += w[i] * xv[i];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) {
    const float total = warp_sum(acc[r]);
    if (lane == 0 && r < rows_here) out[(first_row + r) * out_stride + n] = total;
  }
}

constexpr int kVectorFeatures = 4;  // output features per warp of the W4A16 vector kernel
constexpr int kVectorWarps = 4;     // warps per block
constexpr int kVectorWords = 4;     // packed words per 16-byte vector
constexpr int kWordValues = 8;
constexpr int kVectorValues = kVectorWords * kWordValues;
// x in shared memory: 4 padding floats after every 32 values, so the lanes' 16-byte reads of 32-value
// vectors fall into different banks.
constexpr int kPaddedVectorValues = kVectorValues + 4;

// 1 + nibble / 16 for nibble kNibble of the word: the nibble placed at the top of the mantissa of 1.0f.
template <int kNibble>
__device__ inline float one_plus_sixteenth(uint32_t word) {
  constexpr int kShift = 19 - 4 * kNibble;
  uint32_t placed = word;
  if constexpr (kShift >= 0) {
    placed = word << kShift;
  } else {
    placed = word >> -kShift;
  }
  return __uint_as_float((placed & 0x00780000u) | 0x3F800000u);
}

template <int kWord>
__device__ inline uint32_t word_of(const uint4& v) {
  if constexpr (kWord == 0) return v.x;
  if constexpr (kWord == 1) return v.y;
  if constexpr (kWord == 2) return v.z;
  return v.w;
}

// One packed word of kVectorFeatures features against kRows rows of x (shared memory) at offset k:
// sum_i (nibble_i - 8) x_i = 16 (sum_i g_i x_i - 1.5 sum_i x_i) with g_i = 1 + nibble_i / 16.
template <int kRows, int kWord>
__device__ inline void accumulate_word(float (&acc)[kRows][kVectorFeatures],
                                       const uint4 (&w)[kVectorFeatures],
                                       const float (&scale16)[kVectorFeatures], const float* x_rows,
                                       int x_stride, int rows_here, int k) {
  float g[kVectorFeatures][kWordValues];
#pragma unroll
  for (int f = 0; f < kVectorFeatures; ++f) {
    const uint32_t word = word_of<kWord>(w[f]);
    g[f][0] = one_plus_sixteenth<0>(word);
    g[f][1] = one_plus_sixteenth<1>(word);
    g[f][2] = one_plus_sixteenth<2>(word);
    g[f][3] = one_plus_sixteenth<3>(word);
    g[f][4] = one_plus_sixteenth<4>(word);
    g[f][5] = one_plus_sixteenth<5>(word);
    g[f][6] = one_plus_sixteenth<6>(word);
    g[f][7] = one_plus_sixteenth<7>(word);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (r < rows_here) {
      const float4* p = reinterpret_cast<const float4*>(x_rows + r * x_stride + k);
      const float4 low = p[0], high = p[1];
      const float xv[kWordValues] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
      const float sum = ((xv[0] + xv[1]) + (xv[2] + xv[3])) + ((xv[4] + xv[5]) + (xv[6] + xv[7]));
      const float start = -1.5f * sum;
#pragma unroll
      for (int f = 0; f < kVectorFeatures; ++f) {
        float t = start;
#pragma unroll
        for (int i = 0; i < kWordValues; ++i) t = fmaf(g[f][i], xv[i], t);
        acc[r][f] = fmaf(scale16[f], t, acc[r][f]);
      }
    }
  }
}

// group_size % 32 == 0: one scale per feature for the whole 16-byte vector (scale16 = 16 * scale).
template <int kRows>
__device__ inline void accumulate_vector(float (&acc)[kRows][kVectorFeatures],
                                         const uint4 (&w)[kVectorFeatures],
                                         const float (&scale16)[kVectorFeatures], const float* x_rows,
                                         int x_stride, int rows_here, int x_offset) {
  accumulate_word<kRows, 0>(acc, w, scale16, x_rows, x_stride, rows_here, x_offset);
  accumulate_word<kRows, 1>(acc, w, scale16, x_rows, x_stride, rows_here, x_offset + kWordValues);
  accumulate_word<kRows, 2>(acc, w, scale16, x_rows, x_stride, rows_here, x_offset + 2 * kWordValues);
  accumulate_word<kRows, 3>(acc, w, scale16, x_rows, x_stride, rows_here, x_offset + 3 * kWordValues);
}

// Resident blocks per SM that the registers must allow (more rows per block need more registers).
constexpr int vector_min_blocks(int rows) {
  return rows == 1 ? 5 : 4;
}

// group_size % 32 == 0. The block walks K in tiles of kWarpSize * kUnroll vectors: the weight vectors of a
// tile and their scales are loaded first (one memory round trip), then the block stages that tile of x in
// shared memory, then each lane works on its kUnroll vectors. With vector_min_blocks(1) = 5 blocks per SM, a
// [9216, K] matrix at M = 1 (576 blocks) runs in one wave on 132 SMs.
template <typename S, int kRows, int kUnroll>
__global__ void __launch_bounds__(kVectorWarps* kWarpSize, vector_min_blocks(kRows))
    w4a16_vector_kernel(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t rows,
                        const uint4* packed, int64_t packed_stride, const S* scales, int64_t scales_stride,
                        int group_size, int64_t out_features, int64_t vectors) {
  constexpr int kTileVectors = kWarpSize * kUnroll;
  constexpr int kTileStride = kTileVectors * kPaddedVectorValues;
  constexpr int kTileFloat4s = kTileVectors * kVectorValues / 4;
  constexpr int kVectorFloat4s = kVectorValues / 4;
  __shared__ float4 x_tile_storage[kRows * kTileStride / 4];
  float* x_tile = reinterpret_cast<float*>(x_tile_storage);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t first_feature =
      (static_cast<int64_t>(blockIdx.x) * kVectorWarps + static_cast<int>(threadIdx.x) / kWarpSize) *
      kVectorFeatures;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kRows;
  const int rows_here = static_cast<int>(rows - first_row < kRows ? rows - first_row : kRows);
  const float* x_rows = x + first_row * x_stride;
  const uint4* weight_rows[kVectorFeatures];
  const S* scale_rows[kVectorFeatures];
#pragma unroll
  for (int f = 0; f < kVectorFeatures; ++f) {
    // Features past the end (whole warps of the last block, too) read the last one; their sums are not
    // written.
    const int64_t n = first_feature + f < out_features ? first_feature + f : out_features - 1;
    weight_rows[f] = packed + n * packed_stride;
    scale_rows[f] = scales + n * scales_stride;
  }
  float acc[kRows][kVectorFeatures] = {};
  for (int64_t tile = 0; tile < vectors; tile += kTileVectors) {
    uint4 w[kUnroll][kVectorFeatures] = {};
    S scale[kUnroll][kVectorFeatures] = {};
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t vector = tile + u * kWarpSize + lane;
      if (vector < vectors) {
        const int64_t group = vector * kVectorValues / group_size;
#pragma unroll
        for (int f = 0; f < kVectorFeatures; ++f) {
          w[u][f] = __ldcs(weight_rows[f] + vector);
          scale[u][f] = scale_rows[f][group];
        }
      }
    }
    const int tile_float4s =
        static_cast<int>(vectors - tile < kTileVectors ? vectors - tile : kTileVectors) * kVectorFloat4s;
    __syncthreads();  // the previous tile of x is consumed
    for (int i = static_cast<int>(threadIdx.x); i < rows_here * kTileFloat4s; i += kVectorWarps * kWarpSize) {
      const int r = i / kTileFloat4s, c = i % kTileFloat4s;
      if (c < tile_float4s) {
        const float4 v =
            *reinterpret_cast<const float4*>(x_rows + r * x_stride + tile * kVectorValues + 4 * c);
        *reinterpret_cast<float4*>(x_tile + r * kTileStride + 4 * c + 4 * (c / kVectorFloat4s)) = v;
      }
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t vector = tile + u * kWarpSize + lane;
      if (vector < vectors) {
        float scale16[kVectorFeatures];
#pragma unroll
        for (int f = 0; f < kVectorFeatures; ++f) scale16[f] = 16.0f * to_float(scale[u][f]);
        accumulate_vector<kRows>(acc, w[u], scale16, x_tile, kTileStride, rows_here,
                                 (u * kWarpSize + lane) * kPaddedVectorValues);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int f = 0; f < kVectorFeatures; ++f) {
      const float total = warp_sum(acc[r][f]);
      if (lane == (r * kVectorFeatures + f) % kWarpSize && r < rows_here && first_feature + f < out_features)
        out[(first_row + r) * out_stride + first_feature + f] = total;
    }
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Rows of x start 16-byte aligned: float4 loads are allowed.
bool x_rows_aligned(const Tensor& x) {
  return aligned16(x.data) && (x.rows <= 1 || x.stride % 4 == 0);
}

template <bool kAlignedX, typename WeightSource>
cudaError_t launch(const Tensor& out, const Tensor& x, int64_t out_features, const WeightSource& weights,
                   cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned int>((out_features + kFeaturesPerBlock - 1) / kFeaturesPerBlock),
                  static_cast<unsigned int>((x.rows + kRowsPerBlock - 1) / kRowsPerBlock));
  linear_kernel<WeightSource, kAlignedX><<<grid, kFeaturesPerBlock * kWarpSize, 0, stream>>>(
      out.ptr<float>(), out.stride, x.ptr<const float>(), x.stride, x.rows, out_features, weights);
  return cudaGetLastError();
}

template <typename WeightSource>
cudaError_t launch_vector8(const Tensor& out, const Tensor& x, int64_t out_features,
                           const WeightSource& weights, cudaStream_t stream) {
  return x_rows_aligned(x) ? launch<true>(out, x, out_features, weights, stream)
                           : launch<false>(out, x, out_features, weights, stream);
}

template <typename S, int kRows>
cudaError_t launch_w4a16_vector(const Tensor& out, const Tensor& x, const Tensor& packed,
                                const Tensor& scales, int group_size, cudaStream_t stream) {
  // 3 vectors per lane: a tile of 96 vectors covers K = 2560 (80 vectors) in one pass, K = 9216 in three.
  constexpr int kUnroll = kRows <= 2 ? 3 : (kRows <= 4 ? 2 : 1);
  constexpr int kBlockFeatures = kVectorWarps * kVectorFeatures;
  const dim3 grid(static_cast<unsigned int>((packed.rows + kBlockFeatures - 1) / kBlockFeatures),
                  static_cast<unsigned int>((x.rows + kRows - 1) / kRows));
  const auto* vectors = packed.ptr<const uint4>();
  const int64_t vector_stride = packed.stride / kVectorWords;
  const int64_t vector_count = packed.cols / kVectorWords;
  w4a16_vector_kernel<S, kRows, kUnroll><<<grid, kVectorWarps * kWarpSize, 0, stream>>>(
      out.ptr<float>(), out.stride, x.ptr<const float>(), x.stride, x.rows, vectors, vector_stride,
      scales.ptr<const S>(), scales.stride, group_size, packed.rows, vector_count);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_dense_linear(const Tensor& out, const Tensor& x, const Tensor& weight,
                                cudaStream_t stream) {
  if (x.rows == 0 || weight.rows == 0) return cudaSuccess;
  return with_weight_type(weight.dtype, [&](auto type) {
    using W = decltype(type);
    const int64_t k = weight.cols;
    const bool vector8 = k % 8 == 0 && aligned16(weight.data) &&
                         (weight.rows <= 1 || (weight.stride * static_cast<int64_t>(sizeof(W))) % 16 == 0);
    if (vector8)
      return launch_vector8(out, x, weight.rows, DenseVector8<W>{weight.ptr<const W>(), weight.stride, k},
                            stream);
    return launch<false>(out, x, weight.rows, DenseScalar<W>{weight.ptr<const W>(), weight.stride, k},
                         stream);
  });
}

cudaError_t launch_w4a16_linear(const Tensor& out, const Tensor& x, const Tensor& packed,
                                const Tensor& scales, int group_size, cudaStream_t stream) {
  if (x.rows == 0 || packed.rows == 0) return cudaSuccess;
  const int64_t k = packed.cols * 8;
  const bool vector_kernel = group_size % kVectorValues == 0 && k % kVectorValues == 0 &&
                             aligned16(packed.data) &&
                             (packed.rows <= 1 || packed.stride % kVectorWords == 0) && x_rows_aligned(x);
  return with_weight_type(scales.dtype, [&](auto type) {
    using S = decltype(type);
    const auto* words = packed.ptr<const uint32_t>();
    if (vector_kernel) {
      if (x.rows > 4)  // 8 rows per pass: more passes read the weights again, mostly from L2
        return launch_w4a16_vector<S, 8>(out, x, packed, scales, group_size, stream);
      if (x.rows > 2) return launch_w4a16_vector<S, 4>(out, x, packed, scales, group_size, stream);
      if (x.rows > 1) return launch_w4a16_vector<S, 2>(out, x, packed, scales, group_size, stream);
      return launch_w4a16_vector<S, 1>(out, x, packed, scales, group_size, stream);
    }
    if (group_size % 8 == 0)
      return launch_vector8(
          out, x, packed.rows,
          PackedInt4<S, true>{words, packed.stride, scales.ptr<const S>(), scales.stride, k, group_size},
          stream);
    return launch_vector8(
        out, x, packed.rows,
        PackedInt4<S, false>{words, packed.stride, scales.ptr<const S>(), scales.stride, k, group_size},
        stream);
  });
}

}  // namespace qspec::cuda
