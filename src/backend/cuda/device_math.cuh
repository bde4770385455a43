// Device-side helpers shared by the kernels: weight element conversion, fp32 reductions and the scalar
// functions of the CPU reference (backend/cpu/math.h), written with the same fp32 operations.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "backend/tensor.h"
#include "core/dtype.h"

namespace qspec::cuda {

inline constexpr int kWarpSize = 32;

__device__ inline float to_float(float v) {
  return v;
}
__device__ inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ inline float to_float(__half v) {
  return __half2float(v);
}

// 8 BF16 values (one 16-byte load) as floats: a BF16 value is the upper half of its float.
__device__ inline void bf16x8_to_float(const uint4 raw, float (&out)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// (value & mask) | bias in one LOP3 (nvcc emits two for the expression).
template <uint32_t kMask, uint32_t kBias>
__device__ inline uint32_t and_or(uint32_t value) {
  uint32_t result;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(result) : "r"(value), "n"(kMask), "n"(kBias));
  return result;
}

// Word i of a 16-byte load.
__device__ inline uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// c += A B on tensor cores, mma.sync m16n8k16 (BF16 in, FP32 accumulate, sm_80+): A's four fragment
// registers and B's two, in the instruction's register layout.
__device__ inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (low, high) rounded to BF16 as one 32-bit pair, low in the low half.
__device__ inline uint32_t bf16_pair(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// (low, high) as BF16 pairs in kParts parts: hi = bf16(x), and with two parts (split BF16) lo = bf16(x - hi)
// (x - hi - lo ~ 2^-17 x). With one part lo is left alone: nothing reads it.
template <int kParts>
__device__ inline void split_bf16_pair(float low, float high, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 rounded = __floats2bfloat162_rn(low, high);
  hi = *reinterpret_cast<const uint32_t*>(&rounded);
  if constexpr (kParts == 2) {
    const float2 back = __bfloat1622float2(rounded);
    lo = bf16_pair(low - back.x, high - back.y);
  }
}

__device__ inline float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); scratch holds one float per warp. Every thread gets the
// total; the trailing barrier lets the caller reuse scratch at once.
__device__ inline float block_sum(float v, float* scratch) {
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  v = warp_sum(v);
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

__device__ inline float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ inline float silu(float x) {
  return x / (1.0f + expf(-x));
}
// The gated MLP's activation, one expression wherever it is computed (silu_mul, the fused MLP).
__device__ inline float silu_mul(float gate, float up) {
  return silu(gate) * up;
}
// F.softplus(x, beta=1, threshold=20)
__device__ inline float softplus(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

// The GDN gates' log-decay g = -exp(a_log) * softplus(a + dt_bias), one expression wherever it is computed.
__device__ inline float gdn_log_decay(float a_log, float a, float dt_bias) {
  const float decay_rate = -expf(a_log);
  return decay_rate * softplus(a + dt_bias);
}

// The gated RMSNorm of one value: w * (x * inverse_rms) * silu(z).
__device__ inline float gated_norm(float weight, float x, float inverse_rms, float z) {
  return weight * (x * inverse_rms) * silu(z);
}

// One token of a channel's causal conv1d + SiLU: taps[K - 1] multiplies the current input, taps[j] the j-th
// oldest of the K - 1 previous ones in `history` (then advanced past the current input), summed in the CPU
// reference's order.
template <int kKernel>
__device__ inline float conv_silu_step(const float (&taps)[kKernel], float* history, float current) {
  constexpr int kHistory = kKernel - 1;
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kHistory; ++j) sum += taps[j] * history[j];
  sum += taps[kHistory] * current;
#pragma unroll
  for (int j = 0; j + 1 < kHistory; ++j) history[j] = history[j + 1];
  if constexpr (kHistory > 0) history[kHistory - 1] = current;
  return silu(sum);
}

// Calls launch(W{}) with W the device type of a BF16/F16/F32 weight; other dtypes are refused.
template <typename Launch>
cudaError_t with_weight_type(DType dtype, Launch launch) {
  switch (dtype) {
    case DType::BF16:
      return launch(__nv_bfloat16{});
    case DType::F16:
      return launch(__half{});
    case DType::F32:
      return launch(float{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Grid (column blocks, rows) of a row-wise kernel; rows past grid.y's limit are taken in strides by the
// kernel (for r = blockIdx.y; r < rows; r += gridDim.y), so no thread divides by the column count.
inline dim3 column_blocks_by_rows(int64_t rows, int64_t cols, int64_t columns_per_block) {
  constexpr int64_t kMaxGridRows = 65535;
  return dim3(static_cast<unsigned>((cols + columns_per_block - 1) / columns_per_block),
              static_cast<unsigned>(rows < kMaxGridRows ? rows : kMaxGridRows));
}

// Every row of t starts 16-byte aligned (float4 loads).
inline bool rows_aligned_to_float4(const Tensor& t) {
  return (t.rows <= 1 || t.stride % 4 == 0) && reinterpret_cast<uintptr_t>(t.data) % sizeof(float4) == 0;
}

// A grid-stride launch size for `count` independent elements.
inline unsigned int grid_for(int64_t count, int block) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;
  const int64_t blocks = (count + block - 1) / block;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace qspec::cuda
