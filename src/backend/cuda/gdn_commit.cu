// gdn_commit: a verify step's accepted rows advance every GDN layer's states in one launch. The verify
// step's recurrence kept a record of its rows (GdnReplayRows: the normalised keys, the decays exp(g) and
// delta = beta (v - S^T k) per value column), so the recurrent state's replay is elementwise,
//   S = decay S ;  S += k delta^T   per accepted row,
// the same two roundings per element and row as the recurrence's (gdn_recurrence.cuh: s *= decay, then
// fmaf(k, delta, s)), without the prediction's sums over dk and their shuffles. Grid = (blocks of one layer,
// layers): a layer's first blocks replay its recurrent state (replay_slab), the rest shift its conv state, a
// thread per channel. The state is read once and written once: ~100 MB for Qwen3.5-4B (24 layers), ~25 us
// at 4.16 TB/s. With a count of rows on the device, every block reads it first (clamped to the layers'
// rows): a recorded commit takes any count.
#include <cstdint>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "backend/ops.h"

namespace qspec::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kMaxLayersPerLaunch = 24;  // keeps the kernel's parameters under 4 KiB
constexpr int kMaxConvHistory = kMaxConvKernel - 1;
constexpr int kRowsPerThread = 8;
constexpr int kSlabRows = kThreads / kWarpSize * kRowsPerThread;  // 32 state rows a recurrent block

struct CommitLayerArgs {
  float* state;  // [nv * dk, dv]
  int64_t state_stride;
  const float *keys, *decays, *deltas;  // the record's rows
  int64_t keys_stride, decays_stride, deltas_stride;
  float* conv_state;
  int64_t conv_state_stride;
  const float* conv_input;
  int64_t conv_input_stride;
  int64_t channels;
  int history;  // K - 1
};

struct CommitBatch {
  CommitLayerArgs layers[kMaxLayersPerLaunch];
};

struct CommitDims {
  int num_key_heads, num_value_heads, dk, dv;
  int slabs;  // per head: dk / kSlabRows, rounded up
};

// A recurrent block's shared memory: the record's rows it reads, keys [rows][kSlabRows] (its slab's), deltas
// [rows][dv] and decays [rows] (its head's).
constexpr size_t staged_record_bytes(int64_t rows, int dv) {
  return static_cast<size_t>(rows * (kSlabRows + dv + 1)) * sizeof(float);
}
static_assert(staged_record_bytes(kGdnReplayMaxRows, kGdnCommitMaxValueDim) <= 48 * 1024,
              "the largest record a block stages within the default shared memory of a launch");

template <int kColumns>
struct Columns {
  float v[kColumns];
};

template <int kColumns>
__device__ inline Columns<kColumns> load_columns(const float* p, int valid) {
  Columns<kColumns> c{};
  if constexpr (kColumns == 4) {
    if (valid == 4) {
      const float4 v = *reinterpret_cast<const float4*>(p);
      c.v[0] = v.x, c.v[1] = v.y, c.v[2] = v.z, c.v[3] = v.w;
      return c;
    }
  }
#pragma unroll
  for (int j = 0; j < kColumns; ++j)
    if (j < valid) c.v[j] = p[j];
  return c;
}

