// A Gated DeltaNet layer's mixer for a decode or verify step (up to 16 tokens) in one kernel, where the
// composition takes four (conv1d_silu, gdn_gates_linear, gated_delta_rule, gated_rmsnorm), each a dependent
// launch of a few microseconds. One block per value head h, 16 warps:
//   1. the gates: b = x W_b[h]^T and a = x W_a[h]^T (thread i: hidden chunks of 8, i + 512, ...; per-warp
//      sums, then the warps' in order), beta = sigmoid(b), g = -exp(a_log) softplus(a + dt_bias);
//   2. the causal conv1d + SiLU of the head's q and k channels (its key head's) and v channels, a thread per
//      channel walking the tokens (conv1d.cu's arithmetic);
//   3. the recurrence: warp w owns state columns 8w .. 8w + 7 with gdn_recurrence.cuh's lane layout and
//      arithmetic, so a verify step's state, replayed by gdn_commit, is bit for bit what a decode step makes;
//   4. the gated RMSNorm of the head's output row (a warp per token) with z.
// Every token's arithmetic is the same at T = 1 and 16. conv_out, beta and g are written for gdn_commit's
// replay. The value heads of one key head all read its q / k conv state; with update_state the last of them
// to have read it (a ticket per key head, release / acquire) writes the new one.
#include <cmath>

#include "backend/cuda/gdn_recurrence.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "backend/ops.h"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kMaxTokens = gdn::kStageTokens;
constexpr int kMaxValueDim = kWarps * gdn::kWarpColumns;  // 128
constexpr int kKernel = 4;                                // the conv kernel size taken (Qwen3.5's)
constexpr int kHistory = kKernel - 1;
constexpr int kChunk = 8;  // hidden values per 16-byte BF16 weight load

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
  unsigned* tickets;  // one per key head, zero between calls
  int tokens, hidden_chunks;
  float eps;
  bool update_state;
};

