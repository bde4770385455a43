// Rows moved by index: embed (gather from a table, converted to fp32) and kv_store (scatter into a cache).
#include <cmath>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kBlock = 256;

template <typename W>
__global__ void embed_kernel(float* out, int64_t out_stride, const W* table, int64_t table_stride,
                             int64_t vocab, int64_t cols, const int32_t* ids, int64_t ids_stride) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t * ids_stride];
  const bool valid = id >= 0 && id < vocab;
  float* dst = out + t * out_stride;
  const W* src = table + (valid ? id : 0) * table_stride;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = valid ? to_float(src[c]) : NAN;
}

__global__ void kv_store_kernel(float* cache, int64_t cache_stride, int64_t cache_rows, const float* x,
                                int64_t x_stride, int64_t cols, const int32_t* positions,
                                int64_t positions_stride) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t t = blockIdx.x;
  const int32_t position = positions[t * positions_stride];
  if (position < 0 || position >= cache_rows) return;
  float* dst = cache + position * cache_stride;
  const float* src = x + t * x_stride;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
}

}  // namespace

cudaError_t launch_embed(const Tensor& out, const Tensor& table, const Tensor& ids, cudaStream_t stream) {
  if (out.rows == 0) return cudaSuccess;
  return with_weight_type(table.dtype, [&](auto type) {
    using W = decltype(type);
    return launch_kernel(embed_kernel<W>, static_cast<unsigned int>(out.rows), kBlock, 0, stream,
                         out.ptr<float>(), out.stride, table.ptr<const W>(), table.stride, table.rows,
                         table.cols, ids.ptr<const int32_t>(), ids.stride);
  });
}

cudaError_t launch_kv_store(const Tensor& cache, const Tensor& x, const Tensor& positions,
                            cudaStream_t stream) {
  if (x.rows == 0) return cudaSuccess;
  return launch_kernel(kv_store_kernel, static_cast<unsigned int>(x.rows), kBlock, 0, stream,
                       cache.ptr<float>(), cache.stride, cache.rows, x.ptr<const float>(), x.stride, x.cols,
                       positions.ptr<const int32_t>(), positions.stride);
}

}  // namespace qspec::cuda
