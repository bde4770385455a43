// Attention of query rows over explicit ranges of cache rows (the DFlash drafter's non-causal block, with or
// without its sliding window).
#include "backend/cpu/attention_rows.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace qspec::cpu {

void CpuBackend::windowed_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                    const Tensor& v_cache, const Tensor& key_begin, const Tensor& key_end,
                                    const AttentionShape& shape) {
  check_windowed_attention_args(out, q, k_cache, v_cache, key_begin, key_end, shape);
  for (int64_t t = 0; t < q.rows; ++t) {
    const int32_t begin = key_begin.row<int32_t>(t)[0], end = key_end.row<int32_t>(t)[0];
    if (begin < 0 || begin >= end || end > k_cache.rows)
      fail("windowed_attention: key range [{}, {}) of row {} is empty or outside the cache of {} rows", begin,
           end, t, k_cache.rows);
  }
  attend_key_ranges(out, q, k_cache, v_cache, shape, [&](int64_t t) {
    return std::pair<int64_t, int64_t>{key_begin.row<int32_t>(t)[0], key_end.row<int32_t>(t)[0]};
  });
}

}  // namespace qspec::cpu
