// Elementwise ops on F32 activations (add, silu_mul, sigmoid_mul) and the per-head query/gate split.
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/math.h"
#include "backend/op_checks.h"

namespace qspec::cpu {

namespace {

// out[t][i] = combine(a[t][i], b[t][i]); out may alias a or b.
template <typename Combine>
void elementwise(std::string_view op, std::string_view a_name, std::string_view b_name, const Tensor& out,
                 const Tensor& a, const Tensor& b, Combine combine) {
  check_elementwise_args(op, a_name, b_name, out, a, b);
  for (int64_t t = 0; t < a.rows; ++t) {
    const float* x = a.row<float>(t);
    const float* y = b.row<float>(t);
    float* result = out.row<float>(t);
    for (int64_t i = 0; i < a.cols; ++i) result[i] = combine(x[i], y[i]);
  }
}

}  // namespace

void CpuBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  elementwise("add", "a", "b", out, a, b, [](float x, float y) { return x + y; });
}

void CpuBackend::silu_mul(const Tensor& out, const Tensor& gate, const Tensor& up) {
  elementwise("silu_mul", "gate", "up", out, gate, up, [](float g, float u) { return silu(g) * u; });
}

void CpuBackend::sigmoid_mul(const Tensor& out, const Tensor& x, const Tensor& gate) {
  elementwise("sigmoid_mul", "x", "gate", out, x, gate, [](float v, float g) { return v * sigmoid(g); });
}

void CpuBackend::split_query_gate(const Tensor& query, const Tensor& gate, const Tensor& qg, int head_dim) {
  check_split_query_gate_args(query, gate, qg, head_dim);
  const auto bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int64_t t = 0; t < qg.rows; ++t)
    for (int64_t h = 0; h < qg.cols / (2 * head_dim); ++h) {
      const float* pair = qg.row<float>(t) + 2 * h * head_dim;
      std::memcpy(query.row<float>(t) + h * head_dim, pair, bytes);
      std::memcpy(gate.row<float>(t) + h * head_dim, pair + head_dim, bytes);
    }
}

}  // namespace qspec::cpu
