#include "backend/op_checks.h"

#include <fmt/ranges.h>

#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace qspec {

namespace {

void require_data(std::string_view op, std::string_view arg, const Tensor& t) {
  if (t.empty() && t.numel() > 0) fail("{}: {} has no data", op, arg);
  if (t.rows < 0 || t.cols < 0) fail("{}: {} has a negative shape [{}, {}]", op, arg, t.rows, t.cols);
  if (t.rows > 1 && t.stride < t.cols)
    fail("{}: {} has row stride {} smaller than its {} columns", op, arg, t.stride, t.cols);
}

}  // namespace

void require_dtype(std::string_view op, std::string_view arg, const Tensor& t, DType dtype) {
  if (t.dtype != dtype) fail("{}: {} must be {}, got {}", op, arg, dtype_name(dtype), dtype_name(t.dtype));
  require_data(op, arg, t);
}

void require_activation(std::string_view op, std::string_view arg, const Tensor& t) {
  require_dtype(op, arg, t, DType::F32);
}

void require_weight(std::string_view op, std::string_view arg, const Tensor& t) {
  if (t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F32)
    fail("{}: weight {} must be BF16, F16 or F32, got {}", op, arg, dtype_name(t.dtype));
  require_data(op, arg, t);
}

void require_shape(std::string_view op, std::string_view arg, const Tensor& t, int64_t rows, int64_t cols) {
  if (t.rows != rows || t.cols != cols)
    fail("{}: {} has shape [{}, {}], expected [{}, {}]", op, arg, t.rows, t.cols, rows, cols);
}

void require_indices(std::string_view op, std::string_view arg, const Tensor& t, int64_t rows) {
  require_dtype(op, arg, t, DType::I32);
  require_shape(op, arg, t, rows, 1);
}

void require_contiguous(std::string_view op, std::string_view arg, const Tensor& t) {
  if (!t.contiguous()) fail("{}: {} must be contiguous (stride {} != {} columns)", op, arg, t.stride, t.cols);
}

void check_alloc_args(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) fail("alloc: negative shape [{}, {}]", rows, cols);
}

void check_upload_weight_args(const TensorView& view, int64_t rows, int64_t cols) {
  const int64_t numel =
      std::accumulate(view.shape.begin(), view.shape.end(), int64_t{1}, std::multiplies<>());
  if (rows < 0 || cols < 0 || numel != rows * cols)
    fail("upload_weight: tensor {} has shape [{}] ({} elements), expected [{}, {}]", view.name,
         fmt::join(view.shape, ", "), numel, rows, cols);
}

void check_copy_args(const Tensor& dst, const Tensor& src) {
  if (dst.dtype != src.dtype)
    fail("copy: dst is {} but src is {}", dtype_name(dst.dtype), dtype_name(src.dtype));
  require_shape("copy", "dst", dst, src.rows, src.cols);
}

void check_embed_args(const Tensor& out, const Tensor& table, const Tensor& ids) {
  require_activation("embed", "out", out);
  require_weight("embed", "table", table);
  require_indices("embed", "ids", ids, out.rows);
  require_shape("embed", "out", out, ids.rows, table.cols);
}

void check_norm_args(std::string_view op, const Tensor& out, const Tensor& x, const Tensor& weight) {
  require_activation(op, "x", x);
  require_activation(op, "out", out);
  require_weight(op, "weight", weight);
  if (weight.rows != 1 || weight.cols <= 0)
    fail("{}: weight has shape [{}, {}], expected [1, group]", op, weight.rows, weight.cols);
  if (x.cols % weight.cols != 0)
    fail("{}: x has {} columns, not a multiple of the weight's {} (the group size)", op, x.cols, weight.cols);
  require_shape(op, "out", out, x.rows, x.cols);
}

void check_add_rmsnorm_args(const Tensor& out, const Tensor& x, const Tensor& delta, const Tensor& weight) {
  check_norm_args("add_rmsnorm", out, x, weight);
  require_activation("add_rmsnorm", "delta", delta);
  require_shape("add_rmsnorm", "delta", delta, x.rows, x.cols);
  if (out.data == x.data || out.data == delta.data)
    fail("add_rmsnorm: out must not alias x or delta (x is updated before out is written)");
}

