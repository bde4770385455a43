// Causal depthwise conv1d + SiLU with a rolling state of the previous K-1 inputs (PyTorch cross-correlation:
// weight[c][K-1] multiplies the current token, weight[c][0] the token K-1 steps back).
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/math.h"
#include "backend/cpu/weight_values.h"
#include "backend/op_checks.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace qspec::cpu {

void CpuBackend::conv1d_silu(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight,
                             bool update_state) {
  check_conv1d_operands(out, x, state, weight);
  if (weight.cols < 1) fail("conv1d_silu: weight has {} columns, expected a kernel size >= 1", weight.cols);
  check_conv1d_shapes(out, x, state, weight);
  const int64_t kernel = weight.cols;
  const int64_t history = kernel - 1;
  const int64_t tokens = x.rows;
  ThreadPool::global().parallel_for(static_cast<size_t>(x.cols), [&](size_t begin, size_t end) {
    // window = the channel's K-1 previous inputs then its T new ones; copied first so out may alias x.
    std::vector<float> window(static_cast<size_t>(history + tokens));
    std::vector<float> taps(static_cast<size_t>(kernel));
    for (auto c = static_cast<int64_t>(begin); c < static_cast<int64_t>(end); ++c) {
      std::copy_n(state.row<float>(c), history, window.begin());
      for (int64_t t = 0; t < tokens; ++t) window[history + t] = x.row<float>(t)[c];
      weight_row(weight, c, taps.data());
      for (int64_t t = 0; t < tokens; ++t) {
        float sum = 0.0f;
        for (int64_t j = 0; j < kernel; ++j) sum += taps[j] * window[t + j];
        out.row<float>(t)[c] = silu(sum);
      }
      if (update_state) std::copy_n(window.begin() + tokens, history, state.row<float>(c));
    }
  });
}

}  // namespace qspec::cpu
