// The gated delta rule's per-token recurrence for one block = (value head, slab of 32 state columns): the
// kernel of gated_delta_rule.cu (decode, verify), whose lane layout and token arithmetic gdn_mixer.cu shares.
// Per head, with S [dk, dv] and decay exp(g):
//   S = exp(g) S ;  delta = beta (v - S^T k) ;  S += k delta^T ;  o = S^T q
// with q, k L2-normalised (eps 1e-6) and q scaled by dk^-0.5.
//
// Columns of S evolve independently, so each warp owns 8 columns x all dk rows and runs its tokens without
// a barrier. Lane = (quad = lane / 16, row group = lane % 16): 4 adjacent columns (one 16-byte load or store
// per row) x kRows consecutive rows (row group * kRows + r), so a warp's state load covers 16 rows x 32
// bytes. Sums over rows: in registers, then over the 16 row groups by a reduce-scatter (5 shuffles leave each
// lane one column's total, column = row group / 4) and, for delta, an all-gather back to 4 columns (3
// shuffles). A token's output sums are reduced together with the next token's prediction (their shuffle
// latencies overlap; the output is stored one token late). Tokens are staged 16 at a time in shared memory
// with cp.async: q and k, normalised there (4 lanes per vector), the slab's v, beta and g (-> exp(g)). The
// state is loaded before the staging and stays in registers for all tokens: read once, written once. A
// token's arithmetic does not depend on T nor on its place in a stage: one call of 16 tokens and 16 calls of
// one give the same bits, and so does gdn_commit's replay of a verify step's record (keys, decays, deltas).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/ops.h"

namespace qspec::cuda::gdn {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * kWarpSize;  // 128
inline constexpr int kWarpColumns = 8;
inline constexpr int kSlabColumns = kWarps * kWarpColumns;  // 32
inline constexpr int kRowGroups = 16;                       // lanes per column quad
inline constexpr int kStageTokens = 16;
inline constexpr int kNormLanes = kThreads / (2 * kStageTokens);  // lanes per q or k vector: 4
inline constexpr int kMaxKeyDim = 128;                            // 8 rows per lane
inline constexpr float kL2NormEps = 1e-6f;
inline constexpr unsigned int kFullMask = 0xffffffffu;

// Where a verify step's recurrence keeps its rows' replay record (GdnReplayRows); null keys: none kept. The
// keys come from one block of each key head (its first value head's first slab), the decays from each
// head's first slab, each delta from the lane that owns its column.
struct ReplayRecord {
  float* keys;
  int64_t keys_stride;
  float* decays;
  int64_t decays_stride;
  float* deltas;
  int64_t deltas_stride;
};

// The record's pointers (all null when none is kept).
inline ReplayRecord replay_record(const GdnReplayRows& r) {
  if (r.empty()) return {};
  return {r.keys.ptr<float>(), r.keys.stride,         r.decays.ptr<float>(),
          r.decays.stride,     r.deltas.ptr<float>(), r.deltas.stride};
}

// One layer's operands (fp32).
struct RecurrenceArgs {
  float* out;
  int64_t out_stride;
  const float* qkv;
  int64_t qkv_stride;
  const float* beta;
  int64_t beta_stride;
  const float* g;
  int64_t g_stride;
  float* state;
  int64_t state_stride;
  int64_t tokens;
  ReplayRecord replay;
};

struct Dims {
  int num_key_heads, num_value_heads, dk, dv;
  float query_scale;
};

inline int slabs(int value_head_dim) {
  return (value_head_dim + kSlabColumns - 1) / kSlabColumns;
}

// The shapes this recurrence takes: dk <= 128 and whole, 16-byte aligned column quads of the state.
inline bool recurrence_fits(const float* state, int64_t state_stride, int key_head_dim, int value_head_dim) {
  return key_head_dim <= kMaxKeyDim && value_head_dim % 4 == 0 && state_stride % 4 == 0 &&
         reinterpret_cast<uintptr_t>(state) % 16 == 0;
}

// x[c] summed over the 16 row groups (lane bits 0-3); lane gets column row_group / 4's total. Lanes that
// share a column get the same bits (the last two steps are butterflies of commutative adds).
__device__ inline float reduce_scatter_columns(const float (&x)[4], int row_group) {
  const bool upper8 = (row_group & 8) != 0, upper4 = (row_group & 4) != 0;
  float keep0 = upper8 ? x[2] : x[0], keep1 = upper8 ? x[3] : x[1];
  const float send0 = upper8 ? x[0] : x[2], send1 = upper8 ? x[1] : x[3];
  keep0 += __shfl_xor_sync(kFullMask, send0, 8);
  keep1 += __shfl_xor_sync(kFullMask, send1, 8);
  float keep = upper4 ? keep1 : keep0;
  keep += __shfl_xor_sync(kFullMask, upper4 ? keep0 : keep1, 4);
  keep += __shfl_xor_sync(kFullMask, keep, 2);
  keep += __shfl_xor_sync(kFullMask, keep, 1);
  return keep;
}

// The inverse of the scatter: every lane gets the 4 columns' values from the lanes holding them.
__device__ inline void gather_columns(float mine, int row_group, float (&x)[4]) {
  const bool upper8 = (row_group & 8) != 0, upper4 = (row_group & 4) != 0;
  const float other = __shfl_xor_sync(kFullMask, mine, 4);
  const float low = upper4 ? other : mine, high = upper4 ? mine : other;
  const float other_low = __shfl_xor_sync(kFullMask, low, 8),
              other_high = __shfl_xor_sync(kFullMask, high, 8);
  x[0] = upper8 ? other_low : low;
  x[1] = upper8 ? other_high : high;
  x[2] = upper8 ? low : other_low;
  x[3] = upper8 ? high : other_high;
}

// The lane's kRows x 4 block of a head's state (rows first_row.., columns at `state`), zeros where absent.
template <int kRows>
__device__ inline void load_state_block(float (&s)[kRows][4], const float* state, int64_t stride,
                                        int first_row, int dk, bool active) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int i = first_row + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active && i < dk) v = *reinterpret_cast<const float4*>(state + i * stride);
    s[r][0] = v.x;
    s[r][1] = v.y;
    s[r][2] = v.z;
    s[r][3] = v.w;
  }
}