void check_add_rmsnorm_linear_args(std::span<const LinearProjection> projections, const Tensor& normed,
                                   const Tensor& x, const Tensor& delta, const Tensor& weight) {
  constexpr std::string_view op = "add_rmsnorm_linear";
  check_norm_args(op, normed, x, weight);
  if (!delta.empty()) {
    require_activation(op, "delta", delta);
    require_shape(op, "delta", delta, x.rows, x.cols);
  }
  if (normed.overlaps(x) || normed.overlaps(delta))
    fail("{}: normed must not overlap x or delta (x is updated before normed is written)", op);
  for (size_t i = 0; i < projections.size(); ++i) {
    const Tensor& out = projections[i].out;
    check_linear_args(out, normed, projections[i].w);
    if (out.overlaps(normed) || out.overlaps(x) || out.overlaps(delta))
      fail("{}: projections[{}].out overlaps normed, x or delta", op, i);
  }
}

void check_norm_gate_args(const Tensor& z, const Tensor& x) {
  require_activation("gated_rmsnorm", "z", z);
  require_shape("gated_rmsnorm", "z", z, x.rows, x.cols);
}

void check_linear_args(const Tensor& out, const Tensor& x, const LinearWeight& w) {
  require_activation("linear", "x", x);
  require_activation("linear", "out", out);
  if (x.cols != w.in_features)
    fail("linear: x has {} columns but the weight has in_features {}", x.cols, w.in_features);
  require_shape("linear", "out", out, x.rows, w.out_features);
  if (w.quantized()) {
    if (w.in_features % 8 != 0)
      fail("linear: W4A16 in_features {} is not a multiple of 8 (nibbles per packed word)", w.in_features);
    if (w.group_size <= 0) fail("linear: W4A16 group_size must be positive, got {}", w.group_size);
    require_dtype("linear", "packed weight", w.packed, DType::I32);
    require_shape("linear", "packed weight", w.packed, w.out_features, w.in_features / 8);
    require_weight("linear", "scales", w.scales);
    require_shape("linear", "scales", w.scales, w.out_features,
                  (w.in_features + w.group_size - 1) / w.group_size);
  } else {
    require_weight("linear", "weight", w.weight);
    require_shape("linear", "weight", w.weight, w.out_features, w.in_features);
  }
}

void check_sigmoid_gated_linear_args(const Tensor& out, const Tensor& x, const Tensor& gate,
                                     const LinearWeight& w) {
  check_elementwise_args("sigmoid_gated_linear", "x", "gate", x, x, gate);
  check_linear_args(out, x, w);
  if (out.overlaps(x) || out.overlaps(gate)) fail("sigmoid_gated_linear: out must not overlap x or gate");
}

void check_silu_gated_linear_args(const Tensor& out, const Tensor& gate_up, const Tensor& act,
                                  const LinearWeight& w) {
  require_activation("silu_gated_linear", "gate_up", gate_up);
  require_shape("silu_gated_linear", "gate_up", gate_up, gate_up.rows, 2 * w.in_features);
  require_shape("silu_gated_linear", "act", act, gate_up.rows, w.in_features);
  check_linear_args(out, act, w);
  if (act.overlaps(gate_up) || act.overlaps(out))
    fail("silu_gated_linear: act must not overlap gate_up or out");
  if (out.overlaps(gate_up)) fail("silu_gated_linear: out must not overlap gate_up");
}

void check_elementwise_args(std::string_view op, std::string_view a_name, std::string_view b_name,
                            const Tensor& out, const Tensor& a, const Tensor& b) {
  require_activation(op, a_name, a);
  require_activation(op, b_name, b);
  require_activation(op, "out", out);
  require_shape(op, b_name, b, a.rows, a.cols);
  require_shape(op, "out", out, a.rows, a.cols);
}

void check_split_query_gate_args(const Tensor& query, const Tensor& gate, const Tensor& qg, int head_dim) {
  require_activation("split_query_gate", "qg", qg);
  require_activation("split_query_gate", "query", query);
  require_activation("split_query_gate", "gate", gate);
  if (head_dim <= 0 || qg.cols % (2 * head_dim) != 0)
    fail("split_query_gate: qg has {} columns, not a multiple of 2 * head_dim = {}", qg.cols, 2 * head_dim);
  require_shape("split_query_gate", "query", query, qg.rows, qg.cols / 2);
  require_shape("split_query_gate", "gate", gate, qg.rows, qg.cols / 2);
}

void check_rope_args(const Tensor& x, const Tensor& positions, int head_dim, int rotary_dim) {
  require_activation("rope", "x", x);
  require_indices("rope", "positions", positions, x.rows);
  if (head_dim <= 0 || x.cols % head_dim != 0)
    fail("rope: x has {} columns, not a multiple of head_dim {}", x.cols, head_dim);
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim)
    fail("rope: rotary_dim {} must be even and in (0, head_dim = {}]", rotary_dim, head_dim);
}

