// The operands of the many-row linear (prefill) as BF16 for cuBLAS: x [M, K] F32 -> BF16, and W4A16 rows
// dequantized to BF16, (nibble - 8) * scale rounded once. Both are one pass over memory; at M = 2048 they
// cost a few percent of the matrix product.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 256;

__global__ void rows_to_bf16_kernel(__nv_bfloat16* out, const float* x, int64_t x_stride, int64_t rows,
                                    int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kBlock) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = __float2bfloat16_rn(x[r * x_stride + c]);
  }
}

// One thread per packed word: 8 consecutive values of one row (blockIdx.y), which leave in one 16-byte store
// (a row of out is in_features values, a multiple of 8, so every word's values are 16-byte aligned).
template <typename S>
__global__ void dequantize_w4a16_kernel(__nv_bfloat16* out, const uint32_t* packed, int64_t packed_stride,
                                        const S* scales, int64_t scales_stride, int group_size,
                                        int64_t first_row, int64_t words_per_row) {
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (w >= words_per_row) return;
  const int64_t r = blockIdx.y;
  const uint32_t word = packed[(first_row + r) * packed_stride + w];
  const S* row_scales = scales + (first_row + r) * scales_stride;
  uint32_t pairs[4];
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const float low = static_cast<float>(static_cast<int>((word >> (4 * j)) & 0xFu) - 8) *
                      to_float(row_scales[(w * 8 + j) / group_size]);
    const float high = static_cast<float>(static_cast<int>((word >> (4 * j + 4)) & 0xFu) - 8) *
                       to_float(row_scales[(w * 8 + j + 1) / group_size]);
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    pairs[j / 2] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  reinterpret_cast<uint4*>(out)[r * words_per_row + w] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

unsigned grid_for(int64_t items) {
  const int64_t blocks = (items + kBlock - 1) / kBlock;
  return static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
}

}  // namespace

cudaError_t launch_rows_to_bf16(void* out, const Tensor& x, cudaStream_t stream) {
  if (x.numel() == 0) return cudaSuccess;
  rows_to_bf16_kernel<<<grid_for(x.numel()), kBlock, 0, stream>>>(
      static_cast<__nv_bfloat16*>(out), x.ptr<const float>(), x.stride, x.rows, x.cols);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_w4a16(void* out, const LinearWeight& w, int64_t first_row, int64_t rows,
                                    cudaStream_t stream) {
  const int64_t words_per_row = w.in_features / 8;
  return with_weight_type(w.scales.dtype, [&](auto type) {
    using S = decltype(type);
    const dim3 grid(static_cast<unsigned>((words_per_row + kBlock - 1) / kBlock),
                    static_cast<unsigned>(rows));
    dequantize_w4a16_kernel<S><<<grid, kBlock, 0, stream>>>(
        static_cast<__nv_bfloat16*>(out), w.packed.ptr<const uint32_t>(), w.packed.stride,
        w.scales.ptr<const S>(), w.scales.stride, w.group_size, first_row, words_per_row);
    return cudaGetLastError();
  });
}

}  // namespace qspec::cuda
