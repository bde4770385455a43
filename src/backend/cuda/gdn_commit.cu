// gdn_commit: a verify step's accepted rows advance every GDN layer's states in one launch (the commit used
// to take a conv1d_silu and a gated_delta_rule launch per layer, 48 for Qwen3.5-4B). Grid = (blocks of one
// layer, layers): a layer's first nv * slabs blocks run gdn_recurrence.cuh without outputs (the same
// per-token arithmetic as gated_delta_rule, so the state is that op's bit for bit), the rest shift its conv
// state, a thread per channel. Prediction (H200, Qwen3.5-4B, 24 layers, 16 rows): 48 MiB of state read +
// written ~23 us at 4.16 TB/s, ~15 us of FP32 work and ~6 us of shuffles spread over 4 blocks per SM (3,072
// recurrence blocks): ~25-35 us in all, against 0.62 ms for the 48 launches. With a count of rows on the
// device, every block reads it first (clamped to the layers' rows): a recorded commit takes any count.
#include <cmath>

#include "backend/cuda/gdn_recurrence.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "backend/ops.h"

namespace qspec::cuda {

namespace {

constexpr int kMaxLayersPerLaunch = 24;  // keeps the kernel's parameters under 4 KiB
constexpr int kMaxConvHistory = kMaxConvKernel - 1;

struct CommitLayerArgs {
  gdn::RecurrenceArgs recurrence;
  bool recurrence_here;  // else gated_delta_rule's general kernel advances this layer's recurrent state
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

template <int kRows>
__global__ void __launch_bounds__(gdn::kThreads)
    gdn_commit_kernel(CommitBatch batch, gdn::Dims dims, int recurrence_blocks, int slabs,
                      const int32_t* accepted_rows) {
  wait_for_previous_kernel();
  allow_next_kernel();
  CommitLayerArgs layer = batch.layers[blockIdx.y];  // the fields used, read from the parameters
  if (accepted_rows != nullptr)
    layer.recurrence.tokens = min(max(int64_t{*accepted_rows}, int64_t{0}), layer.recurrence.tokens);
  const int block = static_cast<int>(blockIdx.x);
  if (block < recurrence_blocks) {
    if (layer.recurrence_here)
      gdn::recurrence_slab<kRows, false>(layer.recurrence, dims, block / slabs, block % slabs, true);
    return;
  }
  const int64_t channel = static_cast<int64_t>(block - recurrence_blocks) * gdn::kThreads + threadIdx.x;
  if (channel >= layer.channels) return;
  // The new state = entries tokens .. tokens + history - 1 of (old state, inputs); all read before any write.
  float* state = layer.conv_state + channel * layer.conv_state_stride;
  const int64_t tokens = layer.recurrence.tokens;
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

}  // namespace

bool gdn_commit_takes_row_count(const Tensor& recurrent_state, int key_head_dim, int value_head_dim) {
  return gdn::recurrence_fits(recurrent_state.ptr<const float>(), recurrent_state.stride, key_head_dim,
                              value_head_dim);
}

cudaError_t launch_gdn_commit(const GdnCommitLayer* layers, size_t count, const int32_t* accepted_rows,
                              int num_key_heads, int num_value_heads, int key_head_dim, int value_head_dim,
                              cudaStream_t stream) {
  if (count == 0 || layers[0].qkv.rows == 0) return cudaSuccess;
  const gdn::Dims dims{num_key_heads, num_value_heads, key_head_dim, value_head_dim,
                       static_cast<float>(1.0 / std::sqrt(static_cast<double>(key_head_dim)))};
  const int slabs = gdn::slabs(value_head_dim);
  for (size_t first = 0; first < count; first += kMaxLayersPerLaunch) {
    const size_t batch_layers = count - first < kMaxLayersPerLaunch ? count - first : kMaxLayersPerLaunch;
    CommitBatch batch{};
    bool any_recurrence = false;
    int64_t max_channels = 0;
    for (size_t i = 0; i < batch_layers; ++i) {
      const GdnCommitLayer& layer = layers[first + i];
      const Tensor& state = layer.recurrent_state;
      const bool fits =
          gdn::recurrence_fits(state.ptr<const float>(), state.stride, key_head_dim, value_head_dim);
      any_recurrence = any_recurrence || fits;
      max_channels = layer.conv_state.rows > max_channels ? layer.conv_state.rows : max_channels;
      batch.layers[i] = {{nullptr, 0, layer.qkv.ptr<const float>(), layer.qkv.stride,
                          layer.beta.ptr<const float>(), layer.beta.stride, layer.g.ptr<const float>(),
                          layer.g.stride, state.ptr<float>(), state.stride, layer.qkv.rows},
                         fits,
                         layer.conv_state.ptr<float>(),
                         layer.conv_state.stride,
                         layer.conv_input.ptr<const float>(),
                         layer.conv_input.stride,
                         layer.conv_state.rows,
                         static_cast<int>(layer.conv_state.cols)};
      if (!fits) {
        if (accepted_rows != nullptr) return cudaErrorNotSupported;  // that kernel takes host counts only
        const cudaError_t status =
            launch_gated_delta_rule_recurrent(Tensor{}, layer.qkv, layer.beta, layer.g, state, num_key_heads,
                                              num_value_heads, key_head_dim, value_head_dim, true, stream);
        if (status != cudaSuccess) return status;
      }
    }
    const int recurrence_blocks = any_recurrence ? num_value_heads * slabs : 0;
    const auto conv_blocks = static_cast<int>((max_channels + gdn::kThreads - 1) / gdn::kThreads);
    const dim3 grid(static_cast<unsigned int>(recurrence_blocks + conv_blocks),
                    static_cast<unsigned int>(batch_layers));
    if (grid.x == 0) continue;
    const auto launch = [&](auto rows) {
      return launch_kernel(gdn_commit_kernel<decltype(rows)::value>, grid, gdn::kThreads, 0, stream, batch,
                           dims, recurrence_blocks, slabs, accepted_rows);
    };
    const cudaError_t status = any_recurrence ? gdn::with_rows_per_lane(key_head_dim, launch)
                                              : launch(std::integral_constant<int, 1>{});
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace qspec::cuda
