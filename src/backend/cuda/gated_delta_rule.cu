// The gated delta rule, per token (the recurrence), sequential over the T tokens inside one launch. Per value
// head h with state S [dk, dv] and decay exp(g):
//   S = exp(g) S ;  delta = beta (v - S^T k) ;  S += k delta^T ;  o = S^T q
// with q, k L2-normalised (eps 1e-6) and q scaled by dk^-0.5. Columns of S evolve independently, so one block
// owns one head's slab of kColumns columns: the slab stays in shared memory (fp32) for all T tokens and is
// read from / written back to the global state once. Threads: lane = column, warp = every kWarps-th row of
// the slab; sums over rows are combined across warps in shared memory.
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kColumns = kWarpSize;
constexpr int kWarps = 4;
constexpr int kBlock = kWarps * kWarpSize;
constexpr float kL2NormEps = 1e-6f;

__global__ void gated_delta_rule_kernel(float* out, int64_t out_stride, const float* qkv, int64_t qkv_stride,
                                        const float* beta, int64_t beta_stride, const float* g,
                                        int64_t g_stride, float* state, int64_t state_stride, int64_t tokens,
                                        int num_key_heads, int num_value_heads, int dk, int dv,
                                        bool update_state) {
  extern __shared__ float shared[];
  float* slab = shared;                          // [dk][kColumns]
  float* query = slab + dk * kColumns;           // [dk]
  float* key = query + dk;                       // [dk]
  float* partial = key + dk;                     // [kWarps][kColumns]
  float* scratch = partial + kWarps * kColumns;  // [kWarps]

  const int head = static_cast<int>(blockIdx.x);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int column = static_cast<int>(blockIdx.y) * kColumns + lane;
  const bool valid_column = column < dv;
  float* head_state = state + static_cast<int64_t>(head) * dk * state_stride;
  for (int i = warp; i < dk; i += kWarps)
    slab[i * kColumns + lane] = valid_column ? head_state[i * state_stride + column] : 0.0f;

  const int key_head = head / (num_value_heads / num_key_heads);
  const int64_t q_offset = static_cast<int64_t>(key_head) * dk;
  const int64_t k_offset = static_cast<int64_t>(num_key_heads) * dk + q_offset;
  const int64_t v_offset = 2 * static_cast<int64_t>(num_key_heads) * dk + static_cast<int64_t>(head) * dv;
  const float query_scale = 1.0f / sqrtf(static_cast<float>(dk));

  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = qkv + t * qkv_stride;
    float query_squares = 0.0f, key_squares = 0.0f;
    for (int i = static_cast<int>(threadIdx.x); i < dk; i += kBlock) {
      const float qv = row[q_offset + i], kv = row[k_offset + i];
      query[i] = qv;
      key[i] = kv;
      query_squares += qv * qv;
      key_squares += kv * kv;
    }
    query_squares = block_sum(query_squares, scratch);
    key_squares = block_sum(key_squares, scratch);
    const float query_factor = 1.0f / sqrtf(query_squares + kL2NormEps);
    const float key_factor = 1.0f / sqrtf(key_squares + kL2NormEps);
    for (int i = static_cast<int>(threadIdx.x); i < dk; i += kBlock) {
      query[i] = query[i] * query_factor * query_scale;
      key[i] = key[i] * key_factor;
    }
    __syncthreads();

    const float decay = expf(g[t * g_stride + head]);
    float prediction = 0.0f;
    for (int i = warp; i < dk; i += kWarps) {
      const float s = slab[i * kColumns + lane] * decay;
      slab[i * kColumns + lane] = s;
      prediction += key[i] * s;
    }
    partial[warp * kColumns + lane] = prediction;
    __syncthreads();
    prediction = 0.0f;
    for (int w = 0; w < kWarps; ++w) prediction += partial[w * kColumns + lane];
    const float value = valid_column ? row[v_offset + column] : 0.0f;
    const float delta = (value - prediction) * beta[t * beta_stride + head];
    __syncthreads();

    float output = 0.0f;
    for (int i = warp; i < dk; i += kWarps) {
      const float s = slab[i * kColumns + lane] + key[i] * delta;
      slab[i * kColumns + lane] = s;
      output += query[i] * s;
    }
    partial[warp * kColumns + lane] = output;
    __syncthreads();
    if (warp == 0 && valid_column) {
      output = 0.0f;
      for (int w = 0; w < kWarps; ++w) output += partial[w * kColumns + lane];
      out[t * out_stride + static_cast<int64_t>(head) * dv + column] = output;
    }
    __syncthreads();
  }

  if (!update_state) return;
  for (int i = warp; i < dk; i += kWarps)
    if (valid_column) head_state[i * state_stride + column] = slab[i * kColumns + lane];
}

}  // namespace

size_t gated_delta_rule_shared_bytes(int key_head_dim) {
  return sizeof(float) * (static_cast<size_t>(key_head_dim) * (kColumns + 2) + kWarps * kColumns + kWarps);
}

cudaError_t launch_gated_delta_rule(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                                    const Tensor& state, int num_key_heads, int num_value_heads,
                                    int key_head_dim, int value_head_dim, bool update_state,
                                    cudaStream_t stream) {
  if (qkv.rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned int>(num_value_heads),
                  static_cast<unsigned int>((value_head_dim + kColumns - 1) / kColumns));
  gated_delta_rule_kernel<<<grid, kBlock, gated_delta_rule_shared_bytes(key_head_dim), stream>>>(
      out.ptr<float>(), out.stride, qkv.ptr<const float>(), qkv.stride, beta.ptr<const float>(), beta.stride,
      g.ptr<const float>(), g.stride, state.ptr<float>(), state.stride, qkv.rows, num_key_heads,
      num_value_heads, key_head_dim, value_head_dim, update_state);
  return cudaGetLastError();
}

}  // namespace qspec::cuda
