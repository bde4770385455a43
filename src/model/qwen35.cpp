#include "model/qwen35.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/progress.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/weight_upload.h"

namespace qspec {

namespace {

LinearWeight linear_weight(Backend& backend, const Qwen35Config& config, const TensorStore& store,
                           const std::string& module, int64_t out_features, int64_t in_features,
                           std::vector<std::unique_ptr<Buffer>>& storage) {
  return upload_linear(backend, find_linear(config, store, module, out_features, in_features), out_features,
                       in_features, storage);
}

// Modules of one layer that read the same input, as one StackedLinear.
StackedLinear stacked_weight(Backend& backend, const Qwen35Config& config, const TensorStore& store,
                             const std::vector<std::pair<std::string, int64_t>>& modules, int64_t in_features,
                             std::vector<std::unique_ptr<Buffer>>& storage) {
  std::vector<LinearTensors> found;
  std::vector<int64_t> out_features;
  for (const auto& [module, n] : modules) {
    found.push_back(find_linear(config, store, module, n, in_features));
    out_features.push_back(n);
  }
  return upload_stacked_linear(backend, found, out_features, in_features, storage);
}

Qwen35Weights load_weights(const Qwen35Config& c, const TensorStore& store, Backend& backend) {
  CheckpointReport report = check_checkpoint(c, store);
  if (!report.ok()) fail("{}: checkpoint does not match its config:\n{}", store.source(), report.problems());

  const int64_t H = c.hidden_size, FF = c.intermediate_size, V = c.vocab_size;
  Qwen35Weights w;
  const TensorView& embed = store.get(model_tensor(c, "embed_tokens.weight"));
  w.embed = backend.upload_weight(embed, V, H);
  w.final_norm = upload_vector(backend, store, model_tensor(c, "norm.weight"), H);
  if (c.tie_word_embeddings) {
    w.lm_head.out_features = V;
    w.lm_head.in_features = H;
    w.lm_head.weight = w.embed;
  } else {
    w.lm_head = linear_weight(backend, c, store, std::string(kLmHeadModule), V, H, w.stacked_storage);
  }

  const int64_t conv_dim = c.conv_dim(), value_dim = c.linear_value_dim(), nv = c.linear_num_value_heads;
  const int64_t q_dim = int64_t(c.num_heads) * c.head_dim, kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
  Progress progress("loading weights", c.num_layers, "layers");
  for (int i = 0; i < c.num_layers; ++i) {
    auto name = [&](std::string_view suffix) { return layer_module(c, i, suffix); };
    Qwen35Layer layer;
    layer.type = c.layer_types[size_t(i)];
    layer.input_norm = upload_vector(backend, store, name("input_layernorm.weight"), H);
    layer.post_attention_norm = upload_vector(backend, store, name("post_attention_layernorm.weight"), H);
    auto stacked = [&](const std::vector<std::pair<std::string, int64_t>>& modules) {
      return stacked_weight(backend, c, store, modules, H, w.stacked_storage);
    };
    layer.mlp_gate_up = stacked({{name("mlp.gate_proj"), FF}, {name("mlp.up_proj"), FF}});
    layer.mlp_down = linear_weight(backend, c, store, name("mlp.down_proj"), H, FF, w.stacked_storage);
    if (layer.type == LayerType::LinearAttention) {
      layer.in_proj_qkvz =
          stacked({{name("linear_attn.in_proj_qkv"), conv_dim}, {name("linear_attn.in_proj_z"), value_dim}});
      layer.in_proj_b =
          linear_weight(backend, c, store, name("linear_attn.in_proj_b"), nv, H, w.stacked_storage);
      layer.in_proj_a =
          linear_weight(backend, c, store, name("linear_attn.in_proj_a"), nv, H, w.stacked_storage);
      layer.out_proj =
          linear_weight(backend, c, store, name("linear_attn.out_proj"), H, value_dim, w.stacked_storage);
      layer.conv_weight =
          backend.upload_weight(store.get(name("linear_attn.conv1d.weight")), conv_dim, c.conv_kernel);
      layer.dt_bias = upload_vector(backend, store, name("linear_attn.dt_bias"), nv);
      layer.a_log = upload_vector(backend, store, name("linear_attn.A_log"), nv);
      layer.gdn_norm =
          upload_vector(backend, store, name("linear_attn.norm.weight"), c.linear_value_head_dim);
    } else {
      layer.qkv_proj = stacked({{name("self_attn.q_proj"), 2 * q_dim},
                                {name("self_attn.k_proj"), kv_dim},
                                {name("self_attn.v_proj"), kv_dim}});
      layer.o_proj = linear_weight(backend, c, store, name("self_attn.o_proj"), H, q_dim, w.stacked_storage);
      layer.q_norm = upload_vector(backend, store, name("self_attn.q_norm.weight"), c.head_dim);
      layer.k_norm = upload_vector(backend, store, name("self_attn.k_norm.weight"), c.head_dim);
    }
    w.layers.push_back(std::move(layer));
    progress.advance(1);
  }
  progress.finish();
  return w;
}

// The first `rows` rows of a workspace buffer: ops of a T-token step use views of buffers sized for the
// largest step.
Tensor first_rows(const std::unique_ptr<Buffer>& buffer, int64_t rows) {
  return buffer->tensor().rows_view(0, rows);
}

GdnShape gdn_shape(const Qwen35Config& c) {
  return {c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim};
}

}  // namespace

// Activation buffers sized for the largest step seen so far; ops use views of the first T rows.
struct Qwen35Model::Workspace {
  int64_t capacity = 0;
  int64_t logit_capacity = 0;
  std::unique_ptr<Buffer> ids, positions;
  std::unique_ptr<Buffer> x, normed, mixer_out, mlp_out;
  std::unique_ptr<Buffer> mlp_gate_up, mlp_act;
  std::unique_ptr<Buffer> gdn_qkvz, gdn_conv, gdn_beta, gdn_g, gdn_core, gdn_gated;
  std::unique_ptr<Buffer> attn_qkv, attn_q, attn_gate, attn_out;
  std::unique_ptr<Buffer> logits;
  // The requested layers' residual streams side by side ([capacity, hidden_count * H]), so that the
  // drafter reads them as its concatenated features without copies.
  std::unique_ptr<Buffer> hidden;
  size_t hidden_count = 0;
};

Qwen35Model::Qwen35Model(Qwen35Config config, const TensorStore& store, Backend& backend)
    : config_(std::move(config)),
      backend_(backend),
      weights_(load_weights(config_, store, backend)),
      ws_(std::make_unique<Workspace>()),
      graphs_(backend, kMaxStepGraphs) {}

Qwen35Model::~Qwen35Model() = default;

int64_t Qwen35Model::dequantized_bytes() const {
  int64_t bytes = 0;
  auto add = [&](const LinearWeight& w) {
    if (!w.dequantized.empty()) bytes += w.dequantized.element_bytes();
  };
  auto add_stacked = [&](const StackedLinear& s) { std::for_each(s.parts.begin(), s.parts.end(), add); };
  add(weights_.lm_head);
  for (const Qwen35Layer& layer : weights_.layers) {
    add_stacked(layer.mlp_gate_up);
    add_stacked(layer.in_proj_qkvz);
    add_stacked(layer.qkv_proj);
    for (const LinearWeight* w :
         {&layer.mlp_down, &layer.in_proj_b, &layer.in_proj_a, &layer.out_proj, &layer.o_proj})
      add(*w);
  }
  return bytes;
}

std::unique_ptr<Qwen35State> Qwen35Model::new_state(int max_context) {
  const Qwen35Config& c = config_;
  auto state = std::make_unique<Qwen35State>();
  state->id = next_state_id_++;
  state->max_context = max_context;
  const int64_t kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
  for (const Qwen35Layer& layer : weights_.layers) {
    Qwen35State::Layer s;
    if (layer.type == LayerType::FullAttention) {
      s.k_cache = backend_.alloc(DType::F32, max_context, kv_dim);
      s.v_cache = backend_.alloc(DType::F32, max_context, kv_dim);
    } else {
      s.conv_state = backend_.alloc(DType::F32, c.conv_dim(), c.conv_kernel - 1);
      s.recurrent_state = backend_.alloc(
          DType::F32, int64_t(c.linear_num_value_heads) * c.linear_key_head_dim, c.linear_value_head_dim);
    }
    state->layers.push_back(std::move(s));
  }
  state->commit_rows = backend_.alloc(DType::I32, 1, 1);
  reset(*state);
  return state;
}

void Qwen35Model::reset(Qwen35State& state) const {
  backend_.join_side();  // after a commit still running
  for (auto& s : state.layers) {
    if (s.conv_state) backend_.fill_zero(s.conv_state->tensor());
    if (s.recurrent_state) backend_.fill_zero(s.recurrent_state->tensor());
  }
  state.n_past = 0;
  state.pending_rows = 0;
}

bool Qwen35Model::ensure_pending(Qwen35State& state, int rows) {
  if (rows <= state.pending_capacity) return false;
  const Qwen35Config& c = config_;
  for (Qwen35State::Layer& s : state.layers) {
    if (!s.conv_state) continue;
    s.pending_conv_in = backend_.alloc(DType::F32, rows, c.conv_dim() + c.linear_value_dim());
    s.pending_keys =
        backend_.alloc(DType::F32, rows, int64_t{c.linear_num_key_heads} * c.linear_key_head_dim);
    s.pending_decays = backend_.alloc(DType::F32, rows, c.linear_num_value_heads);
    s.pending_deltas = backend_.alloc(DType::F32, rows, c.linear_value_dim());
  }
  state.pending_capacity = rows;
  return true;
}

bool Qwen35Model::ensure_workspace(int64_t tokens, int64_t logit_rows, size_t hidden_count) {
  Workspace& ws = *ws_;
  const Qwen35Config& c = config_;
  auto make = [&](std::unique_ptr<Buffer>& b, int64_t rows, int64_t cols, DType t = DType::F32) {
    b = backend_.alloc(t, rows, cols);
  };
  bool reallocated = false;
  if (tokens > ws.capacity) {
    reallocated = true;
    const int64_t T = tokens, H = c.hidden_size, FF = c.intermediate_size;
    const int64_t q_dim = int64_t(c.num_heads) * c.head_dim, kv_dim = int64_t(c.num_kv_heads) * c.head_dim;
    const int64_t nv = c.linear_num_value_heads, vd = c.linear_value_dim();
    make(ws.ids, T, 1, DType::I32);
    make(ws.positions, T, 1, DType::I32);
    make(ws.x, T, H);
    make(ws.normed, T, H);
    make(ws.mixer_out, T, H);
    make(ws.mlp_out, T, H);
    make(ws.mlp_gate_up, T, 2 * FF);
    make(ws.mlp_act, T, FF);
    if (c.conv_dim() > 0) {
      make(ws.gdn_qkvz, T, c.conv_dim() + vd);
      make(ws.gdn_conv, T, c.conv_dim());
      make(ws.gdn_beta, T, nv);
      make(ws.gdn_g, T, nv);
      make(ws.gdn_core, T, vd);
      make(ws.gdn_gated, T, vd);
    }
    make(ws.attn_qkv, T, 2 * q_dim + 2 * kv_dim);
    make(ws.attn_q, T, q_dim);
    make(ws.attn_gate, T, q_dim);
    make(ws.attn_out, T, q_dim);
    ws.capacity = T;
  }
  if (hidden_count > ws.hidden_count || (reallocated && ws.hidden_count > 0)) {
    ws.hidden_count = std::max(ws.hidden_count, hidden_count);
    make(ws.hidden, ws.capacity, int64_t(ws.hidden_count) * c.hidden_size);
    reallocated = true;
  }
  if (logit_rows > ws.logit_capacity) {
    make(ws.logits, logit_rows, c.vocab_size);
    ws.logit_capacity = logit_rows;
    reallocated = true;
  }
  return reallocated;
}

Tensor Qwen35Model::hidden_rows(size_t index, int64_t T) const {
  const int64_t H = config_.hidden_size;
  return first_rows(ws_->hidden, T).cols_view(int64_t(index) * H, H);
}

void Qwen35Model::norm_linear(const SublayerInput& in, const Tensor& norm_weight, const Tensor& out,
                              const StackedLinear& w, NormedRows rows) {
  backend_.add_rmsnorm_linear(projections(out, w), in.normed, rows, in.x, in.delta, norm_weight,
                              config_.rms_norm_eps, true);
}

void Qwen35Model::mlp(const Qwen35Layer& layer, const SublayerInput& in, const Tensor& out) {
  const int64_t T = in.x.rows;
  const Tensor gate_up = first_rows(ws_->mlp_gate_up, T);
  norm_linear(in, layer.post_attention_norm, gate_up, layer.mlp_gate_up, NormedRows::Scratch);
  backend_.silu_gated_linear(out, gate_up, first_rows(ws_->mlp_act, T), layer.mlp_down);
}

void Qwen35Model::gated_delta_net(const Qwen35Layer& layer, Qwen35State::Layer& state,
                                  const SublayerInput& in, const Tensor& out, bool advance) {
  const Qwen35Config& c = config_;
  const int64_t T = in.x.rows;
  Workspace& ws = *ws_;
  auto view = [T](const std::unique_ptr<Buffer>& b) { return first_rows(b, T); };
  // A verify step keeps the conv input and the recurrence's record for commit's replay.
  Tensor qkvz = view(advance ? ws.gdn_qkvz : state.pending_conv_in);
  Tensor conv = view(ws.gdn_conv), beta = view(ws.gdn_beta), g = view(ws.gdn_g);
  Tensor core = view(ws.gdn_core), gated = view(ws.gdn_gated);
  const GdnStateUpdate update =
      advance ? GdnStateUpdate(true)
              : GdnStateUpdate(GdnReplayRows{view(state.pending_keys), view(state.pending_decays),
                                             view(state.pending_deltas)});
  // The mixer reads the normed rows too (its gate projections).
  norm_linear(in, layer.input_norm, qkvz, layer.in_proj_qkvz, NormedRows::Kept);
  backend_.gdn_mixer_linear(
      {out, layer.out_proj}, gated, conv, beta, g, core, qkvz, in.normed, state.conv_state->tensor(),
      state.recurrent_state->tensor(),
      {layer.conv_weight, layer.in_proj_b, layer.in_proj_a, layer.a_log, layer.dt_bias, layer.gdn_norm},
      gdn_shape(c), c.rms_norm_eps, update);
}

void Qwen35Model::gated_attention(const Qwen35Layer& layer, Qwen35State::Layer& state,
                                  const SublayerInput& in, const Tensor& out) {
  const Qwen35Config& c = config_;
  const int64_t T = in.x.rows;
  Workspace& ws = *ws_;
  auto view = [T](const std::unique_ptr<Buffer>& b) { return first_rows(b, T); };
  Tensor qkv = view(ws.attn_qkv), q = view(ws.attn_q), gate = view(ws.attn_gate), o = view(ws.attn_out);
  Tensor positions = view(ws.positions);
  norm_linear(in, layer.input_norm, qkv, layer.qkv_proj, NormedRows::Scratch);
  const AttentionPrologueShape prologue{c.num_heads,  c.num_kv_heads, c.head_dim, c.rotary_dim,
                                        c.rope_theta, c.rms_norm_eps, true};
  backend_.attention_prologue(q, gate, qkv, layer.q_norm, layer.k_norm, state.k_cache->tensor(),
                              state.v_cache->tensor(), positions, prologue);
  AttentionShape shape{c.num_heads, c.num_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim))};
  backend_.attention(o, q, state.k_cache->tensor(), state.v_cache->tensor(), positions, shape);
  backend_.sigmoid_gated_linear(out, o, gate, layer.o_proj);
}

