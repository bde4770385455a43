// Qwen3.5 text model (Gated DeltaNet + gated full attention), written once against backend/ops.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "io/model_config.h"
#include "model/step_graph_cache.h"
#include "model/weight_upload.h"

namespace qspec {

class TensorStore;

struct Qwen35Layer {
  LayerType type = LayerType::LinearAttention;
  Tensor input_norm;
  Tensor post_attention_norm;
  StackedLinear mlp_gate_up;  // [gate | up]
  LinearWeight mlp_down;

  // Gated DeltaNet (linear attention)
  StackedLinear in_proj_qkvz;         // [qkv (the conv input) | z]
  LinearWeight in_proj_b, in_proj_a;  // the gates' projections (gdn_mixer)
  LinearWeight out_proj;
  Tensor conv_weight;  // [conv_dim, kernel]
  Tensor dt_bias;      // [1, nv]
  Tensor a_log;        // [1, nv]
  Tensor gdn_norm;     // [1, dv]

  // gated full attention
  StackedLinear qkv_proj;  // [q_proj (query and gate per head) | k_proj | v_proj]
  LinearWeight o_proj;
  Tensor q_norm, k_norm;  // [1, head_dim]
};

struct Qwen35Weights {
  Tensor embed;  // [V, H]
  Tensor final_norm;
  LinearWeight lm_head;  // the embedding when tied
  std::vector<Qwen35Layer> layers;
  std::vector<std::unique_ptr<Buffer>> stacked_storage;  // the stacked linears' weights, the BF16 copies
};

// Everything a sequence carries between steps: per attention layer the KV cache, per GDN layer the conv and
// recurrent states, and the number of tokens consumed.
struct Qwen35State {
  struct Layer {
    std::unique_ptr<Buffer> k_cache, v_cache;             // [max_context, nkv * head_dim]
    std::unique_ptr<Buffer> conv_state, recurrent_state;  // [conv_dim, kernel-1], [nv * dk, dv]
    // What Qwen35Model::commit replays of the pending verify step's rows: the in_proj_qkvz output [rows,
    // conv_dim + value_dim] whose first conv_dim columns are the conv input, and the recurrence's record
    // (GdnReplayRows): keys [rows, nk * dk], decays [rows, nv], deltas [rows, nv * dv].
    std::unique_ptr<Buffer> pending_conv_in, pending_keys, pending_decays, pending_deltas;
  };
  std::vector<Layer> layers;
  int max_context = 0;
  int n_past = 0;
  int pending_rows = 0;                 // rows of the last forward with advance = false, not yet committed
  int pending_capacity = 0;             // rows the pending_* buffers hold
  std::unique_ptr<Buffer> commit_rows;  // I32 [1, 1]: the count commit replays (one recorded commit for all)
  uint64_t id = 0;  // distinguishes states in the model's step graphs, which are recorded on their buffers
};

struct ForwardOptions {
  bool all_logits = false;         // logits of every row (verify, oracle tests), else of the last row only
  bool logits = true;              // false: skip the head (e.g. prefill chunks before the last)
  std::vector<int> hidden_layers;  // residual stream after these layers, for every row
  // false: a verify step. Its rows see each other as usual, but the state stays where it was: n_past and the
  // GDN conv/recurrent states are unchanged (attention KV rows past n_past are written, and overwritten by
  // later steps); commit(state, rows) then advances over the first `rows` tokens.
  bool advance = true;
};

// Backend tensors owned by the model's workspace, valid until the next forward.
struct ForwardOutput {
  Tensor logits;  // [rows, V]
  // One [T, H] per requested layer, in the order requested: adjacent column views of one [T, count * H]
  // tensor (concatenated_columns gives it back).
  std::vector<Tensor> hidden;
};

class Qwen35Model {
 public:
  Qwen35Model(Qwen35Config config, const TensorStore& store, Backend& backend);
  ~Qwen35Model();

