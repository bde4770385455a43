// Gated DeltaNet gates: beta = sigmoid(b), g = -exp(a_log) * softplus(a + dt_bias). gdn_gates takes b and a,
// one thread per (token, value head); gdn_gates_linear computes them first from x (b = x W_b^T, a = x W_a^T),
// one block per value head.
#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kLinearBlock = 256;
constexpr int kLinearWarps = kLinearBlock / kWarpSize;
constexpr int kChunk = 8;  // BF16 weights per 16-byte load
constexpr int kMaxRows = static_cast<int>(kGdnGatesLinearMaxRows);

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename LogRate, typename Bias>
__global__ void gdn_gates_kernel(float* beta, int64_t beta_stride, float* g, int64_t g_stride, const float* b,
                                 int64_t b_stride, const float* a, int64_t a_stride, const LogRate* a_log,
                                 const Bias* dt_bias, int64_t rows, int64_t heads) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t count = rows * heads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / heads, h = i % heads;
    beta[t * beta_stride + h] = sigmoid(b[t * b_stride + h]);
    g[t * g_stride + h] = gdn_log_decay(to_float(a_log[h]), a[t * a_stride + h], to_float(dt_bias[h]));
  }
}

// Block h: thread i dots the 8-column chunks i, i + kLinearBlock, ... of W_b[h] and W_a[h] with every row of
// x; the partials are summed per warp, then over the warps in order. A row's order of sums is the same for
// any number of rows.
template <typename LogRate, typename Bias>
__global__ void __launch_bounds__(kLinearBlock)
    gdn_gates_linear_kernel(float* beta, int64_t beta_stride, float* g, int64_t g_stride, const float* x,
                            int64_t x_stride, int rows, int64_t chunks, const __nv_bfloat16* w_b,
                            int64_t w_b_stride, const __nv_bfloat16* w_a, int64_t w_a_stride,
                            const LogRate* a_log, const Bias* dt_bias) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t h = blockIdx.x;
  const auto* b_weights = reinterpret_cast<const uint4*>(w_b + h * w_b_stride);
  const auto* a_weights = reinterpret_cast<const uint4*>(w_a + h * w_a_stride);
  float b_sum[kMaxRows] = {}, a_sum[kMaxRows] = {};
  for (int64_t c = threadIdx.x; c < chunks; c += kLinearBlock) {
    float wb[kChunk], wa[kChunk];
    bf16x8_to_float(b_weights[c], wb);
    bf16x8_to_float(a_weights[c], wa);
#pragma unroll
    for (int t = 0; t < kMaxRows; ++t) {
      if (t < rows) {
        const auto* xc = reinterpret_cast<const float4*>(x + t * x_stride) + 2 * c;
        const float4 lo = xc[0], hi = xc[1];
        const float xv[kChunk] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          b_sum[t] = fmaf(xv[i], wb[i], b_sum[t]);
          a_sum[t] = fmaf(xv[i], wa[i], a_sum[t]);
        }
      }
    }
  }
  __shared__ float partial[2][kMaxRows][kLinearWarps];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize,
            lane = static_cast<int>(threadIdx.x) % kWarpSize;
#pragma unroll
  for (int t = 0; t < kMaxRows; ++t) {
    if (t < rows) {
      const float b_total = warp_sum(b_sum[t]), a_total = warp_sum(a_sum[t]);
      if (lane == 0) {
        partial[0][t][warp] = b_total;
        partial[1][t][warp] = a_total;
      }
    }
  }
  __syncthreads();
  // Threads 0 .. rows - 1 write beta, the next rows threads g.
  if (static_cast<int>(threadIdx.x) >= 2 * rows) return;
  const int t = static_cast<int>(threadIdx.x) % rows;
  const bool gate_a = static_cast<int>(threadIdx.x) >= rows;
  float sum = 0.0f;
  for (int w = 0; w < kLinearWarps; ++w) sum += partial[gate_a ? 1 : 0][t][w];
  if (!gate_a) {
    beta[t * beta_stride + h] = sigmoid(sum);
  } else {
    g[t * g_stride + h] = gdn_log_decay(to_float(a_log[h]), sum, to_float(dt_bias[h]));
  }
}

}  // namespace

cudaError_t launch_gdn_gates(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                             const Tensor& a_log, const Tensor& dt_bias, cudaStream_t stream) {
  if (b.numel() == 0) return cudaSuccess;
  return with_weight_type(a_log.dtype, [&](auto log_rate_type) {
    return with_weight_type(dt_bias.dtype, [&](auto bias_type) {
      using LogRate = decltype(log_rate_type);
      using Bias = decltype(bias_type);
      return launch_kernel(gdn_gates_kernel<LogRate, Bias>, grid_for(b.numel(), kBlock), kBlock, 0, stream,
                           beta.ptr<float>(), beta.stride, g.ptr<float>(), g.stride, b.ptr<const float>(),
                           b.stride, a.ptr<const float>(), a.stride, a_log.ptr<const LogRate>(),
                           dt_bias.ptr<const Bias>(), b.rows, b.cols);
    });
  });
}

bool gdn_gates_linear_supports(const Tensor& x, const LinearWeight& w_b, const LinearWeight& w_a) {
  auto bf16_rows = [](const LinearWeight& w) {
    return !w.quantized() && w.weight.dtype == DType::BF16 && aligned16(w.weight.data) &&
           (w.weight.rows <= 1 || w.weight.stride % kChunk == 0);
  };
  return x.rows <= kGdnGatesLinearMaxRows && x.cols % kChunk == 0 && aligned16(x.data) &&
         (x.rows <= 1 || x.stride % 4 == 0) && bf16_rows(w_b) && bf16_rows(w_a);
}

cudaError_t launch_gdn_gates_linear(const Tensor& beta, const Tensor& g, const Tensor& x,
                                    const LinearWeight& w_b, const LinearWeight& w_a, const Tensor& a_log,
                                    const Tensor& dt_bias, cudaStream_t stream) {
  if (x.rows == 0 || w_b.out_features == 0) return cudaSuccess;
  return with_weight_type(a_log.dtype, [&](auto log_rate_type) {
    return with_weight_type(dt_bias.dtype, [&](auto bias_type) {
      using LogRate = decltype(log_rate_type);
      using Bias = decltype(bias_type);
      return launch_kernel(
          gdn_gates_linear_kernel<LogRate, Bias>, static_cast<unsigned int>(w_b.out_features), kLinearBlock,
          0, stream, beta.ptr<float>(), beta.stride, g.ptr<float>(), g.stride, x.ptr<const float>(), x.stride,
          static_cast<int>(x.rows), x.cols / kChunk, w_b.weight.ptr<const __nv_bfloat16>(), w_b.weight.stride,
          w_a.weight.ptr<const __nv_bfloat16>(), w_a.weight.stride, a_log.ptr<const LogRate>(),
          dt_bias.ptr<const Bias>());
    });
  });
}

}  // namespace qspec::cuda
