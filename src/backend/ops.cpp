#include "backend/ops.h"

#include "backend/op_checks.h"
#include "core/error.h"

namespace qspec {

std::unique_ptr<StepGraph> Backend::capture(const std::function<void()>&) {
  fail("backend {} cannot record step graphs", name());
}

void Backend::attention_prologue(const Tensor& query, const Tensor& gate, const Tensor& qkv,
                                 const Tensor& q_norm, const Tensor& k_norm, const Tensor& k_cache,
                                 const Tensor& v_cache, const Tensor& positions,
                                 const AttentionPrologueShape& shape) {
  const int64_t q_cols = int64_t(shape.num_heads) * shape.head_dim;
  const int64_t kv_cols = int64_t(shape.num_kv_heads) * shape.head_dim;
  check_attention_prologue_args(query, gate, qkv, q_norm, k_norm, k_cache, v_cache, positions, shape);
  const int64_t query_cols = gate.empty() ? q_cols : 2 * q_cols;
  const Tensor k = qkv.cols_view(query_cols, kv_cols), v = qkv.cols_view(query_cols + kv_cols, kv_cols);
  if (shape.num_heads > 0) {
    if (!gate.empty())
      split_query_gate(query, gate, qkv.cols_view(0, query_cols), shape.head_dim);
    else if (query.data != qkv.data)
      copy(query, qkv.cols_view(0, q_cols));
    rmsnorm(query, query, q_norm, shape.eps, shape.unit_offset);
    rope(query, positions, shape.head_dim, shape.rotary_dim, shape.rope_theta);
  }
  rmsnorm(k, k, k_norm, shape.eps, shape.unit_offset);
  rope(k, positions, shape.head_dim, shape.rotary_dim, shape.rope_theta);
  kv_store(k_cache, k, positions);
  kv_store(v_cache, v, positions);
}

void Backend::attention_prologues(std::span<const AttentionPrologueLayer> layers, const Tensor& positions,
                                  const AttentionPrologueShape& shape) {
  check_attention_prologues_args(layers, positions, shape);
  for (const AttentionPrologueLayer& l : layers)
    attention_prologue(l.query, l.gate, l.qkv, l.q_norm, l.k_norm, l.k_cache, l.v_cache, positions, shape);
}

void Backend::gdn_gates_linear(const Tensor& beta, const Tensor& g, const Tensor& x, const LinearWeight& w_b,
                               const LinearWeight& w_a, const Tensor& a_log, const Tensor& dt_bias) {
  check_gdn_gates_linear_args(beta, g, x, w_b, w_a, a_log, dt_bias);
  linear(beta, x, w_b);
  linear(g, x, w_a);
  gdn_gates(beta, g, beta, g, a_log, dt_bias);
}

void Backend::gdn_mixer(const Tensor& out, const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                        const Tensor& core, const Tensor& qkvz, const Tensor& x, const Tensor& conv_state,
                        const Tensor& recurrent_state, const GdnMixerWeights& w, const GdnShape& shape,
                        float eps, const GdnStateUpdate& update) {
  check_gdn_mixer_args(out, conv_out, beta, g, core, qkvz, x, conv_state, recurrent_state, w, shape, update);
  gdn_mixer_to_core(conv_out, beta, g, core, qkvz, x, conv_state, recurrent_state, w, shape, update);
  const int64_t channels = conv_out.cols;
  gated_rmsnorm(out, core, w.norm_weight, qkvz.cols_view(channels, qkvz.cols - channels), eps);
}

void Backend::gdn_mixer_to_core(const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                                const Tensor& core, const Tensor& qkvz, const Tensor& x,
                                const Tensor& conv_state, const Tensor& recurrent_state,
                                const GdnMixerWeights& w, const GdnShape& shape,
                                const GdnStateUpdate& update) {
  conv1d_silu(conv_out, qkvz.cols_view(0, conv_out.cols), conv_state, w.conv_weight, update.advance);
  gdn_gates_linear(beta, g, x, w.w_b, w.w_a, w.a_log, w.dt_bias);
  gated_delta_rule(core, conv_out, beta, g, recurrent_state, shape, update);
}

void Backend::gdn_mixer_linear(const LinearProjection& projection, const Tensor& gated,
                               const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                               const Tensor& core, const Tensor& qkvz, const Tensor& x,
                               const Tensor& conv_state, const Tensor& recurrent_state,
                               const GdnMixerWeights& w, const GdnShape& shape, float eps,
                               const GdnStateUpdate& update) {
  check_gdn_mixer_linear_args(projection, gated, conv_out, beta, g, core, qkvz, x, conv_state,
                              recurrent_state, w, shape, update);
  gdn_mixer(gated, conv_out, beta, g, core, qkvz, x, conv_state, recurrent_state, w, shape, eps, update);
  linear(projection.out, gated, projection.w);
}

void Backend::add_rmsnorm_linear(std::span<const LinearProjection> projections, const Tensor& normed,
                                 NormedRows /*rows*/, const Tensor& x, const Tensor& delta,
                                 const Tensor& weight, float eps, bool unit_offset) {
  check_add_rmsnorm_linear_args(projections, normed, x, delta, weight);
  if (delta.empty())
    rmsnorm(normed, x, weight, eps, unit_offset);
  else
    add_rmsnorm(normed, x, delta, weight, eps, unit_offset);
  for (const LinearProjection& p : projections) linear(p.out, normed, p.w);
}

void Backend::sigmoid_gated_linear(const Tensor& out, const Tensor& x, const Tensor& gate,
                                   const LinearWeight& w) {
  check_sigmoid_gated_linear_args(out, x, gate, w);
  sigmoid_mul(x, x, gate);
  linear(out, x, w);
}

void Backend::silu_gated_linear(const Tensor& out, const Tensor& gate_up, const Tensor& act,
                                const LinearWeight& w) {
  check_silu_gated_linear_args(out, gate_up, act, w);
  const int64_t intermediate = w.in_features;
  silu_mul(act, gate_up.cols_view(0, intermediate), gate_up.cols_view(intermediate, intermediate));
  linear(out, act, w);
}

}  // namespace qspec
