// The operands of the many-row linear (prefill) as BF16 for cuBLAS: x [M, K] F32 -> BF16 (or, for the gated
// MLP's down projection, silu(gate) * up made from the gate and up halves, as silu_mul makes it, then
// rounded), and W4A16 rows dequantized to BF16, (nibble - 8) * scale rounded once. Both are one pass over
// memory; at M = 2048 they cost a few percent of the matrix product.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/packed_int4_order.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

// rows_to_bf16: a block converts kConvertBlock * kConvertColumns consecutive columns of a row.
constexpr int kConvertBlock = 128;
constexpr int kConvertColumns = 4;
// dequantize: a block dequantizes kDequantizeBlock packed words of a row (the 4B's rows are 320 and 1152
// words: whole blocks).
constexpr int kDequantizeBlock = 64;
constexpr int kValuesPerWord = 8;

// One value of the operand (launchers.h): x, silu_mul(x, y) or x * sigmoid(y), as silu_mul and sigmoid_mul
// make them.
template <RowGate kGate>
__device__ inline float gated_value(float x, float y) {
  if constexpr (kGate == RowGate::SiluMul)
    return silu_mul(x, y);
  else if constexpr (kGate == RowGate::SigmoidMul)
    return x * sigmoid(y);
  else
    return x;
}

// Grid column_blocks_by_rows (device_math.cuh). y: the gate's second operand at x's row stride (unused for
// RowGate::None). kAligned: 16-byte aligned source rows and a multiple of 4 columns (float4 loads and one
// 8-byte store per thread); otherwise element by element.
template <RowGate kGate, bool kAligned>
__global__ void rows_to_bf16_kernel(__nv_bfloat16* out, const float* x, const float* y, int64_t x_stride,
                                    int64_t rows, int cols) {
  wait_for_previous_kernel();  // no early allow_next_kernel(): cuBLAS comes next (pdl.cuh)
  const int c =
      (static_cast<int>(blockIdx.x) * kConvertBlock + static_cast<int>(threadIdx.x)) * kConvertColumns;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t offset = r * x_stride + c;
    __nv_bfloat16* dst = out + r * cols + c;
    if constexpr (kAligned) {
      float4 v = *reinterpret_cast<const float4*>(x + offset);
      if constexpr (kGate != RowGate::None) {
        const float4 u = *reinterpret_cast<const float4*>(y + offset);
        v = make_float4(gated_value<kGate>(v.x, u.x), gated_value<kGate>(v.y, u.y),
                        gated_value<kGate>(v.z, u.z), gated_value<kGate>(v.w, u.w));
      }
      *reinterpret_cast<uint2*>(dst) = make_uint2(bf16_pair(v.x, v.y), bf16_pair(v.z, v.w));
    } else {
      for (int i = 0; i < kConvertColumns && c + i < cols; ++i)
        dst[i] = __float2bfloat16_rn(
            gated_value<kGate>(x[offset + i], kGate == RowGate::None ? 0.0f : y[offset + i]));
    }
  }
}

// Where the packed word with values kValuesPerWord * word .. + 7 of weight row `row` lies (nibble j holds
// value kValuesPerWord * word + j), in the backend's order (packed_int4_order.h).
__device__ inline int64_t packed_word_index(int64_t row, int64_t word, int64_t packed_stride,
                                            int64_t words_per_row) {
  return row * packed_stride + packed_word_position(word, words_per_row);
}