template <int kRows>
__device__ inline void store_state_block(const float (&s)[kRows][4], float* state, int64_t stride,
                                         int first_row, int dk) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int i = first_row + r;
    if (i < dk)
      *reinterpret_cast<float4*>(state + i * stride) = make_float4(s[r][0], s[r][1], s[r][2], s[r][3]);
  }
}

// A staged q or k vector of kKeys values L2-normalised in place (q also scaled) by the kNormLanes lanes of
// one group (part = this lane's); stores only when `store` (a staged token), the sums run either way.
template <int kKeys>
__device__ inline void normalize_staged_vector(float* x, int part, bool query, bool store,
                                               float query_scale) {
  float squares = 0.0f;
#pragma unroll
  for (int m = 0; m < kKeys / kNormLanes; ++m) squares += x[part + kNormLanes * m] * x[part + kNormLanes * m];
  squares += __shfl_xor_sync(kFullMask, squares, 1);
  squares += __shfl_xor_sync(kFullMask, squares, 2);
  const float factor = 1.0f / sqrtf(squares + kL2NormEps);
  if (!store) return;
#pragma unroll
  for (int m = 0; m < kKeys / kNormLanes; ++m) {
    float& value = x[part + kNormLanes * m];
    value = query ? value * factor * query_scale : value * factor;
  }
}

// A token's first half: S = exp(g) S, and the lane's partial sums of S^T k over its rows.
template <int kRows>
__device__ inline void decay_and_predict(float (&s)[kRows][4], const float* key, float decay,
                                         float (&prediction_partials)[4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) prediction_partials[c] = 0.0f;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float k = key[r];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      s[r][c] *= decay;
      prediction_partials[c] = fmaf(k, s[r][c], prediction_partials[c]);
    }
  }
}