template <int kColumns>
__device__ inline void store_columns(float* p, const Columns<kColumns>& c, int valid) {
  if constexpr (kColumns == 4) {
    if (valid == 4) {
      *reinterpret_cast<float4*>(p) = make_float4(c.v[0], c.v[1], c.v[2], c.v[3]);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kColumns; ++j)
    if (j < valid) p[j] = c.v[j];
}

// Block `block` of a layer = (value head, slab of kSlabRows state rows) advanced past `tokens` rows of the
// record: warp w takes the slab's rows 8w .. 8w + 7, lane l its column groups l, l + 32, ... of kColumns
// columns (a warp's state loads are whole rows). The record's rows are staged first, every copy in flight at
// once with the state's first loads (read from L2 inside the token loop, each row cost a round trip: 2.4 us
// a token for 24 layers).
template <int kColumns>
__device__ void replay_slab(const CommitLayerArgs& layer, const CommitDims& d, int block, int64_t tokens) {
  extern __shared__ __align__(16) float staged[];  // staged_record_bytes; read as float4 (deltas)
  const int head = block / d.slabs, slab = block % d.slabs;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int key_head = head / (d.num_value_heads / d.num_key_heads);
  const int slab_row = slab * kSlabRows, slab_rows = min(kSlabRows, d.dk - slab_row);
  float* keys = staged;
  float* deltas = keys + tokens * kSlabRows;
  float* decays = deltas + tokens * d.dv;
  for (int64_t e = tid; e < tokens * kSlabRows; e += kThreads) {
    const int64_t t = e / kSlabRows;
    const int r = static_cast<int>(e % kSlabRows);
    const float* key = layer.keys + t * layer.keys_stride + static_cast<int64_t>(key_head) * d.dk + slab_row;
    cp_async_4(&keys[e], key + (r < slab_rows ? r : 0), r < slab_rows ? 4 : 0);  // rows past dk: zeros
  }
  for (int64_t e = tid; e < tokens * d.dv; e += kThreads) {
    const int64_t t = e / d.dv, c = e % d.dv;
    cp_async_4(&deltas[e], layer.deltas + t * layer.deltas_stride + static_cast<int64_t>(head) * d.dv + c);
  }
  for (int64_t t = tid; t < tokens; t += kThreads)
    cp_async_4(&decays[t], layer.decays + t * layer.decays_stride + head);

  const int first_row = warp * kRowsPerThread;  // in the slab
  float* state =
      layer.state + (static_cast<int64_t>(head) * d.dk + slab_row + first_row) * layer.state_stride;
  Columns<kColumns> s[kRowsPerThread] = {};
  const auto load_state = [&](int column) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
      if (first_row + r < slab_rows)
        s[r] = load_columns<kColumns>(state + r * layer.state_stride + column, min(kColumns, d.dv - column));
  };
  const int first_column = lane * kColumns;
  if (first_column < d.dv) load_state(first_column);  // in flight with the staging
  cp_async_wait_all();
  __syncthreads();
  for (int column = first_column; column < d.dv; column += kWarpSize * kColumns) {
    const int valid_columns = min(kColumns, d.dv - column);
    if (column != first_column) load_state(column);
    for (int64_t t = 0; t < tokens; ++t) {
      const float decay = decays[t];
      const Columns<kColumns> delta = load_columns<kColumns>(deltas + t * d.dv + column, valid_columns);
      const float* k = keys + t * kSlabRows + first_row;
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r)
#pragma unroll
        for (int j = 0; j < kColumns; ++j) s[r].v[j] = fmaf(k[r], delta.v[j], s[r].v[j] * decay);
    }
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r)
      if (first_row + r < slab_rows)
        store_columns<kColumns>(state + r * layer.state_stride + column, s[r], valid_columns);
  }
}

// The new conv state of one channel = entries tokens .. tokens + history - 1 of (old state, inputs); all read
// before any write.
__device__ void shift_conv_state(const CommitLayerArgs& layer, int64_t channel, int64_t tokens) {
  float* state = layer.conv_state + channel * layer.conv_state_stride;
  float next[kMaxConvHistory];
#pragma unroll
  for (int j = 0; j < kMaxConvHistory; ++j) {
    const int64_t from = tokens + j;
    if (j < layer.history)
      next[j] = from < layer.history
                    ? state[from]
                    : layer.conv_input[(from - layer.history) * layer.conv_input_stride + channel];
  }
#pragma unroll
  for (int j = 0; j < kMaxConvHistory; ++j)
    if (j < layer.history) state[j] = next[j];
}

