// The gated delta rule, per token (the recurrence): decode and the 16-token verify (which may keep the
// replay record gdn_commit advances the state by), i.e. every call shorter than kGdnChunkedMinTokens (longer
// ones: gated_delta_rule_chunked.cu). Per value head h with state S [dk, dv] and decay exp(g):
//   S = exp(g) S ;  delta = beta (v - S^T k) ;  S += k delta^T ;  o = S^T q
// with q, k L2-normalised (eps 1e-6) and q scaled by dk^-0.5.
//
// Two kernels; which one runs depends only on the shape and the state's alignment, never on T, so a token's
// bits do not depend on how the tokens are split into calls:
//  - gated_delta_rule_warp_kernel (dk <= 128, dv % 4 == 0, 16-byte aligned state rows): gdn_recurrence.cuh,
//    a warp per 8 columns x all rows, no barrier per token. Qwen3.5-4B: 32 heads x 4 slabs = 128 blocks of
//    4 warps (one warp per SM sub-partition), 16-byte state loads, all of them in flight at once.
//    Predicted per layer: T = 1 ~2 us (one DRAM round trip for 2 MiB at 4.16 TB/s ~1 us, the staging of q/k
//    from L2 under it, ~0.3 us of normalisation and token, the write-back ~0.5 us); T = 16 ~3.5-4 us (the
//    per-token chain: 8 dependent FMAs, 4 + 2 shuffle steps and the update, ~250-300 cycles ~0.15 us).
//  - gated_delta_rule_recurrent_kernel, every other shape (dk <= 256): block = (head, 16 columns), thread =
//    (column, row group) with rows row_group + 8 r; sums over rows by lane pairs then warps (shared memory, 4
//    barriers per token). Measured on the 4B shape: T = 1 4.3 us, T = 16 15.3 us per layer.
#include <cmath>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gdn_recurrence.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "backend/ops.h"

namespace qspec::cuda {

namespace {

constexpr int kColumns = 16;                     // state columns per block
constexpr int kRowGroups = 8;                    // threads per column
constexpr int kThreads = kColumns * kRowGroups;  // 128
constexpr int kWarps = kThreads / kWarpSize;     // 4, each holding row groups 2w and 2w + 1
constexpr float kL2NormEps = 1e-6f;

// dk <= kRowsPerThread * kRowGroups. The replay record, when kept: keys by the first column block of each key
// head's first value head, decays by each head's first column block, deltas by row group 0.
template <int kRowsPerThread>
__global__ void __launch_bounds__(kThreads)
    gated_delta_rule_recurrent_kernel(float* out, int64_t out_stride, const float* qkv, int64_t qkv_stride,
                                      const float* beta, int64_t beta_stride, const float* g,
                                      int64_t g_stride, float* state, int64_t state_stride, int64_t tokens,
                                      int num_key_heads, int num_value_heads, int dk, int dv,
                                      float query_scale, bool update_state, gdn::ReplayRecord replay) {
  wait_for_previous_kernel();
  allow_next_kernel();
  constexpr int kMaxKeyDim = kRowsPerThread * kRowGroups;
  constexpr int kKeysPerThread = (kMaxKeyDim + kThreads - 1) / kThreads;
  __shared__ float query[kMaxKeyDim], key[kMaxKeyDim];
  __shared__ float square_partials[2][kWarps];
  __shared__ float prediction_partials[kWarps][kColumns];
  __shared__ float output_partials[kWarps][kColumns];

  const int head = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int slab_column = tid % kColumns, row_group = tid / kColumns;
  const int column = static_cast<int>(blockIdx.y) * kColumns + slab_column;
  const bool valid_column = column < dv;
  float* head_state = state + static_cast<int64_t>(head) * dk * state_stride;
  float s[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = row_group + kRowGroups * r;
    s[r] = valid_column && i < dk ? head_state[i * state_stride + column] : 0.0f;
  }

  const int key_head = head / (num_value_heads / num_key_heads);
  const bool first_block = blockIdx.y == 0,
             records_keys = first_block && head % (num_value_heads / num_key_heads) == 0;
  const int64_t q_offset = static_cast<int64_t>(key_head) * dk;
  const int64_t k_offset = static_cast<int64_t>(num_key_heads) * dk + q_offset;
  const int64_t v_offset = 2 * static_cast<int64_t>(num_key_heads) * dk + static_cast<int64_t>(head) * dv;

  // This token's raw inputs; the next token's are loaded into them once this one has used them.
  float raw_query[kKeysPerThread], raw_key[kKeysPerThread], value = 0.0f, token_beta = 0.0f, token_g = 0.0f;
  const auto load_token = [&](int64_t t) {
    const float* row = qkv + t * qkv_stride;
#pragma unroll
    for (int m = 0; m < kKeysPerThread; ++m) {
      const int i = tid + kThreads * m;
      raw_query[m] = i < dk ? row[q_offset + i] : 0.0f;
      raw_key[m] = i < dk ? row[k_offset + i] : 0.0f;
    }
    value = valid_column ? row[v_offset + column] : 0.0f;
    token_beta = beta[t * beta_stride + head];
    token_g = g[t * g_stride + head];
  };
  load_token(0);

  for (int64_t t = 0; t < tokens; ++t) {
    float query_squares = 0.0f, key_squares = 0.0f;
#pragma unroll
    for (int m = 0; m < kKeysPerThread; ++m) {
      query_squares += raw_query[m] * raw_query[m];
      key_squares += raw_key[m] * raw_key[m];
    }
    query_squares = warp_sum(query_squares);
    key_squares = warp_sum(key_squares);
    if (lane == 0) {
      square_partials[0][warp] = query_squares;
      square_partials[1][warp] = key_squares;
    }
    __syncthreads();
    query_squares = 0.0f;
    key_squares = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      query_squares += square_partials[0][w];
      key_squares += square_partials[1][w];
    }
    const float query_factor = 1.0f / sqrtf(query_squares + kL2NormEps);
    const float key_factor = 1.0f / sqrtf(key_squares + kL2NormEps);
#pragma unroll
    for (int m = 0; m < kKeysPerThread; ++m) {
      const int i = tid + kThreads * m;
      if (i < kMaxKeyDim) {
        query[i] = raw_query[m] * query_factor * query_scale;
        key[i] = raw_key[m] * key_factor;
      }
    }
    const float decay = expf(token_g), token_value = value, token_beta_now = token_beta;
    if (t + 1 < tokens) load_token(t + 1);
    __syncthreads();
    if (replay.keys != nullptr) {
      if (records_keys) gdn::record_keys(replay, key, 0, t, 1, key_head, dk);  // this token's staged keys
      if (first_block && tid == 0) replay.decays[t * replay.decays_stride + head] = decay;
    }

    float prediction = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      s[r] *= decay;
      prediction += key[row_group + kRowGroups * r] * s[r];
    }
    prediction += __shfl_xor_sync(0xffffffffu, prediction, kColumns);
    if (lane < kColumns) prediction_partials[warp][slab_column] = prediction;
    __syncthreads();
    prediction = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) prediction += prediction_partials[w][slab_column];
    const float delta = (token_value - prediction) * token_beta_now;
    if (replay.keys != nullptr && row_group == 0 && valid_column)
      replay.deltas[t * replay.deltas_stride + static_cast<int64_t>(head) * dv + column] = delta;

