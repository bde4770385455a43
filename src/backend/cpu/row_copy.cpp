// Ops that move whole rows by index: embed (gather from a table) and kv_store (scatter into a cache).
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/index_checks.h"
#include "backend/cpu/weight_values.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace qspec::cpu {

void CpuBackend::embed(const Tensor& out, const Tensor& table, const Tensor& ids) {
  check_embed_args(out, table, ids);
  for (int64_t t = 0; t < ids.rows; ++t) {
    int32_t id = ids.row<int32_t>(t)[0];
    if (id < 0 || id >= table.rows)
      fail("embed: token id {} (row {}) is outside the vocabulary [0, {})", id, t, table.rows);
  }
  for (int64_t t = 0; t < ids.rows; ++t) weight_row(table, ids.row<int32_t>(t)[0], out.row<float>(t));
}

void CpuBackend::kv_store(const Tensor& cache, const Tensor& x, const Tensor& positions) {
  check_kv_store_args(cache, x, positions);
  require_positions_in_cache("kv_store", positions, cache.rows);
  for (int64_t t = 0; t < x.rows; ++t)
    std::memcpy(cache.row<float>(positions.row<int32_t>(t)[0]), x.row<float>(t),
                static_cast<size_t>(x.cols) * sizeof(float));
}

}  // namespace qspec::cpu
