// Ops that move whole rows by index: embed (gather from a table) and kv_store (scatter into a cache).
#include <cstring>

#include "backend/cpu/checks.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/weight_values.h"
#include "core/error.h"

namespace qspec::cpu {

void CpuBackend::embed(const Tensor& out, const Tensor& table, const Tensor& ids) {
  require_activation("embed", "out", out);
  require_weight("embed", "table", table);
  require_indices("embed", "ids", ids, out.rows);
  require_shape("embed", "out", out, ids.rows, table.cols);
  for (int64_t t = 0; t < ids.rows; ++t) {
    int32_t id = ids.row<int32_t>(t)[0];
    if (id < 0 || id >= table.rows)
      fail("embed: token id {} (row {}) is outside the vocabulary [0, {})", id, t, table.rows);
  }
  for (int64_t t = 0; t < ids.rows; ++t) weight_row(table, ids.row<int32_t>(t)[0], out.row<float>(t));
}

void CpuBackend::kv_store(const Tensor& cache, const Tensor& x, const Tensor& positions) {
  require_activation("kv_store", "cache", cache);
  require_activation("kv_store", "x", x);
  require_indices("kv_store", "positions", positions, x.rows);
  if (x.cols != cache.cols) fail("kv_store: x has {} columns but the cache has {}", x.cols, cache.cols);
  for (int64_t t = 0; t < x.rows; ++t) {
    int32_t position = positions.row<int32_t>(t)[0];
    if (position < 0 || position >= cache.rows)
      fail("kv_store: position {} (row {}) is outside the cache of {} rows", position, t, cache.rows);
  }
  for (int64_t t = 0; t < x.rows; ++t)
    std::memcpy(cache.row<float>(positions.row<int32_t>(t)[0]), x.row<float>(t),
                static_cast<size_t>(x.cols) * sizeof(float));
}

}  // namespace qspec::cpu
