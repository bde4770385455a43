// The DFlash block-diffusion drafter (dflash-system.md §1.3), written once against backend/ops.h. It reads
// the target's residual stream after its target_layer_ids layers (the context features), and drafts the
// block [bonus, MASK x (B-1)] in one non-causal pass through the target's embedding and head (or a W4A16
// copy of that head: DraftHead).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "io/dflash_config.h"
#include "model/qwen35.h"
#include "model/step_graph_cache.h"
#include "model/weight_upload.h"

namespace qspec {

class TensorStore;

// The head a draft step's logits come from: the target's own (the published drafter's, and the default), or
// a W4A16 g32 copy of a dense target head quantized at load by round to nearest (model/int4_quantize.h; a
// W4A16 target head is used as it is). The copy reads ~28% of the BF16 head's bytes, the largest read of a
// draft step; its drafts can differ where the head's rounding moves an argmax, which changes acceptance,
// never the output (the target verifies).
enum class DraftHead { Target, W4A16 };
inline constexpr int kDraftHeadGroupSize = 32;
static_assert(kDraftHeadGroupSize % 8 == 0, "whole packed words per group");

struct DFlashLayer {
  Tensor input_norm, post_attention_norm;  // plain weights (Qwen3 RMSNorm: w * x_hat)
  StackedLinear qkv_proj;                  // [q_proj | k_proj | v_proj], the block's projections
  LinearWeight o_proj;
  Tensor q_norm, k_norm;      // per head [1, head_dim]
  StackedLinear mlp_gate_up;  // [gate | up]
  LinearWeight mlp_down;
};

struct DFlashWeights {
  LinearWeight fc;  // [H, features x H]
  Tensor hidden_norm;
  std::vector<DFlashLayer> layers;
  // Every layer's [k_proj | v_proj] in layer order (a second copy of those weights): the context rows need
  // no query, and all layers read the same rows, so one linear serves them.
  StackedLinear context_kv;
  Tensor final_norm;
  std::vector<std::unique_ptr<Buffer>> stacked_storage;  // the stacked linears' weights, the BF16 copies
};

// The drafter's side of a sequence: per layer the K/V of every context token at its position (rows
// 0..n_context-1), followed while drafting by the block's own K/V (transient, overwritten by the next
// context).
struct DFlashState {
  struct Layer {
    std::unique_ptr<Buffer> k_cache, v_cache;  // [max_context + block_size, nkv * head_dim]
  };
  std::vector<Layer> layers;
  int max_context = 0;
  int n_context = 0;
  uint64_t id = 0;  // distinguishes states in the model's step graphs, which are recorded on their buffers
};

// A draft step's result: workspace memory, valid until the next draft.
struct DraftOutput {
  Tensor logits;  // [B-1, V]: slots 1..B-1
  Tensor ids;     // I32 [B-1, 1]: each slot's greedy draft, the argmax of its logits row
};

class DFlashModel {
 public:
  // Loads the drafter's weights from `store` onto the target's backend; throws Error when the drafter does
  // not fit `target` (config.check_target) or a tensor is missing or misshapen.
  DFlashModel(DFlashConfig config, const TensorStore& store, const Qwen35Model& target,
              const std::string& target_dir, DraftHead head = DraftHead::Target);
  ~DFlashModel();

  const DFlashConfig& config() const { return config_; }
  // The head the draft step's logits come from (the target's, or DraftHead::W4A16's copy).
  const LinearWeight& head() const { return head_; }
  Backend& backend() const { return backend_; }

  std::unique_ptr<DFlashState> new_state(int max_context);
  void reset(DFlashState& state) const;

  // Steps of a shape seen before replay a recorded step graph on backends that can record them (default on).
  void set_step_graphs(bool enabled) { graphs_.set_enabled(enabled); }

  // Appends context rows at positions n_context.. : `features` holds the target's residual stream after each
  // target_layer_ids layer ([rows, H] each, in that order), e.g. ForwardOutput::hidden. One step graph per
  // (state, rows, feature tensors).
  void add_context(DFlashState& state, std::span<const Tensor> features);

  // Drafts the block [bonus, MASK x (B-1)] at positions n_context.. : the logits of slots 1..B-1 and their
  // argmax, in one step graph per state. window > 0 limits each query to keys within window - 1 positions
  // of it, when context + block exceed `window`.
  DraftOutput draft(DFlashState& state, int32_t bonus, int window);

 private:
  struct Workspace;
  enum class Step { Context, Draft, DraftWindowed };
  // A step's shape and state, and where the tensors it reads from outside the model (the features) are: data
  // and row stride (the same data at another stride is read in place or concatenated: another graph).
  struct GraphKey {
    uint64_t state_id;
    Step step;
    int64_t rows;
    std::vector<std::pair<const void*, int64_t>> inputs;
    auto operator<=>(const GraphKey&) const = default;
  };
  void ensure_context_rows(int64_t rows);
  // The buffer context_step concatenates features into when they are not adjacent columns of one tensor.
  void ensure_feature_rows(int64_t rows);
  void context_step(DFlashState& state, std::span<const Tensor> features, int64_t rows);
  void draft_step(DFlashState& state, bool windowed);
  void mlp(const DFlashLayer& layer, const Tensor& x, const Tensor& out);
  // DraftHead::W4A16: the target's dense head quantized into head_packed_ / head_scales_.
  LinearWeight quantized_head();

  DFlashConfig config_;
  Backend& backend_;
  const Qwen35Weights& target_;  // embedding (and head, unless head_ is a copy)
  DFlashWeights weights_;
  std::unique_ptr<Buffer> head_packed_, head_scales_;  // DraftHead::W4A16's copy of the target's head
  LinearWeight head_;                                  // the draft step's: the target's or that copy
  std::unique_ptr<Workspace> ws_;

  static constexpr size_t kMaxStepGraphs = 64;
  uint64_t next_state_id_ = 1;
  StepGraphCache<GraphKey> graphs_;
};

}  // namespace qspec
