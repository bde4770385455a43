// RMSNorm over groups of columns (plain, zero-centered 1 + w), the gated form of the GDN output
// y = w * rmsnorm(x) * silu(z), and the residual form x += delta; y = rmsnorm(x) (one kernel instead of an
// add and a norm per residual connection). One block per (row, group); sum of squares in fp32.
//
// A norm whose rows feed cuBLAS (prefill: a sublayer's norm, the GDN output's gated norm) also writes them
// rounded to BF16, as rows_to_bf16 would round them, into the GEMM's operand, and the F32 rows only where
// something else reads them: the linears then skip their pass over the rows.
//
// Groups of a multiple of 4 columns with 16-byte aligned rows (every Qwen3.5 norm) take the register kernel:
// each thread holds up to kMaxQuadsPerThread float4 of its group, so x is read from memory once and written
// once, in 16-byte accesses. Groups of up to 128 columns (the GDN heads' gated norm, 32 per token) take a
// warp each, kBlock / 32 groups to a block, and reduce without barriers. Other shapes take the element-wise
// kernel.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/split_sums.cuh"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kMaxQuadsPerThread = 8;

// ResidualOfSplits: Residual with delta's values still a linear's split partials (UnsummedSplits), added
// here and stored into delta, as the linears' sums kernel would have stored them.
enum class NormInput { Plain, Gated, Residual, ResidualOfSplits };

// kResidual: x is updated in place (x += delta) before it is normalised; each thread reads back only the
// elements it wrote.
// out: the F32 rows, or null; operand: the BF16 rows (contiguous, gridDim.x * group values), or null.
template <typename W, NormInput kInput>
__global__ void rmsnorm_kernel(float* out, int64_t out_stride, __nv_bfloat16* operand, float* x,
                               int64_t x_stride, const W* weight, const float* z, int64_t z_stride,
                               int64_t group, float eps, float weight_offset) {
  wait_for_previous_kernel();
  allow_next_kernel_unless_cublas_next(operand != nullptr);
  constexpr bool kGated = kInput == NormInput::Gated;
  __shared__ float scratch[kBlock / kWarpSize];
  const int64_t t = blockIdx.y;
  const int64_t first = blockIdx.x * group;
  float* in = x + t * x_stride + first;
  if constexpr (kInput == NormInput::Residual) {
    const float* delta = z + t * z_stride + first;
    for (int64_t i = threadIdx.x; i < group; i += blockDim.x) in[i] = in[i] + delta[i];
  }
  float sum_of_squares = 0.0f;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) sum_of_squares += in[i] * in[i];
  sum_of_squares = block_sum(sum_of_squares, scratch);
  const float inverse_rms = 1.0f / sqrtf(sum_of_squares / static_cast<float>(group) + eps);
  float* y = out == nullptr ? nullptr : out + t * out_stride + first;
  __nv_bfloat16* y_bf16 = operand == nullptr ? nullptr : operand + t * gridDim.x * group + first;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) {
    const float scale = weight_offset + to_float(weight[i]);
    float value;
    if constexpr (kGated)
      value = gated_norm(scale, in[i], inverse_rms, z[t * z_stride + first + i]);
    else
      value = in[i] * inverse_rms * scale;
    if (y != nullptr) y[i] = value;
    if (y_bf16 != nullptr) y_bf16[i] = __float2bfloat16_rn(value);
  }
}

__device__ inline float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ inline void store4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}

