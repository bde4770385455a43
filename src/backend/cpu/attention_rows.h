// The softmax attention both CPU attention ops share: every (query row, head) of q over one range of cache
// rows, GQA mapping query head h to KV head h / (num_heads / num_kv_heads), fp32 with max subtraction.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "backend/ops.h"

namespace qspec::cpu {

// [first, end) cache rows that query row t attends to; the range must be non-empty and inside the cache.
using KeyRange = std::function<std::pair<int64_t, int64_t>(int64_t t)>;

void attend_key_ranges(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                       const AttentionShape& shape, const KeyRange& key_range);

}  // namespace qspec::cpu
