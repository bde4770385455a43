// RMSNorm over groups of columns: plain / zero-centered (1 + w), and the gated form of the GDN output.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/math.h"
#include "backend/cpu/weight_values.h"
#include "backend/op_checks.h"
#include "core/thread_pool.h"

namespace qspec::cpu {

namespace {

// 1 / sqrt(mean(x^2) + eps) as torch.rsqrt(x.pow(2).mean(-1) + eps) in fp32.
float inverse_rms(const float* x, int64_t n, float eps) {
  return 1.0f / std::sqrt(sum_of_squares(x, n) / static_cast<float>(n) + eps);
}

// Calls normalize_group(t, first_column, inverse_rms) for every group of every row; rows spread over threads.
template <typename NormalizeGroup>
void for_each_group(const Tensor& x, int64_t group, float eps, NormalizeGroup normalize_group) {
  ThreadPool::global().parallel_for(static_cast<size_t>(x.rows), [&](size_t begin, size_t end) {
    for (auto t = static_cast<int64_t>(begin); t < static_cast<int64_t>(end); ++t)
      for (int64_t first = 0; first < x.cols; first += group)
        normalize_group(t, first, inverse_rms(x.row<float>(t) + first, group, eps));
  });
}

}  // namespace

void CpuBackend::rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, float eps,
                         bool unit_offset) {
  check_norm_args("rmsnorm", out, x, weight);
  std::vector<float> scale = weight_vector(weight);
  if (unit_offset)
    for (float& s : scale) s = 1.0f + s;
  for_each_group(x, weight.cols, eps, [&](int64_t t, int64_t first, float inv) {
    const float* in = x.row<float>(t) + first;
    float* y = out.row<float>(t) + first;
    for (int64_t i = 0; i < weight.cols; ++i) y[i] = in[i] * inv * scale[i];
  });
}

// Exactly add, then rmsnorm: the fused op exists for the GPU's sake.
void CpuBackend::add_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& delta, const Tensor& weight,
                             float eps, bool unit_offset) {
  check_add_rmsnorm_args(out, x, delta, weight);
  add(x, x, delta);
  rmsnorm(out, x, weight, eps, unit_offset);
}

void CpuBackend::gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& z,
                               float eps) {
  check_norm_args("gated_rmsnorm", out, x, weight);
  check_norm_gate_args(z, x);
  std::vector<float> scale = weight_vector(weight);
  for_each_group(x, weight.cols, eps, [&](int64_t t, int64_t first, float inv) {
    const float* in = x.row<float>(t) + first;
    const float* gate = z.row<float>(t) + first;
    float* y = out.row<float>(t) + first;
    for (int64_t i = 0; i < weight.cols; ++i) y[i] = scale[i] * (in[i] * inv) * silu(gate[i]);
  });
}

}  // namespace qspec::cpu
