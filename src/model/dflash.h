// The DFlash block-diffusion drafter (dflash-system.md §1.3), written once against backend/ops.h. It reads
// the target's residual stream after its target_layer_ids layers (the context features), and drafts the
// block [bonus, MASK x (B-1)] in one non-causal pass through the target's embedding and head.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "io/dflash_config.h"
#include "model/qwen35.h"

namespace qspec {

class TensorStore;

struct DFlashLayer {
  Tensor input_norm, post_attention_norm;  // plain weights (Qwen3 RMSNorm: w * x_hat)
  LinearWeight q_proj, k_proj, v_proj, o_proj;
  Tensor q_norm, k_norm;  // per head [1, head_dim]
  LinearWeight mlp_gate, mlp_up, mlp_down;
};

struct DFlashWeights {
  LinearWeight fc;  // [H, features x H]
  Tensor hidden_norm;
  std::vector<DFlashLayer> layers;
  Tensor final_norm;
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
};

class DFlashModel {
 public:
  // Loads the drafter's weights from `store` onto the target's backend; throws Error when the drafter does
  // not fit `target` (config.check_target) or a tensor is missing or misshapen.
  DFlashModel(DFlashConfig config, const TensorStore& store, const Qwen35Model& target,
              const std::string& target_dir);
  ~DFlashModel();

  const DFlashConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }

  std::unique_ptr<DFlashState> new_state(int max_context);
  void reset(DFlashState& state) const;

  // Appends context rows at positions n_context.. : `features` holds the target's residual stream after each
  // target_layer_ids layer ([rows, H] each, in that order), e.g. ForwardOutput::hidden.
  void add_context(DFlashState& state, std::span<const Tensor> features);

  // Drafts the block [bonus, MASK x (B-1)] at positions n_context.. and returns the logits of slots 1..B-1
  // [B-1, V] (workspace memory, valid until the next call). window > 0 limits each query to keys within
  // window - 1 positions of it, when context + block exceed `window`.
  Tensor draft(DFlashState& state, int32_t bonus, int window);

 private:
  struct Workspace;
  void ensure_context_rows(int64_t rows);
  void mlp(const DFlashLayer& layer, const Tensor& x, const Tensor& out);

  DFlashConfig config_;
  Backend& backend_;
  const Qwen35Weights& target_;  // embedding and head
  DFlashWeights weights_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace qspec