// The register form: thread i holds quads i, i + kThreads, ... (at most kQuads) of its group of `quads`
// float4, kThreads being the block (kWarpGroups false: a block per group, the sum of squares over the block)
// or a warp (kWarpGroups: a warp per group, groups blockIdx.x * warps + warp of the row). Same arithmetic per
// element and the same outputs as rmsnorm_kernel (operand: groups * quads * 4 values a row).
template <typename W, NormInput kInput, int kQuads, bool kWarpGroups>
__global__ void rmsnorm_quads_kernel(float* out, int64_t out_stride, __nv_bfloat16* operand, float* x,
                                     int64_t x_stride, const W* weight, const float* z, int64_t z_stride,
                                     int quads, int groups, float eps, float weight_offset,
                                     UnsummedSplits delta_splits, float* delta_sums) {
  wait_for_previous_kernel();
  allow_next_kernel_unless_cublas_next(operand != nullptr);
  constexpr bool kGated = kInput == NormInput::Gated;
  __shared__ float scratch[kBlock / kWarpSize];
  const int64_t t = blockIdx.y;
  const int thread = kWarpGroups ? static_cast<int>(threadIdx.x) % kWarpSize : static_cast<int>(threadIdx.x);
  const int threads = kWarpGroups ? kWarpSize : static_cast<int>(blockDim.x);
  const int64_t group_index =
      kWarpGroups ? int64_t{blockIdx.x} * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize : blockIdx.x;
  if (group_index >= groups) return;  // whole warps (kWarpGroups) leave; no barrier follows for them
  const int64_t first = group_index * quads * 4;
  float* in = x + t * x_stride + first;
  const float* side = kInput == NormInput::Plain ? nullptr : z + t * z_stride + first;
  // The gate and the norm weight are loaded with x, before the block's reduction, so that all loads are in
  // flight at once (a load after the reduction would be a second round trip).
  float4 values[kQuads], gates[kGated ? kQuads : 1];
  float scales[kQuads][4];
  float sum_of_squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kQuads; ++k) {
    const int q = thread + k * threads;
    if (q >= quads) break;
    float4 v = load4(in + 4 * q);
    if constexpr (kGated) gates[k] = load4(side + 4 * q);
#pragma unroll
    for (int e = 0; e < 4; ++e) scales[k][e] = weight_offset + to_float(weight[4 * q + e]);
    if constexpr (kInput == NormInput::Residual || kInput == NormInput::ResidualOfSplits) {
      float4 d;
      if constexpr (kInput == NormInput::ResidualOfSplits) {
        d = sum4_in_split_order(delta_splits, t, first + 4 * q);
        store4(delta_sums + t * z_stride + first + 4 * q, d);
      } else {
        d = load4(side + 4 * q);
      }
      v = make_float4(v.x + d.x, v.y + d.y, v.z + d.z, v.w + d.w);
      store4(in + 4 * q, v);
    }
    sum_of_squares += v.x * v.x;
    sum_of_squares += v.y * v.y;
    sum_of_squares += v.z * v.z;
    sum_of_squares += v.w * v.w;
    values[k] = v;
  }
  if constexpr (kWarpGroups)
    sum_of_squares = warp_sum(sum_of_squares);
  else
    sum_of_squares = block_sum(sum_of_squares, scratch);
  const float inverse_rms = 1.0f / sqrtf(sum_of_squares / static_cast<float>(quads * 4) + eps);
  float* y = out == nullptr ? nullptr : out + t * out_stride + first;
  __nv_bfloat16* y_bf16 = operand == nullptr ? nullptr : operand + t * int64_t{groups} * quads * 4 + first;
#pragma unroll
  for (int k = 0; k < kQuads; ++k) {
    const int q = thread + k * threads;
    if (q >= quads) break;
    const float v[4] = {values[k].x, values[k].y, values[k].z, values[k].w};
    float gate[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (kGated) {
      gate[0] = gates[k].x;
      gate[1] = gates[k].y;
      gate[2] = gates[k].z;
      gate[3] = gates[k].w;
    }
    float r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (kGated)
        r[e] = gated_norm(scales[k][e], v[e], inverse_rms, gate[e]);
      else
        r[e] = v[e] * inverse_rms * scales[k][e];
    }
    if (y != nullptr) store4(y + 4 * q, make_float4(r[0], r[1], r[2], r[3]));
    if (y_bf16 != nullptr)
      *reinterpret_cast<uint2*>(y_bf16 + 4 * q) = make_uint2(bf16_pair(r[0], r[1]), bf16_pair(r[2], r[3]));
  }
}

// Threads per block and quads per thread of the register kernel for a group of `quads` float4.
struct QuadsShape {
  int threads, quads_per_thread;
};
QuadsShape quads_shape(int64_t quads) {
  const int64_t threads =
      std::clamp<int64_t>((quads + kWarpSize - 1) / kWarpSize * kWarpSize, kWarpSize, kBlock);
  return {static_cast<int>(threads), static_cast<int>((quads + threads - 1) / threads)};
}

template <typename W, NormInput kInput, int kQuads>
cudaError_t launch_quads(const Tensor& out, __nv_bfloat16* operand, const Tensor& x, const Tensor& weight,
                         const Tensor& z, const UnsummedSplits& z_splits, float eps, float weight_offset,
                         int threads, cudaStream_t stream) {
  const int64_t groups = x.cols / weight.cols;
  const auto quads = static_cast<int>(weight.cols / 4);
  if constexpr (kQuads == 1) {
    if (threads == kWarpSize) {  // a warp per group, kBlock / 32 groups to a block
      constexpr int64_t kGroupsPerBlock = kBlock / kWarpSize;
      const dim3 grid(static_cast<unsigned int>((groups + kGroupsPerBlock - 1) / kGroupsPerBlock),
                      static_cast<unsigned int>(x.rows));
      return launch_kernel(rmsnorm_quads_kernel<W, kInput, kQuads, true>, grid, kBlock, 0, stream,
                           out.ptr<float>(), out.stride, operand, x.ptr<float>(), x.stride,
                           weight.ptr<const W>(), z.ptr<const float>(), z.stride, quads,
                           static_cast<int>(groups), eps, weight_offset, z_splits, z.ptr<float>());
    }
  }
  const dim3 grid(static_cast<unsigned int>(groups), static_cast<unsigned int>(x.rows));
  return launch_kernel(rmsnorm_quads_kernel<W, kInput, kQuads, false>, grid, threads, 0, stream,
                       out.ptr<float>(), out.stride, operand, x.ptr<float>(), x.stride, weight.ptr<const W>(),
                       z.ptr<const float>(), z.stride, quads, static_cast<int>(groups), eps, weight_offset,
                       z_splits, z.ptr<float>());
}