// 8 BF16 weights (one 16-byte load) as floats.
__device__ inline void bf16x8(const uint4 raw, float (&out)[kChunk]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(words[i] << 16);
    out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// Latency first: the weights are read before the wait (pdl.cuh); then every activation and state load is
// issued before the arithmetic that waits for any of them, so the block pays about one round trip before its
// conv and one per four tokens of gates.
template <int kRows>
__global__ void __launch_bounds__(kThreads) gdn_mixer_kernel(MixerArgs a, gdn::Dims d) {
  constexpr int kKeys = kRows * gdn::kRowGroups;
  constexpr int kKeyStride = kKeys + 4;                   // as gdn_recurrence.cuh's staging
  constexpr int kNormColumns = kMaxValueDim / kWarpSize;  // a lane's columns of a token's row (norm)
  constexpr int kGateBatch = 4;                           // tokens whose x is loaded at once
  __shared__ float stage_qk[2][kMaxTokens][kKeyStride];   // [0] queries, [1] keys
  __shared__ float stage_value[kMaxTokens][kMaxValueDim];
  __shared__ float stage_out[kMaxTokens][kMaxValueDim];
  __shared__ float stage_beta[kMaxTokens], stage_decay[kMaxTokens];
  __shared__ float gate_partials[2][kMaxTokens][kWarps];
  __shared__ bool last_reader;

  const int head = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int T = a.tokens;
  const int ratio = d.num_value_heads / d.num_key_heads, key_head = head / ratio;

  // Thread roles: channel tid of the conv (i < dk its key head's q, then k, then its own v), hidden chunk
  // tid of the gates, columns lane + 32 j of token `warp`'s norm.
  const int channels = 2 * d.dk + d.dv;
  const bool convolves = tid < channels;  // channels <= kThreads (gdn_mixer_fits)
  const int64_t channel = tid < d.dk ? static_cast<int64_t>(key_head) * d.dk + tid
                          : tid < 2 * d.dk
                              ? static_cast<int64_t>(d.num_key_heads + key_head) * d.dk + (tid - d.dk)
                              : 2 * static_cast<int64_t>(d.num_key_heads) * d.dk +
                                    static_cast<int64_t>(head) * d.dv + (tid - 2 * d.dk);
  const bool gates = tid < a.hidden_chunks;  // hidden_chunks <= kThreads (gdn_mixer_fits)
  float taps[kKernel] = {}, wb[kChunk] = {}, wa[kChunk] = {}, norm_scale[kNormColumns] = {};
  if (convolves)
#pragma unroll
    for (int j = 0; j < kKernel; ++j) taps[j] = a.conv_weight.at(channel, j);
  if (gates) {
    bf16x8(reinterpret_cast<const uint4*>(a.w_b + head * a.w_b_stride)[tid], wb);
    bf16x8(reinterpret_cast<const uint4*>(a.w_a + head * a.w_a_stride)[tid], wa);
  }
#pragma unroll
  for (int j = 0; j < kNormColumns; ++j)
    if (lane + kWarpSize * j < d.dv) norm_scale[j] = a.norm_weight.at(0, lane + kWarpSize * j);
  wait_for_previous_kernel();
  allow_next_kernel();

  // The lane's block of the state (gdn_recurrence.cuh's layout, slab = warp / 4).
  const int quad = lane / gdn::kRowGroups, row_group = lane % gdn::kRowGroups;
  const int column = warp * gdn::kWarpColumns + quad * 4;
  const bool active = column < d.dv;
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
  float z[kNormColumns] = {};
  const float* z_row = a.qkvz + warp * a.qkvz_stride + 2 * static_cast<int64_t>(d.num_key_heads) * d.dk +
                       static_cast<int64_t>(d.num_value_heads + head) * d.dv;
#pragma unroll
  for (int j = 0; j < kNormColumns; ++j)
    if (warp < T && lane + kWarpSize * j < d.dv) z[j] = z_row[lane + kWarpSize * j];

  // The conv (conv1d.cu's arithmetic): into the stage, and conv_out (the q / k channels by one value head).
  if (convolves) {
    const bool writes_output = tid >= 2 * d.dk || head % ratio == 0;
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
      if (t >= T) break;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kHistory; ++j) sum += taps[j] * history[j];
      sum += taps[kHistory] * inputs[t];
#pragma unroll
      for (int j = 0; j + 1 < kHistory; ++j) history[j] = history[j + 1];
      history[kHistory - 1] = inputs[t];
      const float y = silu(sum);
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

  // The gates' dot products: thread = hidden chunk, per-warp sums, then the warps' in order.
  float b_sum[kMaxTokens] = {}, a_sum[kMaxTokens] = {};
  if (gates) {
#pragma unroll
    for (int first = 0; first < kMaxTokens; first += kGateBatch) {
      if (first >= T) break;
      float4 lo[kGateBatch], hi[kGateBatch];
#pragma unroll
      for (int u = 0; u < kGateBatch; ++u) {
        if (first + u < T) {
          const auto* xc = reinterpret_cast<const float4*>(a.x + (first + u) * a.x_stride) + 2 * tid;
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
  __syncthreads();  // every conv state read is done; the stage and the gate partials are in

  // With update_state the last value head of the key head to have read its q / k conv state writes it. The
  // ticket's answer is needed only then, at the end.
  unsigned ticket = 0;
  if (a.update_state && tid == 0)
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;"
                 : "=r"(ticket)
                 : "l"(a.tickets + key_head)
                 : "memory");

  // The gates (threads t < T: beta, T + t: g), then q and k normalised as gdn_recurrence.cuh stages them.
  if (tid < 2 * T) {
    const int t = tid % T;
    const bool gate_a = tid >= T;
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += gate_partials[gate_a ? 1 : 0][t][w];
    if (!gate_a) {
      const float beta = sigmoid(sum);
      stage_beta[t] = beta;
      a.beta[t * a.beta_stride + head] = beta;
    } else {
      const float decay_rate = -expf(a.a_log.at(0, head));
      const float g = decay_rate * softplus(sum + a.dt_bias.at(0, head));
      stage_decay[t] = expf(g);
      a.g[t * a.g_stride + head] = g;
    }
  }
  if (tid < gdn::kThreads) {
    const int vector = tid / gdn::kNormLanes;
    const int which = vector / kMaxTokens, t = vector % kMaxTokens;
    gdn::normalize_staged_vector<kKeys>(stage_qk[which][t], tid % gdn::kNormLanes, which == 0, t < T,
                                        d.query_scale);
  }
  __syncthreads();

  // The recurrence, token by token, each warp on its own columns.
  const int own_column = row_group / 4;
  const bool writer = active && row_group % 4 == 0;
  for (int t = 0; t < T; ++t) {
    const float* key = &stage_qk[1][t][first_row];
    float prediction_partials[4], partials[4];
    gdn::decay_and_predict(s, key, stage_decay[t], prediction_partials);
    const float prediction = gdn::reduce_scatter_columns(prediction_partials, row_group);
    const float value = active ? stage_value[t][column + own_column] : 0.0f;
    gdn::apply_delta(s, key, (value - prediction) * stage_beta[t], row_group);
    gdn::output_partials(s, &stage_qk[0][t][first_row], partials);
    const float output = gdn::reduce_scatter_columns(partials, row_group);
    if (writer) stage_out[t][column + own_column] = output;
  }
  if (a.update_state && active) gdn::store_state_block(s, state, a.state_stride, first_row, d.dk);
  if (a.update_state && tid == 0) {
    last_reader = ticket == static_cast<unsigned>(ratio - 1);
    if (last_reader) a.tickets[key_head] = 0;  // ready for the next call
  }
  __syncthreads();

  if (a.update_state && convolves && (tid >= 2 * d.dk || last_reader))
#pragma unroll
    for (int j = 0; j < kHistory; ++j) a.conv_state[channel * a.conv_state_stride + j] = history[j];

  // The gated RMSNorm: warp t normalises token t's row (lane: columns lane, lane + 32, ...).
  if (warp < T) {
    float squares = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormColumns; ++j)
      if (lane + kWarpSize * j < d.dv)
        squares += stage_out[warp][lane + kWarpSize * j] * stage_out[warp][lane + kWarpSize * j];
    squares = warp_sum(squares);
    const float inverse_rms = 1.0f / sqrtf(squares / static_cast<float>(d.dv) + a.eps);
    float* y = a.out + warp * a.out_stride + static_cast<int64_t>(head) * d.dv;
#pragma unroll
    for (int j = 0; j < kNormColumns; ++j)
      if (lane + kWarpSize * j < d.dv)
        y[lane + kWarpSize * j] =
            norm_scale[j] * (stage_out[warp][lane + kWarpSize * j] * inverse_rms) * silu(z[j]);
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool gdn_mixer_fits(const Tensor& qkvz, const Tensor& x, const Tensor& conv_weight, const Tensor& state,
                    const GdnMixerWeights& w, const GdnShape& shape) {
  const auto& [nk, nv, dk, dv] = shape;
  auto floats = [](DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; };
  return qkvz.rows >= 1 && qkvz.rows <= kMaxTokens && conv_weight.cols == kKernel &&
         nk <= kGdnMixerMaxKeyHeads && 2 * dk + dv <= kThreads && dv <= kMaxValueDim &&
         dk <= gdn::kMaxKeyDim && gdn::recurrence_fits(state.ptr<const float>(), state.stride, dk, dv) &&
         gdn_gates_linear_supports(x, w.w_b, w.w_a) && floats(conv_weight.dtype) && floats(w.a_log.dtype) &&
         floats(w.dt_bias.dtype) && floats(w.norm_weight.dtype) && w.norm_weight.cols == dv &&
         aligned16(x.data);
}

cudaError_t launch_gdn_mixer(const GdnMixerOperands& o, const GdnMixerWeights& w, const GdnShape& shape,
                             float eps, bool update_state, unsigned* tickets, cudaStream_t stream) {
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
                       tickets,
                       static_cast<int>(o.qkvz.rows),
                       static_cast<int>(o.x.cols / kChunk),
                       eps,
                       update_state};
  const auto query_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  const gdn::Dims dims{nk, nv, dk, dv, query_scale};
  return gdn::with_rows_per_lane(dk, [&](auto rows) {
    return launch_kernel(gdn_mixer_kernel<decltype(rows)::value>, static_cast<unsigned>(nv), kThreads, 0,
                         stream, args, dims);
  });
}

}  // namespace qspec::cuda