  const Qwen35Config& config() const { return config_; }
  // Device bytes of the W4A16 weights' BF16 copies (LinearWeight::dequantized), 0 where there are none.
  int64_t dequantized_bytes() const;
  Backend& backend() const { return backend_; }

  std::unique_ptr<Qwen35State> new_state(int max_context);
  void reset(Qwen35State& state) const;

  // Steps of a shape seen before replay a recorded step graph on backends that can record them (default on).
  void set_step_graphs(bool enabled) { graphs_.set_enabled(enabled); }

  // Feeds `tokens` at positions state.n_past.. and advances the state (unless options.advance is false).
  ForwardOutput forward(Qwen35State& state, std::span<const int32_t> tokens, const ForwardOptions& options);

  // Accepts the first `rows` tokens of the pending verify step (forward with advance = false): advances every
  // GDN layer's conv state and, by the replay of the verify step's record (GdnReplayRows), its recurrent
  // state from the untouched pre-verify state to what plain steps make, and advances n_past by `rows`. The
  // rest of the verify step is dropped. The replay runs beside the ops issued after it (Backend::beside)
  // until this model's next forward or reset, or a read of the backend: ops in between must not touch the
  // state.
  void commit(Qwen35State& state, int rows);

  const Qwen35Weights& weights() const { return weights_; }

 private:
  struct Workspace;
  enum class Step { Forward, Verify, Commit };
  // A step's shape and state.
  struct GraphKey {
    uint64_t state_id;
    Step step;
    int64_t tokens, logit_rows;  // Step::Commit: tokens is the pending buffers' capacity (the count is read
                                 // on the device)
    std::vector<int> hidden_layers;
    auto operator<=>(const GraphKey&) const = default;
  };
  // Grows the activation buffers; true when any was reallocated (recorded step graphs are then stale).
  bool ensure_workspace(int64_t tokens, int64_t logit_rows, size_t hidden_count);
  // Rows [0, T) of requested hidden layer `index` (ForwardOptions::hidden_layers order): a column view of
  // the workspace's side-by-side hidden buffer.
  Tensor hidden_rows(size_t index, int64_t T) const;
  // Grows the state's pending_* buffers to `rows`; true when reallocated.
  bool ensure_pending(Qwen35State& state, int rows);
  // Every op of one step, from the ids and positions already in the workspace.
  void run_step(Qwen35State& state, int64_t T, int64_t logit_rows, const std::vector<int>& hidden_layers,
                bool advance);
  // GDN layer `state`'s pending rows as gdn_commit's operand (all of them: the op reads the count).
  GdnCommitLayer pending_replay(Qwen35State::Layer& state) const;
  // A sublayer's input: the residual stream x, to which the sublayer's norm first adds delta (the previous
  // sublayer's output; nothing when empty), and the norm's rows `normed`.
  struct SublayerInput {
    Tensor x, delta, normed;
  };
  // The sublayer's norm fused with its input projection(s) into out (Backend::add_rmsnorm_linear).
  void norm_linear(const SublayerInput& in, const Tensor& norm_weight, const Tensor& out,
                   const StackedLinear& w, NormedRows rows);
  void gated_delta_net(const Qwen35Layer& layer, Qwen35State::Layer& state, const SublayerInput& in,
                       const Tensor& out, bool advance);
  void gated_attention(const Qwen35Layer& layer, Qwen35State::Layer& state, const SublayerInput& in,
                       const Tensor& out);
  void mlp(const Qwen35Layer& layer, const SublayerInput& in, const Tensor& out);

  Qwen35Config config_;
  Backend& backend_;
  Qwen35Weights weights_;
  std::unique_ptr<Workspace> ws_;

  static constexpr size_t kMaxStepGraphs = 64;
  uint64_t next_state_id_ = 1;
  StepGraphCache<GraphKey> graphs_;
};

}  // namespace qspec