ForwardOutput Qwen35Model::forward(Qwen35State& state, std::span<const int32_t> tokens,
                                   const ForwardOptions& options) {
  const Qwen35Config& c = config_;
  const int64_t T = int64_t(tokens.size());
  if (T == 0) fail("forward: no tokens to feed");
  if (state.n_past + T > state.max_context)
    fail("forward: {} tokens after {} exceed the context of {} tokens", T, state.n_past, state.max_context);
  if (!options.advance && T > kGdnReplayMaxRows)
    fail("forward: a verify step (advance false) of {} tokens, expected at most {} (a DFlash block)", T,
         kGdnReplayMaxRows);
  for (int layer : options.hidden_layers)
    if (layer < 0 || layer >= c.num_layers)
      fail("forward: hidden layer {} out of range [0, {})", layer, c.num_layers);

  const int64_t logit_rows = !options.logits ? 0 : options.all_logits ? T : 1;
  backend_.join_side();  // a commit running beside (commit) writes the states this step reads
  bool reallocated = ensure_workspace(T, logit_rows, options.hidden_layers.size());
  if (!options.advance) reallocated = ensure_pending(state, int(T)) || reallocated;
  if (reallocated) graphs_.clear();
  Workspace& ws = *ws_;

  std::vector<int32_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[size_t(t)] = int32_t(state.n_past + t);
  backend_.write(first_rows(ws.ids, T), tokens.data());
  backend_.write(first_rows(ws.positions, T), positions.data());

  graphs_.run(
      {state.id, options.advance ? Step::Forward : Step::Verify, T, logit_rows, options.hidden_layers},
      [&] { run_step(state, T, logit_rows, options.hidden_layers, options.advance); });
  if (options.advance) {
    state.n_past += int(T);
    state.pending_rows = 0;
  } else {
    state.pending_rows = int(T);
  }

  ForwardOutput output;
  for (size_t h = 0; h < options.hidden_layers.size(); ++h) output.hidden.push_back(hidden_rows(h, T));
  if (logit_rows > 0) output.logits = first_rows(ws.logits, logit_rows);
  return output;
}