template <int kColumns>
__global__ void __launch_bounds__(kThreads)
    gdn_commit_kernel(CommitBatch batch, CommitDims dims, int recurrence_blocks, int64_t rows,
                      const int32_t* accepted_rows) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const CommitLayerArgs& layer = batch.layers[blockIdx.y];
  const int64_t tokens =
      accepted_rows != nullptr ? min(max(int64_t{*accepted_rows}, int64_t{0}), rows) : rows;
  if (tokens == 0) return;
  const int block = static_cast<int>(blockIdx.x);
  if (block < recurrence_blocks) {
    replay_slab<kColumns>(layer, dims, block, tokens);
    return;
  }
  const int64_t channel = static_cast<int64_t>(block - recurrence_blocks) * kThreads + threadIdx.x;
  if (channel < layer.channels) shift_conv_state(layer, channel, tokens);
}

// Whole 16-byte column quads of every layer's state (16-byte aligned rows) and of the staged deltas (dv a
// multiple of 4).
bool quads_fit(const GdnCommitLayer* layers, size_t count, int value_head_dim) {
  if (value_head_dim % 4 != 0) return false;
  for (size_t i = 0; i < count; ++i) {
    const Tensor& s = layers[i].recurrent_state;
    if (s.stride % 4 != 0 || reinterpret_cast<uintptr_t>(s.ptr<const float>()) % 16 != 0) return false;
  }
  return true;
}

}  // namespace

cudaError_t launch_gdn_commit(const GdnCommitLayer* layers, size_t count, const int32_t* accepted_rows,
                              int num_key_heads, int num_value_heads, int key_head_dim, int value_head_dim,
                              cudaStream_t stream) {
  const int64_t rows = count == 0 ? 0 : layers[0].conv_input.rows;
  if (rows == 0) return cudaSuccess;
  const CommitDims dims{num_key_heads, num_value_heads, key_head_dim, value_head_dim,
                        (key_head_dim + kSlabRows - 1) / kSlabRows};
  const int recurrence_blocks = num_value_heads * dims.slabs;
  const size_t shared_bytes = staged_record_bytes(rows, value_head_dim);
  const bool quads = quads_fit(layers, count, value_head_dim);
  for (size_t first = 0; first < count; first += kMaxLayersPerLaunch) {
    const size_t batch_layers = count - first < kMaxLayersPerLaunch ? count - first : kMaxLayersPerLaunch;
    CommitBatch batch{};
    int64_t max_channels = 0;
    for (size_t i = 0; i < batch_layers; ++i) {
      const GdnCommitLayer& layer = layers[first + i];
      const GdnReplayRows& r = layer.replay;
      max_channels = layer.conv_state.rows > max_channels ? layer.conv_state.rows : max_channels;
      batch.layers[i] = {layer.recurrent_state.ptr<float>(),
                         layer.recurrent_state.stride,
                         r.keys.ptr<const float>(),
                         r.decays.ptr<const float>(),
                         r.deltas.ptr<const float>(),
                         r.keys.stride,
                         r.decays.stride,
                         r.deltas.stride,
                         layer.conv_state.ptr<float>(),
                         layer.conv_state.stride,
                         layer.conv_input.ptr<const float>(),
                         layer.conv_input.stride,
                         layer.conv_state.rows,
                         static_cast<int>(layer.conv_state.cols)};
    }
    const auto conv_blocks = static_cast<int>((max_channels + kThreads - 1) / kThreads);
    const dim3 grid(static_cast<unsigned int>(recurrence_blocks + conv_blocks),
                    static_cast<unsigned int>(batch_layers));
    const auto launch = [&](auto kernel) {
      return launch_kernel(kernel, grid, kThreads, shared_bytes, stream, batch, dims, recurrence_blocks, rows,
                           accepted_rows);
    };
    const cudaError_t status = quads ? launch(gdn_commit_kernel<4>) : launch(gdn_commit_kernel<1>);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace qspec::cuda
