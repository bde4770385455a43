// gdn_commit: the accepted rows of a verify step advance each GDN layer's conv state (the rolling window of
// conv1d_silu) and recurrent state (the replay of the verify step's record), without outputs.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gated_delta_rule.h"
#include "backend/op_checks.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace qspec::cpu {

namespace {

// state [C, K-1] becomes the last K-1 entries of (its row, then x's column) per channel, as conv1d_silu's.
void advance_conv_state(const Tensor& state, const Tensor& x) {
  const int64_t history = state.cols, tokens = x.rows;
  ThreadPool::global().parallel_for(static_cast<size_t>(state.rows), [&](size_t begin, size_t end) {
    std::vector<float> window(static_cast<size_t>(history + tokens));
    for (auto c = static_cast<int64_t>(begin); c < static_cast<int64_t>(end); ++c) {
      std::copy_n(state.row<float>(c), history, window.begin());
      for (int64_t t = 0; t < tokens; ++t) window[history + t] = x.row<float>(t)[c];
      std::copy_n(window.begin() + tokens, history, state.row<float>(c));
    }
  });
}

}  // namespace

void CpuBackend::gdn_commit(std::span<const GdnCommitLayer> layers, const GdnShape& shape,
                            const Tensor& rows) {
  check_gdn_commit_args(layers, shape, rows);
  const int64_t tokens = layers.empty() ? 0 : layers.front().conv_input.rows;
  const int64_t accepted = rows.empty() ? tokens : rows.ptr<const int32_t>()[0];
  if (accepted < 0 || accepted > tokens)
    fail("gdn_commit: rows[0] is {}, expected 0 to {} (the layers' rows)", accepted, tokens);
  for (const GdnCommitLayer& layer : layers) {
    advance_conv_state(layer.conv_state, layer.conv_input.rows_view(0, accepted));
    replay_gated_delta_rule(layer.replay.rows_view(0, accepted), layer.recurrent_state, shape);
  }
}

}  // namespace qspec::cpu