void check_rope_theta(double theta) {
  if (!(theta > 0.0)) fail("rope: theta must be positive, got {}", theta);
}

void check_kv_store_args(const Tensor& cache, const Tensor& x, const Tensor& positions) {
  require_activation("kv_store", "cache", cache);
  require_activation("kv_store", "x", x);
  require_indices("kv_store", "positions", positions, x.rows);
  if (x.cols != cache.cols) fail("kv_store: x has {} columns but the cache has {}", x.cols, cache.cols);
}

void check_attention_prologue_args(const Tensor& query, const Tensor& gate, const Tensor& qkv,
                                   const Tensor& q_norm, const Tensor& k_norm, const Tensor& k_cache,
                                   const Tensor& v_cache, const Tensor& positions,
                                   const AttentionPrologueShape& shape) {
  constexpr std::string_view op = "attention_prologue";
  if (shape.num_heads < 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.num_heads % shape.num_kv_heads != 0)
    fail(
        "{}: {} query heads, {} KV heads of {} dims: expected positive KV heads and dims, query heads a "
        "multiple of KV heads (0: keys and values only)",
        op, shape.num_heads, shape.num_kv_heads, shape.head_dim);
  const int64_t q_cols = int64_t(shape.num_heads) * shape.head_dim;
  const int64_t kv_cols = int64_t(shape.num_kv_heads) * shape.head_dim;
  const bool gated = !gate.empty();  // else qkv has no gate columns
  require_activation(op, "qkv", qkv);
  require_shape(op, "qkv", qkv, qkv.rows, (gated ? 2 : 1) * q_cols + 2 * kv_cols);
  if (shape.num_heads == 0) {
    if (!query.empty() || gated || !q_norm.empty())
      fail("{}: without query heads, query, gate and q_norm must be empty", op);
  } else {
    require_activation(op, "query", query);
    require_shape(op, "query", query, qkv.rows, q_cols);
    if (gated) {
      require_activation(op, "gate", gate);
      require_shape(op, "gate", gate, qkv.rows, q_cols);
      if (query.overlaps(qkv) || gate.overlaps(qkv) || query.overlaps(gate))
        fail("{}: query, gate and qkv must not overlap", op);
    } else if (query.overlaps(qkv) && !(query.data == qkv.data && query.stride == qkv.stride)) {
      fail("{}: query overlaps qkv other than as its query columns", op);
    }
    require_weight(op, "q_norm", q_norm);
    require_shape(op, "q_norm", q_norm, 1, shape.head_dim);
    if (q_norm.dtype != k_norm.dtype) fail("{}: q_norm and k_norm have different dtypes", op);
  }
  require_activation(op, "k_cache", k_cache);
  require_shape(op, "k_cache", k_cache, k_cache.rows, kv_cols);
  require_activation(op, "v_cache", v_cache);
  require_shape(op, "v_cache", v_cache, k_cache.rows, kv_cols);
  require_weight(op, "k_norm", k_norm);
  require_shape(op, "k_norm", k_norm, 1, shape.head_dim);
  require_indices(op, "positions", positions, qkv.rows);
  if (shape.rotary_dim <= 0 || shape.rotary_dim % 2 != 0 || shape.rotary_dim > shape.head_dim)
    fail("{}: rotary_dim {} must be even and in (0, head_dim = {}]", op, shape.rotary_dim, shape.head_dim);
  if (!(shape.rope_theta > 0.0)) fail("{}: rope_theta must be positive, got {}", op, shape.rope_theta);
}

void check_attention_prologues_args(std::span<const AttentionPrologueLayer> layers, const Tensor& positions,
                                    const AttentionPrologueShape& shape) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const AttentionPrologueLayer& l = layers[i];
    try {
      check_attention_prologue_args(l.query, l.gate, l.qkv, l.q_norm, l.k_norm, l.k_cache, l.v_cache,
                                    positions, shape);
    } catch (const Error& e) {
      fail("attention_prologues: layers[{}]: {}", i, e.what());
    }
    if (l.qkv.rows != layers.front().qkv.rows)
      fail("attention_prologues: layers[{}] has {} rows, layers[0] {}", i, l.qkv.rows,
           layers.front().qkv.rows);
  }
  for (size_t i = 0; i < layers.size(); ++i)
    for (size_t j = 0; j < layers.size(); ++j) {
      if (i == j) continue;
      const AttentionPrologueLayer &a = layers[i], &b = layers[j];
      for (const Tensor* out : {&a.query, &a.gate, &a.k_cache, &a.v_cache})
        for (const Tensor* other : {&b.query, &b.gate, &b.qkv, &b.q_norm, &b.k_norm, &b.k_cache, &b.v_cache})
          if (!out->empty() && out->overlaps(*other))
            fail(
                "attention_prologues: layers[{}] and layers[{}] share memory (each layer's outputs need "
                "their own)",
                i, j);
    }
}

