// out = x W^T, the general kernels: dense (BF16/F16/F32) and W4A16 (compressed-tensors pack-quantized)
// weights of any shape, few rows of x. The common shapes take faster paths chosen by the backend: tensor
// cores for up to kLinearMmaMaxRows rows (linear_mma.cu), cuBLAS above (gemm_linear.h). One warp per output
// feature, 8 output features and up to 8 rows of x per block; the lanes stride along K (coalesced weight
// reads), accumulate in fp32 and reduce with shuffles. More rows of x are more blocks along grid.y (the
// weight is read again per pass of rows, mostly from L2).
#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/packed_int4_order.h"
#include "backend/cuda/pdl.cuh"

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
// The words of a row are in the backend's order (packed_int4_order.h).
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
    const uint32_t word = packed[n * packed_stride + packed_word_position(step, in_features / kWidth)];
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
  wait_for_previous_kernel();
  allow_next_kernel();
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
  return launch_kernel(linear_kernel<WeightSource, kAlignedX>, grid, kFeaturesPerBlock * kWarpSize, 0, stream,
                       out.ptr<float>(), out.stride, x.ptr<const float>(), x.stride, x.rows, out_features,
                       weights);
}

template <typename WeightSource>
cudaError_t launch_vector8(const Tensor& out, const Tensor& x, int64_t out_features,
                           const WeightSource& weights, cudaStream_t stream) {
  return x_rows_aligned(x) ? launch<true>(out, x, out_features, weights, stream)
                           : launch<false>(out, x, out_features, weights, stream);
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
  return with_weight_type(scales.dtype, [&](auto type) {
    using S = decltype(type);
    const auto* words = packed.ptr<const uint32_t>();
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