void Qwen35Model::commit(Qwen35State& state, int rows) {
  if (rows < 0 || rows > state.pending_rows)
    fail("commit: {} rows, but the pending verify step has {}", rows, state.pending_rows);
  if (rows > 0) {
    backend_.write(state.commit_rows->tensor(), &rows);
    // Only the states advance (the outputs are the verify step's again), every layer in one op, recorded
    // once for every count. It runs beside what follows (the drafter's context pass and draft step, which
    // read the verify's features, not the states) until the next forward or reset joins it.
    backend_.beside([&] {
      graphs_.run(GraphKey{state.id, Step::Commit, state.pending_capacity, 0, {}}, [&] {
        std::vector<GdnCommitLayer> layers;
        for (size_t i = 0; i < weights_.layers.size(); ++i)
          if (weights_.layers[i].type == LayerType::LinearAttention)
            layers.push_back(pending_replay(state.layers[i]));
        backend_.gdn_commit(layers, gdn_shape(config_), state.commit_rows->tensor());
      });
    });
  }
  state.n_past += rows;
  state.pending_rows = 0;
}

GdnCommitLayer Qwen35Model::pending_replay(Qwen35State::Layer& s) const {
  return {s.conv_state->tensor(),
          s.pending_conv_in->tensor().cols_view(0, config_.conv_dim()),
          s.recurrent_state->tensor(),
          {s.pending_keys->tensor(), s.pending_decays->tensor(), s.pending_deltas->tensor()}};
}

