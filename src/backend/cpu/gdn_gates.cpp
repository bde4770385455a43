// Gated DeltaNet gates: beta = sigmoid(b), g = -exp(a_log) * softplus(a + dt_bias) (softplus threshold 20).
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/math.h"
#include "backend/cpu/weight_values.h"
#include "backend/op_checks.h"

namespace qspec::cpu {

void CpuBackend::gdn_gates(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                           const Tensor& a_log, const Tensor& dt_bias) {
  check_gdn_gates_args(beta, g, b, a, a_log, dt_bias);
  const int64_t heads = b.cols;
  std::vector<float> decay_rate = weight_vector(a_log);
  for (float& r : decay_rate) r = -std::exp(r);
  const std::vector<float> bias = weight_vector(dt_bias);
  for (int64_t t = 0; t < b.rows; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      beta.row<float>(t)[h] = sigmoid(b.row<float>(t)[h]);
      g.row<float>(t)[h] = decay_rate[h] * softplus(a.row<float>(t)[h] + bias[h]);
    }
}

}  // namespace qspec::cpu
