// config.json of a DFlash block-diffusion drafter (architecture DFlashDraftModel, Qwen3 layers; the
// reference notes, dflash-system.md §1.1-1.2): its dimensions, block size, mask token, the target layers
// whose outputs it reads, and a compressed-tensors quantization_config when it is W4A16. Tensors have no
// "model." prefix; the drafter has no embedding or head of its own (it uses the target's).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/quant_config.h"

namespace qspec {

struct DFlashConfig {
  std::string source;  // the config.json it was read from, for error messages
  int block_size = 0;
  int mask_token_id = 0;
  std::vector<int> target_layer_ids;  // decoder layers of the target (0-based) whose outputs feed fc
  int num_target_layers = 0;          // 0 when the config does not say
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int vocab_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  double rope_theta = 10000.0;
  float rms_norm_eps = 1e-6f;
  std::optional<QuantizationConfig> quantization;

  // Reads and validates DIR/config.json; throws Error naming the file and the field.
  static DFlashConfig load(const std::string& dir);
  static DFlashConfig parse(const std::string& json_text, const std::string& source);

  // Throws Error naming this config's file and the field when the drafter cannot serve `target`: another
  // hidden size or vocabulary, a target layer id beyond the target's depth, another target depth, a mask
  // token outside the vocabulary.
  void check_target(const Qwen35Config& target, const std::string& target_dir) const;

  // Every tensor of the drafter, in checkpoint order.
  std::vector<TensorSpec> tensor_specs() const;
  // find_linear for the drafter's Linear modules (dense or W4A16 as quantization_config says).
  LinearTensors find_linear(const TensorStore& store, const std::string& module, int64_t out_features,
                            int64_t in_features) const;
};

}  // namespace qspec
