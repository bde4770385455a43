// Range checks of the indices the CPU ops read on the host (their dtypes and shapes are checked in
// backend/op_checks.h first).
#pragma once

#include <cstdint>
#include <string_view>

#include "backend/tensor.h"
#include "core/error.h"

namespace qspec::cpu {

// positions I32 [T, 1]: every one a row of a cache of cache_rows rows.
inline void require_positions_in_cache(std::string_view op, const Tensor& positions, int64_t cache_rows) {
  for (int64_t t = 0; t < positions.rows; ++t) {
    const int32_t position = positions.row<int32_t>(t)[0];
    if (position < 0 || position >= cache_rows)
      fail("{}: position {} (row {}) is outside the cache of {} rows", op, position, t, cache_rows);
  }
}

}  // namespace qspec::cpu