namespace {

void check_attention_operands(std::string_view op, const Tensor& out, const Tensor& q, const Tensor& k_cache,
                              const Tensor& v_cache, const AttentionShape& shape) {
  require_activation(op, "q", q);
  require_activation(op, "out", out);
  require_activation(op, "k_cache", k_cache);
  require_activation(op, "v_cache", v_cache);
  if (shape.num_heads <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.num_heads % shape.num_kv_heads != 0)
    fail("{}: num_heads {} must be a positive multiple of num_kv_heads {} (head_dim {})", op, shape.num_heads,
         shape.num_kv_heads, shape.head_dim);
}

void check_attention_widths(std::string_view op, const Tensor& out, const Tensor& q, const Tensor& k_cache,
                            const Tensor& v_cache, const AttentionShape& shape) {
  const int64_t q_cols = int64_t{shape.num_heads} * shape.head_dim;
  const int64_t kv_cols = int64_t{shape.num_kv_heads} * shape.head_dim;
  require_shape(op, "q", q, q.rows, q_cols);
  require_shape(op, "out", out, q.rows, q_cols);
  require_shape(op, "k_cache", k_cache, k_cache.rows, kv_cols);
  require_shape(op, "v_cache", v_cache, k_cache.rows, kv_cols);
}

}  // namespace

void check_attention_operands(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                              const Tensor& v_cache, const AttentionShape& shape) {
  check_attention_operands("attention", out, q, k_cache, v_cache, shape);
}

void check_attention_widths(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                            const Tensor& positions, const AttentionShape& shape) {
  check_attention_widths("attention", out, q, k_cache, v_cache, shape);
  require_indices("attention", "positions", positions, q.rows);
}

void check_windowed_attention_args(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                   const Tensor& v_cache, const Tensor& key_begin, const Tensor& key_end,
                                   const AttentionShape& shape) {
  constexpr std::string_view op = "windowed_attention";
  check_attention_operands(op, out, q, k_cache, v_cache, shape);
  check_attention_widths(op, out, q, k_cache, v_cache, shape);
  require_indices(op, "key_begin", key_begin, q.rows);
  require_indices(op, "key_end", key_end, q.rows);
}

void check_conv1d_operands(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight) {
  require_activation("conv1d_silu", "x", x);
  require_activation("conv1d_silu", "out", out);
  require_activation("conv1d_silu", "state", state);
  require_weight("conv1d_silu", "weight", weight);
}

void check_conv1d_shapes(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight) {
  require_shape("conv1d_silu", "weight", weight, x.cols, weight.cols);
  require_shape("conv1d_silu", "state", state, x.cols, weight.cols - 1);
  require_shape("conv1d_silu", "out", out, x.rows, x.cols);
}

void check_gdn_gates_args(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                          const Tensor& a_log, const Tensor& dt_bias) {
  require_activation("gdn_gates", "b", b);
  require_activation("gdn_gates", "a", a);
  require_activation("gdn_gates", "beta", beta);
  require_activation("gdn_gates", "g", g);
  require_weight("gdn_gates", "a_log", a_log);
  require_weight("gdn_gates", "dt_bias", dt_bias);
  const int64_t heads = b.cols;
  require_shape("gdn_gates", "a", a, b.rows, heads);
  require_shape("gdn_gates", "beta", beta, b.rows, heads);
  require_shape("gdn_gates", "g", g, b.rows, heads);
  require_shape("gdn_gates", "a_log", a_log, 1, heads);
  require_shape("gdn_gates", "dt_bias", dt_bias, 1, heads);
}

void check_gdn_gates_linear_args(const Tensor& beta, const Tensor& g, const Tensor& x,
                                 const LinearWeight& w_b, const LinearWeight& w_a, const Tensor& a_log,
                                 const Tensor& dt_bias) {
  check_linear_args(beta, x, w_b);
  check_linear_args(g, x, w_a);
  check_gdn_gates_args(beta, g, beta, g, a_log, dt_bias);
}