// One thread per packed word: 8 consecutive values of one row (blockIdx.y), which leave in one 16-byte store
// (a row of out is in_features values, a multiple of 8, so every word's values are 16-byte aligned). The
// group of each value is followed from the word's first one (one division per word, not per value).
template <typename S>
__global__ void dequantize_w4a16_kernel(__nv_bfloat16* out, const uint32_t* packed, int64_t packed_stride,
                                        const S* scales, int64_t scales_stride, int group_size,
                                        int64_t first_row, int64_t words_per_row) {
  wait_for_previous_kernel();  // no early allow_next_kernel(): cuBLAS comes next (pdl.cuh)
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kDequantizeBlock + threadIdx.x;
  if (w >= words_per_row) return;
  const int64_t r = blockIdx.y;
  const uint32_t word = packed[packed_word_index(first_row + r, w, packed_stride, words_per_row)];
  const S* row_scales = scales + (first_row + r) * scales_stride;
  const int first_value = static_cast<int>(w) * kValuesPerWord;
  int group = first_value / group_size;
  int group_end = (group + 1) * group_size;
  float scale = to_float(row_scales[group]);
  float values[kValuesPerWord];
#pragma unroll
  for (int j = 0; j < kValuesPerWord; ++j) {
    if (first_value + j >= group_end) {
      ++group;
      group_end += group_size;
      scale = to_float(row_scales[group]);
    }
    values[j] = static_cast<float>(static_cast<int>((word >> (4 * j)) & 0xFu) - 8) * scale;
  }
  reinterpret_cast<uint4*>(out)[r * words_per_row + w] =
      make_uint4(bf16_pair(values[0], values[1]), bf16_pair(values[2], values[3]),
                 bf16_pair(values[4], values[5]), bf16_pair(values[6], values[7]));
}

}  // namespace

namespace {

template <RowGate kGate>
cudaError_t launch_rows_to_bf16_gated(__nv_bfloat16* out, const Tensor& x, const float* y,
                                      cudaStream_t stream) {
  constexpr int kColumnsPerBlock = kConvertBlock * kConvertColumns;
  const dim3 grid = column_blocks_by_rows(x.rows, x.cols, kColumnsPerBlock);
  // y's rows share x's row stride: float4 loads when both start 16-byte aligned.
  const bool aligned = x.cols % kConvertColumns == 0 && rows_aligned_to_float4(x) &&
                       (kGate == RowGate::None || reinterpret_cast<uintptr_t>(y) % 16 == 0);
  const int cols = static_cast<int>(x.cols);
  return launch_kernel(aligned ? rows_to_bf16_kernel<kGate, true> : rows_to_bf16_kernel<kGate, false>, grid,
                       kConvertBlock, 0, stream, out, x.ptr<const float>(), y, x.stride, x.rows, cols);
}

}  // namespace

cudaError_t launch_rows_to_bf16(void* out, const Tensor& x, const float* y, RowGate gate,
                                cudaStream_t stream) {
  if (x.numel() == 0) return cudaSuccess;
  auto* dst = static_cast<__nv_bfloat16*>(out);
  switch (gate) {
    case RowGate::None:
      return launch_rows_to_bf16_gated<RowGate::None>(dst, x, y, stream);
    case RowGate::SiluMul:
      return launch_rows_to_bf16_gated<RowGate::SiluMul>(dst, x, y, stream);
    case RowGate::SigmoidMul:
      return launch_rows_to_bf16_gated<RowGate::SigmoidMul>(dst, x, y, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_dequantize_w4a16(void* out, const LinearWeight& w, int64_t first_row, int64_t rows,
                                    cudaStream_t stream) {
  const int64_t words_per_row = w.in_features / kValuesPerWord;
  return with_weight_type(w.scales.dtype, [&](auto type) {
    using S = decltype(type);
    const dim3 grid(static_cast<unsigned>((words_per_row + kDequantizeBlock - 1) / kDequantizeBlock),
                    static_cast<unsigned>(rows));
    return launch_kernel(dequantize_w4a16_kernel<S>, grid, kDequantizeBlock, 0, stream,
                         static_cast<__nv_bfloat16*>(out), w.packed.ptr<const uint32_t>(), w.packed.stride,
                         w.scales.ptr<const S>(), w.scales.stride, w.group_size, first_row, words_per_row);
  });
}

}  // namespace qspec::cuda
