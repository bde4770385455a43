// argmax over the rows of logits (backend/argmax.h gives the rule).
#include "backend/argmax.h"

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace qspec {

int32_t argmax(std::span<const float> values) {
  if (values.empty()) fail("argmax: empty row");
  size_t best = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) return static_cast<int32_t>(i);
    if (values[i] > values[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

namespace cpu {

void CpuBackend::argmax(const Tensor& out_ids, const Tensor& logits) {
  check_argmax_args(out_ids, logits);
  for (int64_t r = 0; r < logits.rows; ++r)
    out_ids.row<int32_t>(r)[0] =
        qspec::argmax(std::span<const float>(logits.row<float>(r), static_cast<size_t>(logits.cols)));
}

}  // namespace cpu

}  // namespace qspec