void check_gdn_shape(const GdnShape& shape) {
  const auto& [nk, nv, dk, dv] = shape;
  if (nk <= 0 || nv <= 0 || dk <= 0 || dv <= 0 || nv % nk != 0)
    fail(
        "gated_delta_rule: bad GdnShape (num_key_heads {}, num_value_heads {}, key_head_dim {}, "
        "value_head_dim "
        "{}): dims must be positive and num_value_heads a multiple of num_key_heads",
        nk, nv, dk, dv);
}

namespace {

using NamedTensor = std::pair<std::string_view, const Tensor*>;

// Tensors a kernel writes while it reads others (CUDA does both at once): no two outputs share bytes, nor an
// output with one of `others` (named others_label + name).
void require_apart(std::string_view op, std::span<const NamedTensor> outputs,
                   std::span<const NamedTensor> others, std::string_view others_label) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (size_t j = i + 1; j < outputs.size(); ++j)
      if (outputs[i].second->overlaps(*outputs[j].second))
        fail("{}: {} and {} overlap (each output needs its own memory)", op, outputs[i].first,
             outputs[j].first);
    for (const auto& [name, other] : others)
      if (outputs[i].second->overlaps(*other))
        fail("{}: {} overlaps {}{} (the outputs need their own memory)", op, outputs[i].first, others_label,
             name);
  }
}

// A replay record's tensors: F32 rows of the layer's keys, decays and value columns, `tokens` of each.
void check_gdn_replay_rows(std::string_view op, std::string_view name, const GdnReplayRows& replay,
                           const GdnShape& shape, int64_t tokens) {
  const auto& [nk, nv, dk, dv] = shape;
  const auto arg = [name](std::string_view field) { return fmt::format("{}.{}", name, field); };
  require_activation(op, arg("keys"), replay.keys);
  require_activation(op, arg("decays"), replay.decays);
  require_activation(op, arg("deltas"), replay.deltas);
  require_shape(op, arg("keys"), replay.keys, tokens, int64_t{nk} * dk);
  require_shape(op, arg("decays"), replay.decays, tokens, nv);
  require_shape(op, arg("deltas"), replay.deltas, tokens, int64_t{nv} * dv);
}

}  // namespace

void check_gated_delta_rule_args(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                                 const Tensor& state, const GdnShape& shape, const GdnStateUpdate& update) {
  constexpr std::string_view op = "gated_delta_rule";
  const auto& [nk, nv, dk, dv] = shape;
  require_activation(op, "qkv", qkv);
  require_activation(op, "out", out);
  require_activation(op, "beta", beta);
  require_activation(op, "g", g);
  require_activation(op, "state", state);
  const int64_t tokens = qkv.rows;
  require_shape(op, "qkv", qkv, tokens, 2 * int64_t{nk} * dk + int64_t{nv} * dv);
  require_shape(op, "out", out, tokens, int64_t{nv} * dv);
  require_shape(op, "beta", beta, tokens, nv);
  require_shape(op, "g", g, tokens, nv);
  require_shape(op, "state", state, int64_t{nv} * dk, dv);
  if (update.replay.empty()) return;
  if (tokens > kGdnReplayMaxRows)
    fail("{}: a replay record of {} rows, expected at most {} (a verify block)", op, tokens,
         kGdnReplayMaxRows);
  check_gdn_replay_rows(op, "replay", update.replay, shape, tokens);
  const NamedTensor record[] = {{"replay.keys", &update.replay.keys},
                                {"replay.decays", &update.replay.decays},
                                {"replay.deltas", &update.replay.deltas}};
  const NamedTensor operands[] = {
      {"out", &out}, {"state", &state}, {"qkv", &qkv}, {"beta", &beta}, {"g", &g}};
  require_apart(op, record, operands, "");
}