void Qwen35Model::run_step(Qwen35State& state, int64_t T, int64_t logit_rows,
                           const std::vector<int>& hidden_layers, bool advance) {
  const Qwen35Config& c = config_;
  Workspace& ws = *ws_;
  Tensor x = first_rows(ws.x, T);
  Tensor normed = first_rows(ws.normed, T);
  Tensor mixer_out = first_rows(ws.mixer_out, T);
  Tensor mlp_out = first_rows(ws.mlp_out, T);
  backend_.embed(x, weights_.embed, first_rows(ws.ids, T));
  // Each sublayer (mixer, MLP) begins with the residual add of the sublayer before it, fused with its own
  // norm and input projections (norm_linear); the final norm adds the last MLP's output.
  Tensor delta;  // nothing to add before the first layer
  for (int i = 0; i < c.num_layers; ++i) {
    const Qwen35Layer& layer = weights_.layers[size_t(i)];
    if (layer.type == LayerType::LinearAttention)
      gated_delta_net(layer, state.layers[size_t(i)], {x, delta, normed}, mixer_out, advance);
    else
      gated_attention(layer, state.layers[size_t(i)], {x, delta, normed}, mixer_out);
    mlp(layer, {x, mixer_out, normed}, mlp_out);
    delta = mlp_out;
    // The layer's output x + mlp_out, the sum the next norm makes in x (one fp32 add either way).
    for (size_t h = 0; h < hidden_layers.size(); ++h)
      if (hidden_layers[h] == i) backend_.add(hidden_rows(h, T), x, mlp_out);
  }
  backend_.add_rmsnorm(normed, x, mlp_out, weights_.final_norm, c.rms_norm_eps, true);
  if (logit_rows > 0)
    backend_.linear(first_rows(ws.logits, logit_rows), normed.rows_view(T - logit_rows, logit_rows),
                    weights_.lm_head);
}

}  // namespace qspec