    float output = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int i = row_group + kRowGroups * r;
      s[r] = fmaf(key[i], delta, s[r]);  // the rounding gdn_commit's replay repeats
      output += query[i] * s[r];
    }
    output += __shfl_xor_sync(0xffffffffu, output, kColumns);
    if (lane < kColumns) output_partials[warp][slab_column] = output;
    __syncthreads();
    if (tid < kColumns && valid_column) {
      output = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) output += output_partials[w][tid];
      out[t * out_stride + static_cast<int64_t>(head) * dv + column] = output;
    }
  }

  if (!update_state) return;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const int i = row_group + kRowGroups * r;
    if (valid_column && i < dk) head_state[i * state_stride + column] = s[r];
  }
}

template <int kRows>
__global__ void __launch_bounds__(gdn::kThreads)
    gated_delta_rule_warp_kernel(gdn::RecurrenceArgs args, gdn::Dims dims, bool update_state) {
  wait_for_previous_kernel();
  allow_next_kernel();
  gdn::recurrence_slab<kRows>(args, dims, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                              update_state);
}

}  // namespace

cudaError_t launch_gated_delta_rule_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& beta,
                                              const Tensor& g, const Tensor& state, int num_key_heads,
                                              int num_value_heads, int key_head_dim, int value_head_dim,
                                              const GdnStateUpdate& update, cudaStream_t stream) {
  if (qkv.rows == 0) return cudaSuccess;
  const gdn::ReplayRecord replay = gdn::replay_record(update.replay);
  const auto query_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(key_head_dim)));
  if (gdn::recurrence_fits(state.ptr<const float>(), state.stride, key_head_dim, value_head_dim)) {
    const gdn::RecurrenceArgs args{out.ptr<float>(),
                                   out.stride,
                                   qkv.ptr<const float>(),
                                   qkv.stride,
                                   beta.ptr<const float>(),
                                   beta.stride,
                                   g.ptr<const float>(),
                                   g.stride,
                                   state.ptr<float>(),
                                   state.stride,
                                   qkv.rows,
                                   replay};
    const gdn::Dims dims{num_key_heads, num_value_heads, key_head_dim, value_head_dim, query_scale};
    const dim3 grid(static_cast<unsigned int>(num_value_heads),
                    static_cast<unsigned int>(gdn::slabs(value_head_dim)));
    return gdn::with_rows_per_lane(key_head_dim, [&](auto rows) {
      constexpr int kRows = decltype(rows)::value;
      return launch_kernel(gated_delta_rule_warp_kernel<kRows>, grid, gdn::kThreads, 0, stream, args, dims,
                           update.advance);
    });
  }
  const dim3 grid(static_cast<unsigned int>(num_value_heads),
                  static_cast<unsigned int>((value_head_dim + kColumns - 1) / kColumns));
  const auto launch = [&](auto kernel) {
    return launch_kernel(kernel, grid, kThreads, 0, stream, out.ptr<float>(), out.stride,
                         qkv.ptr<const float>(), qkv.stride, beta.ptr<const float>(), beta.stride,
                         g.ptr<const float>(), g.stride, state.ptr<float>(), state.stride, qkv.rows,
                         num_key_heads, num_value_heads, key_head_dim, value_head_dim, query_scale,
                         update.advance, replay);
  };
  if (key_head_dim <= 4 * kRowGroups) return launch(gated_delta_rule_recurrent_kernel<4>);
  if (key_head_dim <= 8 * kRowGroups) return launch(gated_delta_rule_recurrent_kernel<8>);
  if (key_head_dim <= 16 * kRowGroups) return launch(gated_delta_rule_recurrent_kernel<16>);
  if (key_head_dim <= kGdnRecurrentMaxKeyDim) return launch(gated_delta_rule_recurrent_kernel<32>);
  return cudaErrorInvalidValue;
}

}  // namespace qspec::cuda
