// A Gated DeltaNet layer's mixer for a decode or verify step (up to 16 tokens) in a kernel and its finish
// kernel, where the composition takes four (conv1d_silu, gdn_gates_linear, gated_delta_rule, gated_rmsnorm),
// each a dependent launch of a few microseconds. One block per (value head h, slab of 32 state columns), as
// the recurrence's own kernel, so that the state's bytes move through every SM; 10 warps:
//   1. the causal conv1d + SiLU of h's q and k channels (its key head's) and the slab's v channels, a thread
//      per channel (conv_silu_step, as conv1d.cu);
//   2. the gates: b = x W_b[h]^T and a = x W_a[h]^T (thread i: hidden chunks i, i + 320, ...; per-warp sums,
//      then the warps' in order), beta = sigmoid(b), g = -exp(a_log) softplus(a + dt_bias);
//   3. the recurrence on warps 0-3 with gdn_recurrence.cuh's lane layout and arithmetic, so a verify step's
//      state, replayed by gdn_commit, is bit for bit what decode steps make;
//   4. each slab stores its raw outputs and its sum of squares per token.
// Then gdn_mixer_finish_kernel: the gated RMSNorm of each (token, value head) from the slabs' sums in slab
// order, and with update_state the new conv states (all slabs of the value heads of one key head read its q /
// k conv state: no block of the mixer may write it). A verify step's replay record (keys, decays, deltas) is
// written by the mixer kernel as gdn_recurrence.cuh's kernel writes it. A finish kernel, not the last slab of
// each head (found by a ticket), so that no block of the mixer carries a release, a ticket's round trip and
// the norm on its path: a verify step 3.46 -> 3.36 ms on the H200, as with the linears' split sums
// (linear_mma.cu). Every token's arithmetic is the same at T = 1 and 16. The weights are read before the wait
// (pdl.cuh) and every activation and state load is issued before the arithmetic that waits on it.
#include <cmath>

#include "backend/cuda/gdn_recurrence.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "backend/ops.h"

namespace qspec::cuda {

namespace {

constexpr int kRecurrenceWarps = gdn::kWarps;  // 4: the slab's 32 columns
constexpr int kWarps = 10;                     // the conv's channels, the gates' chunks
constexpr int kThreads = kWarps * kWarpSize;   // 320
constexpr int kMaxTokens = gdn::kStageTokens;
// gdn_mixer_linear runs the mixer's ops instead of this kernel only above kLinearMmaMaxRows rows (its cuBLAS
// path), where this kernel never runs: the two give a layer the same values.
static_assert(kMaxTokens <= kLinearMmaMaxRows,
              "the fused mixer's tokens within the tensor-core linears' rows");
constexpr int kSlab = gdn::kSlabColumns;  // 32
constexpr int kKernel = 4;                // the conv kernel size taken (Qwen3.5's)
constexpr int kHistory = kKernel - 1;
constexpr int kChunk = 8;            // hidden values per 16-byte BF16 weight load
constexpr int kFinishThreads = 128;  // gdn_mixer_finish_kernel: a value head's row (dv <= 128), or channels
static_assert(2 * gdn::kMaxKeyDim + kSlab <= kThreads, "a thread per conv channel");

// A small per-layer weight (conv taps, a_log, dt_bias, the norm's) of any float type, read as F32.
struct Scalars {
  const void* data;
  DType dtype;
  int64_t stride;  // per row, for the conv taps