// A token's second half: S += k delta^T for the lane's columns (delta_own: its own column's, gathered).
template <int kRows>
__device__ inline void apply_delta(float (&s)[kRows][4], const float* key, float delta_own, int row_group) {
  float delta[4];
  gather_columns(delta_own, row_group, delta);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float k = key[r];
#pragma unroll
    for (int c = 0; c < 4; ++c) s[r][c] = fmaf(k, delta[c], s[r][c]);
  }
}

// The lane's partial sums of o = S^T q over its rows.
template <int kRows>
__device__ inline void output_partials(const float (&s)[kRows][4], const float* query, float (&partials)[4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) partials[c] = 0.0f;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float q = query[r];
#pragma unroll
    for (int c = 0; c < 4; ++c) partials[c] = fmaf(q, s[r][c], partials[c]);
  }
}

// Stores `count` staged (normalised) keys of key head `key_head`, rows of `stride` floats from `staged`, as
// the replay record's rows first.. (every thread of the block takes part).
__device__ inline void record_keys(const ReplayRecord& r, const float* staged, int stride, int64_t first,
                                   int count, int key_head, int dk) {
  for (int e = static_cast<int>(threadIdx.x); e < count * dk; e += static_cast<int>(blockDim.x)) {
    const int t = e / dk, i = e % dk;
    r.keys[(first + t) * r.keys_stride + static_cast<int64_t>(key_head) * dk + i] = staged[t * stride + i];
  }
}

