// Causal attention of query rows over a KV cache: query row t sees cache rows 0..positions[t] inclusive; GQA
// maps query head h to KV head h / (num_heads / num_kv_heads). Softmax in fp32 with max subtraction.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/attention_rows.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/index_checks.h"
#include "backend/cpu/math.h"
#include "backend/op_checks.h"
#include "core/thread_pool.h"

namespace qspec::cpu {

namespace {

void check_attention_args(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                          const Tensor& positions, const AttentionShape& shape) {
  check_attention_operands(out, q, k_cache, v_cache, shape);
  check_attention_widths(out, q, k_cache, v_cache, positions, shape);
  require_positions_in_cache("attention", positions, k_cache.rows);
}

}  // namespace

void attend_key_ranges(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                       const AttentionShape& shape, const KeyRange& key_range) {
  const int64_t dim = shape.head_dim;
  const int heads_per_kv = shape.num_heads / shape.num_kv_heads;
  // One task per (query row, head): each writes its own slice of out.
  const auto tasks = static_cast<size_t>(q.rows * shape.num_heads);
  ThreadPool::global().parallel_for(tasks, [&](size_t begin, size_t end) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(dim));
    for (size_t task = begin; task < end; ++task) {
      const auto t = static_cast<int64_t>(task / static_cast<size_t>(shape.num_heads));
      const auto head = static_cast<int64_t>(task % static_cast<size_t>(shape.num_heads));
      const int64_t kv_offset = head / heads_per_kv * dim;
      const float* query = q.row<float>(t) + head * dim;
      const auto [first_key, end_key] = key_range(t);
      const int64_t keys = end_key - first_key;
      scores.resize(static_cast<size_t>(keys));
      float max_score = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        scores[j] = dot(query, k_cache.row<float>(first_key + j) + kv_offset, dim) * shape.scale;
        max_score = std::max(max_score, scores[j]);
      }
      float total = 0.0f;
      for (int64_t j = 0; j < keys; ++j) {
        scores[j] = std::exp(scores[j] - max_score);
        total += scores[j];
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < keys; ++j) {
        const float* value = v_cache.row<float>(first_key + j) + kv_offset;
        const float weight = scores[j] / total;
        for (int64_t d = 0; d < dim; ++d) acc[d] += weight * value[d];
      }
      std::copy(acc.begin(), acc.end(), out.row<float>(t) + head * dim);
    }
  });
}

void CpuBackend::attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           const Tensor& positions, const AttentionShape& shape) {
  check_attention_args(out, q, k_cache, v_cache, positions, shape);
  attend_key_ranges(out, q, k_cache, v_cache, shape, [&](int64_t t) {
    return std::pair<int64_t, int64_t>{0, positions.row<int32_t>(t)[0] + 1};
  });
}

}  // namespace qspec::cpu