  __device__ float at(int64_t row, int64_t col) const {
    const int64_t i = row * stride + col;
    if (dtype == DType::BF16) return to_float(static_cast<const __nv_bfloat16*>(data)[i]);
    if (dtype == DType::F16) return to_float(static_cast<const __half*>(data)[i]);
    return static_cast<const float*>(data)[i];
  }
};

struct MixerArgs {
  float* out;  // [T, nv * dv]
  int64_t out_stride;
  float* conv_out;  // [T, C]
  int64_t conv_out_stride;
  float *beta, *g;  // [T, nv]
  int64_t beta_stride, g_stride;
  const float* qkvz;  // [T, C + nv * dv]: the conv input, then z
  int64_t qkvz_stride;
  const float* x;  // [T, H]
  int64_t x_stride;
  float* conv_state;  // [C, kHistory]
  int64_t conv_state_stride;
  float* state;  // [nv * dk, dv]
  int64_t state_stride;
  const __nv_bfloat16 *w_b, *w_a;  // [nv, H]
  int64_t w_b_stride, w_a_stride;
  Scalars conv_weight, a_log, dt_bias, norm_weight;
  float* norm_partials;  // [T, nv * dv] (core): the slabs' sums of squares at (t, h * dv + slab)
  int64_t norm_partials_stride;
  int tokens, hidden_chunks;
  float eps;
  bool update_state;
  gdn::ReplayRecord replay;  // a verify step's record (gdn_recurrence.cuh's writers), or null
};

template <int kRows>
__global__ void __launch_bounds__(kThreads) gdn_mixer_kernel(MixerArgs a, gdn::Dims d) {
  constexpr int kKeys = kRows * gdn::kRowGroups;
  constexpr int kKeyStride = kKeys + 4;                  // as gdn_recurrence.cuh's staging
  constexpr int kGateBatch = 4;                          // tokens whose x is loaded at once
  __shared__ float stage_qk[2][kMaxTokens][kKeyStride];  // [0] queries, [1] keys
  __shared__ float stage_value[kMaxTokens][kSlab];
  __shared__ float stage_beta[kMaxTokens], stage_decay[kMaxTokens];
  __shared__ float gate_partials[2][kMaxTokens][kWarps];
  __shared__ float stage_out[kMaxTokens][kSlab];
  __shared__ float stage_delta[kMaxTokens][kSlab];  // a verify step's record, written out after the tokens

  const int head = static_cast<int>(blockIdx.x), slab = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int T = a.tokens;
  const int ratio = d.num_value_heads / d.num_key_heads, key_head = head / ratio;
  const int64_t nk_dk = static_cast<int64_t>(d.num_key_heads) * d.dk;

  // Thread tid convolves channel tid (tid < dk: the key head's q, then its k, then the slab's v) and dots
  // hidden chunks tid, tid + kThreads, ... of the gates.
  const int slab_values = min(kSlab, d.dv - slab * kSlab);
  const bool convolves = tid < 2 * d.dk + slab_values;
  const int64_t channel =
      tid < d.dk       ? static_cast<int64_t>(key_head) * d.dk + tid
      : tid < 2 * d.dk ? nk_dk + static_cast<int64_t>(key_head) * d.dk + (tid - d.dk)
                       : 2 * nk_dk + static_cast<int64_t>(head) * d.dv + slab * kSlab + (tid - 2 * d.dk);
  float taps[kKernel] = {};
  if (convolves) {
#pragma unroll
    for (int j = 0; j < kKernel; ++j) taps[j] = a.conv_weight.at(channel, j);
  }
  const auto* b_weights = reinterpret_cast<const uint4*>(a.w_b + head * a.w_b_stride);
  const auto* a_weights = reinterpret_cast<const uint4*>(a.w_a + head * a.w_a_stride);
  float wb[kChunk] = {}, wa[kChunk] = {};  // the first chunk's, before the wait
  if (tid < a.hidden_chunks) bf16x8_to_float(b_weights[tid], wb), bf16x8_to_float(a_weights[tid], wa);
  wait_for_previous_kernel();
  allow_next_kernel();

  // The lane's block of the state (gdn_recurrence.cuh's layout); warps past the recurrence's hold none.
  const int quad = lane / gdn::kRowGroups, row_group = lane % gdn::kRowGroups;
  const int slab_column = warp * gdn::kWarpColumns + quad * 4;
  const int column = slab * kSlab + slab_column;
  const bool recurs = warp < kRecurrenceWarps;
  const bool active = recurs && column < d.dv;
  const int first_row = row_group * kRows;
  float* state = a.state + static_cast<int64_t>(head) * d.dk * a.state_stride + column;
  float s[kRows][4];
  gdn::load_state_block(s, state, a.state_stride, first_row, d.dk, active);
  float history[kHistory] = {}, inputs[kMaxTokens] = {};
  if (convolves) {
#pragma unroll
    for (int j = 0; j < kHistory; ++j) history[j] = a.conv_state[channel * a.conv_state_stride + j];
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t)
      if (t < T) inputs[t] = a.qkvz[t * a.qkvz_stride + channel];
  }
  // 1. The conv: into the stage, and conv_out (the q / k channels by one block of the key head).
  if (convolves) {
    const bool writes_output = tid >= 2 * d.dk || (head % ratio == 0 && slab == 0);
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
      if (t >= T) break;
      const float y = conv_silu_step(taps, history, inputs[t]);
      if (tid < d.dk)
        stage_qk[0][t][tid] = y;
      else if (tid < 2 * d.dk)
        stage_qk[1][t][tid - d.dk] = y;
      else
        stage_value[t][tid - 2 * d.dk] = y;
      if (writes_output) a.conv_out[t * a.conv_out_stride + channel] = y;
    }
  }
  for (int e = tid; e < kMaxTokens * kKeys; e += kThreads) {  // rows past dk multiply zeros
    const int t = e / kKeys, i = e % kKeys;
    if (i >= d.dk) stage_qk[0][t][i] = stage_qk[1][t][i] = 0.0f;
  }