// Runs tokens [0, a.tokens) of value head `head` for state columns [32 slab, 32 slab + 32), writing the
// outputs (and the replay record when asked); kRows * 16 >= dk. Every thread of the block must call it
// (barriers between stages).
template <int kRows>
__device__ __forceinline__ void recurrence_slab(const RecurrenceArgs& a, const Dims& d, int head, int slab,
                                                bool update_state) {
  constexpr int kKeys = kRows * kRowGroups;
  constexpr int kKeyStride = kKeys + 4;  // the norm pass's 8 vectors per warp fall on distinct banks
  __shared__ float stage_qk[2][kStageTokens][kKeyStride];  // [0] queries, [1] keys
  __shared__ float stage_value[kStageTokens][kSlabColumns];
  __shared__ float stage_beta[kStageTokens], stage_decay[kStageTokens];

  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int quad = lane / kRowGroups, row_group = lane % kRowGroups;
  const int slab_column = warp * kWarpColumns + quad * 4;  // first of the lane's 4 columns in the slab
  const int column = slab * kSlabColumns + slab_column;
  const bool active = column < d.dv;  // dv % 4 == 0: a quad is whole or absent
  const int first_row = row_group * kRows;

  float* state = a.state + static_cast<int64_t>(head) * d.dk * a.state_stride + column;
  float s[kRows][4];
  load_state_block(s, state, a.state_stride, first_row, d.dk, active);

  const int key_head = head / (d.num_value_heads / d.num_key_heads);
  const int64_t q_offset = static_cast<int64_t>(key_head) * d.dk;
  const int64_t k_offset = static_cast<int64_t>(d.num_key_heads) * d.dk + q_offset;
  const int64_t v_offset = 2 * static_cast<int64_t>(d.num_key_heads) * d.dk +
                           static_cast<int64_t>(head) * d.dv + static_cast<int64_t>(slab) * kSlabColumns;
  const int own_column = row_group / 4;  // of the lane's 4, after a reduce-scatter
  const bool writer = active && row_group % 4 == 0;
  float* out_column = a.out + static_cast<int64_t>(head) * d.dv + column + own_column;

  for (int64_t first = 0; first < a.tokens; first += kStageTokens) {
    const int count = static_cast<int>(a.tokens - first < kStageTokens ? a.tokens - first : kStageTokens);
    if (first > 0) __syncthreads();  // every warp is done with the previous stage
    for (int e = tid; e < count * kKeys; e += kThreads) {
      const int t = e / kKeys, i = e % kKeys;
      if (i < d.dk) {
        const float* row = a.qkv + (first + t) * a.qkv_stride;
        cp_async_4(&stage_qk[0][t][i], row + q_offset + i);
        cp_async_4(&stage_qk[1][t][i], row + k_offset + i);
      } else {
        stage_qk[0][t][i] = stage_qk[1][t][i] = 0.0f;
      }
    }
    for (int e = tid; e < count * kSlabColumns; e += kThreads) {
      const int t = e / kSlabColumns, c = e % kSlabColumns;
      if (slab * kSlabColumns + c < d.dv)
        cp_async_4(&stage_value[t][c], a.qkv + (first + t) * a.qkv_stride + v_offset + c);
      else
        stage_value[t][c] = 0.0f;
    }
    if (tid < count) {
      cp_async_4(&stage_beta[tid], a.beta + (first + tid) * a.beta_stride + head);
      cp_async_4(&stage_decay[tid], a.g + (first + tid) * a.g_stride + head);
    }
    cp_async_wait_all();
    __syncthreads();

    {  // L2-normalise q and k in place: vector = (tid / 4) -> (q or k, token), 4 lanes each.
      const int vector = tid / kNormLanes;
      const int which = vector / kStageTokens, t = vector % kStageTokens;
      normalize_staged_vector<kKeys>(stage_qk[which][t], tid % kNormLanes, which == 0, t < count,
                                     d.query_scale);
      if (tid < count) {
        stage_decay[tid] = expf(stage_decay[tid]);
        if (a.replay.keys != nullptr && slab == 0)
          a.replay.decays[(first + tid) * a.replay.decays_stride + head] = stage_decay[tid];
      }
    }
    __syncthreads();
    if (a.replay.keys != nullptr && head % (d.num_value_heads / d.num_key_heads) == 0 && slab == 0)
      record_keys(a.replay, &stage_qk[1][0][0], kKeyStride, first, count, key_head, d.dk);

    float partials[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the previous token's output, reduced one token late
    for (int t = 0; t < count; ++t) {
      const float* key = &stage_qk[1][t][first_row];
      float prediction_partials[4];
      decay_and_predict(s, key, stage_decay[t], prediction_partials);
      const float prediction = reduce_scatter_columns(prediction_partials, row_group);
      const float previous_output = reduce_scatter_columns(partials, row_group);
      if (t > 0 && writer) out_column[(first + t - 1) * a.out_stride] = previous_output;
      const float delta = (stage_value[t][slab_column + own_column] - prediction) * stage_beta[t];
      if (a.replay.keys != nullptr && writer)
        a.replay.deltas[(first + t) * a.replay.deltas_stride + static_cast<int64_t>(head) * d.dv + column +
                        own_column] = delta;
      apply_delta(s, key, delta, row_group);
      output_partials(s, &stage_qk[0][t][first_row], partials);
    }
    const float last_output = reduce_scatter_columns(partials, row_group);
    if (writer) out_column[(first + count - 1) * a.out_stride] = last_output;
  }

  if (update_state && active) store_state_block(s, state, a.state_stride, first_row, d.dk);
}

// Calls launch(std::integral_constant<int, kRows>) with the fewest rows per lane that cover dk <= 128.
template <typename Launch>
cudaError_t with_rows_per_lane(int key_head_dim, Launch launch) {
  if (key_head_dim <= 1 * kRowGroups) return launch(std::integral_constant<int, 1>{});
  if (key_head_dim <= 2 * kRowGroups) return launch(std::integral_constant<int, 2>{});
  if (key_head_dim <= 4 * kRowGroups) return launch(std::integral_constant<int, 4>{});
  if (key_head_dim <= 8 * kRowGroups) return launch(std::integral_constant<int, 8>{});
  return cudaErrorInvalidValue;
}

}  // namespace qspec::cuda::gdn
