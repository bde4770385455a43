// Qwen3.5 text model (Gated DeltaNet + gated full attention), written once against backend/ops.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "io/model_config.h"

namespace qspec {

class TensorStore;

struct Qwen35Layer {
  LayerType type = LayerType::LinearAttention;
  Tensor input_norm;
  Tensor post_attention_norm;
  LinearWeight mlp_gate, mlp_up, mlp_down;

  // Gated DeltaNet (linear attention)
  LinearWeight in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
  Tensor conv_weight;  // [conv_dim, kernel]
  Tensor dt_bias;      // [1, nv]
  Tensor a_log;        // [1, nv]
  Tensor gdn_norm;     // [1, dv]

  // gated full attention
  LinearWeight q_proj, k_proj, v_proj, o_proj;
  Tensor q_norm, k_norm;  // [1, head_dim]
};

struct Qwen35Weights {
  Tensor embed;  // [V, H]
  Tensor final_norm;
  LinearWeight lm_head;  // the embedding when tied
  std::vector<Qwen35Layer> layers;
};

// Everything a sequence carries between steps: per attention layer the KV cache, per GDN layer the conv and
// recurrent states, and the number of tokens consumed.
struct Qwen35State {
  struct Layer {
    std::unique_ptr<Buffer> k_cache, v_cache;             // [max_context, nkv * head_dim]
    std::unique_ptr<Buffer> conv_state, recurrent_state;  // [conv_dim, kernel-1], [nv * dk, dv]
  };
  std::vector<Layer> layers;
  int max_context = 0;
  int n_past = 0;
  uint64_t id = 0;  // distinguishes states in the model's step graphs, which are recorded on their buffers
};

struct ForwardOptions {
  bool all_logits = false;         // logits of every row (verify, oracle tests), else of the last row only
  bool logits = true;              // false: skip the head (e.g. prefill chunks before the last)
  std::vector<int> hidden_layers;  // residual stream after these layers, for every row
};

// Backend tensors owned by the model's workspace, valid until the next forward.
struct ForwardOutput {
  Tensor logits;               // [rows, V]
  std::vector<Tensor> hidden;  // one [T, H] per requested layer, in the order requested
};

class Qwen35Model {
 public:
  Qwen35Model(Qwen35Config config, const TensorStore& store, Backend& backend);
  ~Qwen35Model();

  const Qwen35Config& config() const { return config_; }
  Backend& backend() const { return backend_; }

  std::unique_ptr<Qwen35State> new_state(int max_context);
  void reset(Qwen35State& state) const;

  // Steps of a shape seen before replay a recorded step graph on backends that can record them (default on).
  void set_step_graphs(bool enabled) { step_graphs_ = enabled; }

  // Feeds `tokens` at positions state.n_past.. and advances the state.
  ForwardOutput forward(Qwen35State& state, std::span<const int32_t> tokens, const ForwardOptions& options);

 private:
  struct Workspace;
  // Grows the activation buffers; true when any was reallocated (recorded step graphs are then stale).
  bool ensure_workspace(int64_t tokens, int64_t logit_rows, size_t hidden_count);
  // Every op of one step, from the ids and positions already in the workspace.
  void run_step(Qwen35State& state, int64_t T, int64_t logit_rows, const std::vector<int>& hidden_layers);
  void gated_delta_net(const Qwen35Layer& layer, Qwen35State::Layer& state, const Tensor& x,
                       const Tensor& out);
  void gated_attention(const Qwen35Layer& layer, Qwen35State::Layer& state, const Tensor& x,
                       const Tensor& out);
  void mlp(const Qwen35Layer& layer, const Tensor& x, const Tensor& out);

  Qwen35Config config_;
  Backend& backend_;
  Qwen35Weights weights_;
  std::unique_ptr<Workspace> ws_;

  // A step's shape and state; a null graph marks a shape that ran once and is recorded on its next step.
  struct GraphKey {
    uint64_t state_id;
    int64_t tokens, logit_rows;
    std::vector<int> hidden_layers;
    auto operator<=>(const GraphKey&) const = default;
  };
  static constexpr size_t kMaxStepGraphs = 64;
  bool step_graphs_ = true;
  uint64_t next_state_id_ = 1;
  std::map<GraphKey, std::unique_ptr<StepGraph>> graphs_;
};

}  // namespace qspec