  // 2. The gates' dot products.
  float b_sum[kMaxTokens] = {}, a_sum[kMaxTokens] = {};
  for (int c = tid; c < a.hidden_chunks; c += kThreads) {
    if (c != tid) bf16x8_to_float(b_weights[c], wb), bf16x8_to_float(a_weights[c], wa);
#pragma unroll
    for (int first = 0; first < kMaxTokens; first += kGateBatch) {
      if (first >= T) break;
      float4 lo[kGateBatch] = {}, hi[kGateBatch] = {};
#pragma unroll
      for (int u = 0; u < kGateBatch; ++u) {
        if (first + u < T) {
          const auto* xc = reinterpret_cast<const float4*>(a.x + (first + u) * a.x_stride) + 2 * c;
          lo[u] = xc[0], hi[u] = xc[1];
        }
      }
#pragma unroll
      for (int u = 0; u < kGateBatch; ++u) {
        if (first + u >= T) break;
        const float xv[kChunk] = {lo[u].x, lo[u].y, lo[u].z, lo[u].w, hi[u].x, hi[u].y, hi[u].z, hi[u].w};
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          b_sum[first + u] = fmaf(xv[i], wb[i], b_sum[first + u]);
          a_sum[first + u] = fmaf(xv[i], wa[i], a_sum[first + u]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxTokens; ++t) {
    if (t >= T) break;
    const float b_total = warp_sum(b_sum[t]), a_total = warp_sum(a_sum[t]);
    if (lane == 0) gate_partials[0][t][warp] = b_total, gate_partials[1][t][warp] = a_total;
  }
  __syncthreads();  // the stage and the gate partials are in

  // The gates (threads t < T: beta, T + t: g), then q and k normalised as gdn_recurrence.cuh stages them.
  if (tid < 2 * T) {
    const int t = tid % T;
    const bool gate_a = tid >= T;
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += gate_partials[gate_a ? 1 : 0][t][w];
    if (!gate_a) {
      const float beta = sigmoid(sum);
      stage_beta[t] = beta;
      if (slab == 0) a.beta[t * a.beta_stride + head] = beta;
    } else {
      const float g = gdn_log_decay(a.a_log.at(0, head), sum, a.dt_bias.at(0, head));
      stage_decay[t] = expf(g);
      if (slab == 0) a.g[t * a.g_stride + head] = g;
      if (slab == 0 && a.replay.keys != nullptr)
        a.replay.decays[t * a.replay.decays_stride + head] = stage_decay[t];
    }
  }
  if (tid < gdn::kThreads) {
    const int vector = tid / gdn::kNormLanes;
    const int which = vector / kMaxTokens, t = vector % kMaxTokens;
    gdn::normalize_staged_vector<kKeys>(stage_qk[which][t], tid % gdn::kNormLanes, which == 0, t < T,
                                        d.query_scale);
  }
  __syncthreads();

  // 3. The recurrence, token by token (an output reduced one token late, its shuffles overlapping the next
  // token's, as gdn_recurrence.cuh does), into the stage; then the raw outputs go out with the slab's sums of
  // their squares (warp t % kWarps: token t, lane: column).
  if (recurs) {
    const int own_column = row_group / 4;
    const bool writer = active && row_group % 4 == 0;
    float partials[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the previous token's output
    for (int t = 0; t < T; ++t) {
      const float* key = &stage_qk[1][t][first_row];
      float prediction_partials[4];
      gdn::decay_and_predict(s, key, stage_decay[t], prediction_partials);
      const float prediction = gdn::reduce_scatter_columns(prediction_partials, row_group);
      const float previous_output = gdn::reduce_scatter_columns(partials, row_group);
      if (t > 0 && writer) stage_out[t - 1][slab_column + own_column] = previous_output;
      const float value = active ? stage_value[t][slab_column + own_column] : 0.0f;
      const float delta = (value - prediction) * stage_beta[t];
      if (writer) stage_delta[t][slab_column + own_column] = delta;
      gdn::apply_delta(s, key, delta, row_group);
      gdn::output_partials(s, &stage_qk[0][t][first_row], partials);
    }
    const float last_output = gdn::reduce_scatter_columns(partials, row_group);
    if (writer) stage_out[T - 1][slab_column + own_column] = last_output;
    if (a.update_state && active) gdn::store_state_block(s, state, a.state_stride, first_row, d.dk);
  }
  __syncthreads();
  for (int t = warp; t < T; t += kWarps) {
    const bool present = lane < slab_values;
    const float output = present ? stage_out[t][lane] : 0.0f;
    if (present) a.out[t * a.out_stride + static_cast<int64_t>(head) * d.dv + slab * kSlab + lane] = output;
    const float squares = warp_sum(output * output);
    if (lane == 0)
      a.norm_partials[t * a.norm_partials_stride + static_cast<int64_t>(head) * d.dv + slab] = squares;
    if (a.replay.keys != nullptr && present)
      a.replay.deltas[t * a.replay.deltas_stride + static_cast<int64_t>(head) * d.dv + slab * kSlab + lane] =
          stage_delta[t][lane];
  }
  // The rest of the record off the recurrence's path: the keys by one block of the key head.
  if (a.replay.keys != nullptr && head % ratio == 0 && slab == 0)
    gdn::record_keys(a.replay, &stage_qk[1][0][0], kKeyStride, 0, T, key_head, d.dk);
}

// After gdn_mixer_kernel: blocks [0, T * nv) each normalise a (token, value head) row (a thread a column: its
// slabs' sums of squares added in slab order from zero, then gated_norm); with update_state the blocks after
// them write the new conv states, a thread a channel: the last kHistory of (the state, the T inputs).
__global__ void __launch_bounds__(kFinishThreads)
    gdn_mixer_finish_kernel(MixerArgs a, gdn::Dims d, int slabs) {
  const int tid = static_cast<int>(threadIdx.x);
  const int T = a.tokens;
  const int64_t rows = int64_t{T} * d.num_value_heads;
  const int64_t block = blockIdx.x;
  const float norm_scale = block < rows && tid < d.dv ? a.norm_weight.at(0, tid) : 0.0f;  // a weight
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t nk_dk = static_cast<int64_t>(d.num_key_heads) * d.dk;
  if (block < rows) {
    const int64_t t = block / d.num_value_heads;
    const int head = static_cast<int>(block % d.num_value_heads);
    if (tid >= d.dv) return;
    const float* partials = a.norm_partials + t * a.norm_partials_stride + static_cast<int64_t>(head) * d.dv;
    float squares = 0.0f;
    for (int k = 0; k < slabs; ++k) squares += partials[k];
    const float inverse_rms = 1.0f / sqrtf(squares / static_cast<float>(d.dv) + a.eps);
    const float z =
        a.qkvz[t * a.qkvz_stride + 2 * nk_dk + static_cast<int64_t>(d.num_value_heads + head) * d.dv + tid];
    float* y = a.out + t * a.out_stride + static_cast<int64_t>(head) * d.dv + tid;
    *y = gated_norm(norm_scale, *y, inverse_rms, z);
    return;
  }
  const int64_t channel = (block - rows) * kFinishThreads + tid;
  if (!a.update_state || channel >= 2 * nk_dk + static_cast<int64_t>(d.num_value_heads) * d.dv) return;
  float* const history = a.conv_state + channel * a.conv_state_stride;
  float next[kHistory];
#pragma unroll
  for (int j = 0; j < kHistory; ++j)
    next[j] = T + j < kHistory ? history[T + j] : a.qkvz[(T + j - kHistory) * a.qkvz_stride + channel];
#pragma unroll
  for (int j = 0; j < kHistory; ++j) history[j] = next[j];
}

}  // namespace

bool gdn_mixer_fits(const Tensor& qkvz, const Tensor& x, const Tensor& state, const GdnMixerWeights& w,
                    const GdnShape& shape) {
  const auto& [nk, nv, dk, dv] = shape;
  auto floats = [](DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; };
  return qkvz.rows >= 1 && qkvz.rows <= kMaxTokens && w.conv_weight.cols == kKernel &&
         dk <= gdn::kMaxKeyDim && dv <= kFinishThreads &&
         gdn::recurrence_fits(state.ptr<const float>(), state.stride, dk, dv) &&
         gdn_gates_linear_supports(x, w.w_b, w.w_a) && floats(w.conv_weight.dtype) && floats(w.a_log.dtype) &&
         floats(w.dt_bias.dtype) && floats(w.norm_weight.dtype) && w.norm_weight.cols == dv;
}

cudaError_t launch_gdn_mixer(const GdnMixerOperands& o, const GdnMixerWeights& w, const GdnShape& shape,
                             float eps, const GdnStateUpdate& update, cudaStream_t stream) {
  const bool update_state = update.advance;
  const auto& [nk, nv, dk, dv] = shape;
  const MixerArgs args{o.out.ptr<float>(),
                       o.out.stride,
                       o.conv_out.ptr<float>(),
                       o.conv_out.stride,
                       o.beta.ptr<float>(),
                       o.g.ptr<float>(),
                       o.beta.stride,
                       o.g.stride,
                       o.qkvz.ptr<const float>(),
                       o.qkvz.stride,
                       o.x.ptr<const float>(),
                       o.x.stride,
                       o.conv_state.ptr<float>(),
                       o.conv_state.stride,
                       o.state.ptr<float>(),
                       o.state.stride,
                       w.w_b.weight.ptr<const __nv_bfloat16>(),
                       w.w_a.weight.ptr<const __nv_bfloat16>(),
                       w.w_b.weight.stride,
                       w.w_a.weight.stride,
                       {w.conv_weight.data, w.conv_weight.dtype, w.conv_weight.stride},
                       {w.a_log.data, w.a_log.dtype, 0},
                       {w.dt_bias.data, w.dt_bias.dtype, 0},
                       {w.norm_weight.data, w.norm_weight.dtype, 0},
                       o.core.ptr<float>(),
                       o.core.stride,
                       static_cast<int>(o.qkvz.rows),
                       static_cast<int>(o.x.cols / kChunk),
                       eps,
                       update_state,
                       gdn::replay_record(update.replay)};
  const auto query_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  const gdn::Dims dims{nk, nv, dk, dv, query_scale};
  const int slabs = gdn::slabs(dv);
  const dim3 grid(static_cast<unsigned>(nv), static_cast<unsigned>(slabs));
  const cudaError_t status = gdn::with_rows_per_lane(dk, [&](auto rows) {
    return launch_kernel(gdn_mixer_kernel<decltype(rows)::value>, grid, kThreads, 0, stream, args, dims);
  });
  if (status != cudaSuccess) return status;
  const int64_t channels = 2 * int64_t{nk} * dk + int64_t{nv} * dv;
  const int64_t finish_blocks =
      o.qkvz.rows * nv + (update_state ? (channels + kFinishThreads - 1) / kFinishThreads : 0);
  return launch_kernel(gdn_mixer_finish_kernel, static_cast<unsigned>(finish_blocks), kFinishThreads, 0,
                       stream, args, dims, slabs);
}

}  // namespace qspec::cuda