// out: the F32 rows (empty: none); operand: the BF16 rows for cuBLAS (null: none). z_splits: ResidualOfSplits
// only (the other forms read z's values).
template <NormInput kInput>
cudaError_t launch_norm(const Tensor& out, __nv_bfloat16* operand, const Tensor& x, const Tensor& weight,
                        const Tensor& z, float eps, bool unit_offset, cudaStream_t stream,
                        const UnsummedSplits& z_splits = {}) {
  if (x.rows == 0 || x.cols == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(x.cols / weight.cols), static_cast<unsigned int>(x.rows));
  const float weight_offset = unit_offset ? 1.0f : 0.0f;
  const QuadsShape shape = quads_shape(weight.cols / 4);
  const bool quads = weight.cols % 4 == 0 && shape.quads_per_thread <= kMaxQuadsPerThread &&
                     rows_aligned_to_float4(out) && rows_aligned_to_float4(x) &&
                     (kInput == NormInput::Plain || rows_aligned_to_float4(z)) && z_splits.float4_aligned();
  return with_weight_type(weight.dtype, [&](auto type) {
    using W = decltype(type);
    if (quads) {
      static_assert(kMaxQuadsPerThread == 8, "one case per register kernel");
      if (shape.quads_per_thread <= 1)
        return launch_quads<W, kInput, 1>(out, operand, x, weight, z, z_splits, eps, weight_offset,
                                          shape.threads, stream);
      if (shape.quads_per_thread <= 2)
        return launch_quads<W, kInput, 2>(out, operand, x, weight, z, z_splits, eps, weight_offset,
                                          shape.threads, stream);
      if (shape.quads_per_thread <= 4)
        return launch_quads<W, kInput, 4>(out, operand, x, weight, z, z_splits, eps, weight_offset,
                                          shape.threads, stream);
      return launch_quads<W, kInput, 8>(out, operand, x, weight, z, z_splits, eps, weight_offset,
                                        shape.threads, stream);
    }
    if constexpr (kInput == NormInput::ResidualOfSplits) {
      // The element-wise kernel reads delta's values: the sums kernel stores them first.
      const cudaError_t status = launch_split_partial_sums(z, z_splits, stream);
      return status != cudaSuccess
                 ? status
                 : launch_norm<NormInput::Residual>(out, operand, x, weight, z, eps, unit_offset, stream);
    } else {
      return launch_kernel(rmsnorm_kernel<W, kInput>, grid, kBlock, 0, stream, out.ptr<float>(), out.stride,
                           operand, x.ptr<float>(), x.stride, weight.ptr<const W>(), z.ptr<const float>(),
                           z.stride, weight.cols, eps, weight_offset);
    }
  });
}

}  // namespace

cudaError_t launch_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& z,
                           float eps, bool unit_offset, cudaStream_t stream) {
  if (z.empty()) return launch_norm<NormInput::Plain>(out, nullptr, x, weight, z, eps, unit_offset, stream);
  return launch_norm<NormInput::Gated>(out, nullptr, x, weight, z, eps, unit_offset, stream);
}

cudaError_t launch_add_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& delta,
                               const UnsummedSplits& delta_splits, const Tensor& weight, float eps,
                               bool unit_offset, cudaStream_t stream) {
  if (delta_splits.any())
    return launch_norm<NormInput::ResidualOfSplits>(out, nullptr, x, weight, delta, eps, unit_offset, stream,
                                                    delta_splits);
  return launch_norm<NormInput::Residual>(out, nullptr, x, weight, delta, eps, unit_offset, stream);
}

cudaError_t launch_rmsnorm_to_bf16(void* operand, const Tensor& out, const Tensor& x, const Tensor& delta,
                                   const Tensor& weight, float eps, bool unit_offset, cudaStream_t stream) {
  auto* rows = static_cast<__nv_bfloat16*>(operand);
  if (delta.empty())
    return launch_norm<NormInput::Plain>(out, rows, x, weight, delta, eps, unit_offset, stream);
  return launch_norm<NormInput::Residual>(out, rows, x, weight, delta, eps, unit_offset, stream);
}

cudaError_t launch_gated_rmsnorm_to_bf16(void* operand, const Tensor& x, const Tensor& weight,
                                         const Tensor& z, float eps, cudaStream_t stream) {
  return launch_norm<NormInput::Gated>(Tensor{}, static_cast<__nv_bfloat16*>(operand), x, weight, z, eps,
                                       false, stream);
}

}  // namespace qspec::cuda