void check_gdn_mixer_args(const Tensor& out, const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                          const Tensor& core, const Tensor& qkvz, const Tensor& x, const Tensor& conv_state,
                          const Tensor& recurrent_state, const GdnMixerWeights& w, const GdnShape& shape,
                          const GdnStateUpdate& update) {
  constexpr std::string_view op = "gdn_mixer";
  check_gdn_shape(shape);
  const auto& [nk, nv, dk, dv] = shape;
  const int64_t channels = 2 * int64_t{nk} * dk + int64_t{nv} * dv;
  require_activation(op, "qkvz", qkvz);
  require_shape(op, "qkvz", qkvz, qkvz.rows, channels + int64_t{nv} * dv);
  const Tensor mixed = qkvz.cols_view(0, channels), z = qkvz.cols_view(channels, int64_t{nv} * dv);
  check_conv1d_operands(conv_out, mixed, conv_state, w.conv_weight);
  check_conv1d_shapes(conv_out, mixed, conv_state, w.conv_weight);
  check_gdn_gates_linear_args(beta, g, x, w.w_b, w.w_a, w.a_log, w.dt_bias);
  check_gated_delta_rule_args(core, conv_out, beta, g, recurrent_state, shape, update);
  check_norm_args("gdn_mixer", out, core, w.norm_weight);
  check_norm_gate_args(z, core);
  // Its kernels write every output while they read the inputs (CUDA), so none may share bytes.
  const GdnReplayRows& replay = update.replay;
  std::vector<NamedTensor> outputs = {
      {"out", &out}, {"conv_out", &conv_out}, {"beta", &beta}, {"g", &g}, {"core", &core}};
  if (!replay.empty())
    outputs.insert(outputs.end(), {{"replay.keys", &replay.keys},
                                   {"replay.decays", &replay.decays},
                                   {"replay.deltas", &replay.deltas}});
  const NamedTensor inputs[] = {{"qkvz", &qkvz}, {"x", &x}, {"conv_state", &conv_state}};
  require_apart(op, outputs, inputs, "the input ");
}

void check_gdn_mixer_linear_args(const LinearProjection& projection, const Tensor& gated,
                                 const Tensor& conv_out, const Tensor& beta, const Tensor& g,
                                 const Tensor& core, const Tensor& qkvz, const Tensor& x,
                                 const Tensor& conv_state, const Tensor& recurrent_state,
                                 const GdnMixerWeights& w, const GdnShape& shape,
                                 const GdnStateUpdate& update) {
  check_gdn_mixer_args(gated, conv_out, beta, g, core, qkvz, x, conv_state, recurrent_state, w, shape,
                       update);
  check_linear_args(projection.out, gated, projection.w);
  const std::pair<std::string_view, const Tensor*> mixer_tensors[] = {
      {"gated", &gated},
      {"conv_out", &conv_out},
      {"beta", &beta},
      {"g", &g},
      {"core", &core},
      {"qkvz", &qkvz},
      {"x", &x},
      {"conv_state", &conv_state},
      {"recurrent_state", &recurrent_state},
  };
  for (const auto& [name, tensor] : mixer_tensors)
    if (projection.out.overlaps(*tensor)) fail("gdn_mixer_linear: projection.out overlaps {}", name);
}

void check_gdn_commit_args(std::span<const GdnCommitLayer> layers, const GdnShape& shape,
                           const Tensor& rows) {
  constexpr std::string_view op = "gdn_commit";
  check_gdn_shape(shape);
  if (!rows.empty()) require_indices(op, "rows", rows, 1);
  const auto& [nk, nv, dk, dv] = shape;
  const int64_t tokens = layers.empty() ? 0 : layers.front().conv_input.rows;
  if (tokens > kGdnReplayMaxRows)
    fail("{}: layers of {} rows, expected at most {} (a verify block)", op, tokens, kGdnReplayMaxRows);
  for (size_t i = 0; i < layers.size(); ++i) {
    const GdnCommitLayer& layer = layers[i];
    const auto arg = [i](std::string_view name) { return fmt::format("layers[{}].{}", i, name); };
    require_activation(op, arg("conv_state"), layer.conv_state);
    require_activation(op, arg("conv_input"), layer.conv_input);
    require_activation(op, arg("recurrent_state"), layer.recurrent_state);
    require_shape(op, arg("conv_input"), layer.conv_input, tokens, layer.conv_state.rows);
    require_shape(op, arg("recurrent_state"), layer.recurrent_state, int64_t{nv} * dk, dv);
    check_gdn_replay_rows(op, arg("replay"), layer.replay, shape, tokens);
  }
}

void check_argmax_args(const Tensor& out_ids, const Tensor& logits) {
  require_activation("argmax", "logits", logits);
  if (logits.cols < 1 || logits.cols > std::numeric_limits<int32_t>::max())
    fail("argmax: logits has {} columns, expected 1 to {} (ids are I32)", logits.cols,
         std::numeric_limits<int32_t>::max());
  require_indices("argmax", "out_ids", out_ids, logits.rows);
}

}  // namespace qspec
