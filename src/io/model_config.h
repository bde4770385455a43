// config.json of Qwen3.5 checkpoints: Qwen3_5ForCausalLM (text config at the top level) and
// Qwen3_5ForConditionalGeneration (nested text_config, tensors under model.language_model.).
//
// Defaults follow transformers 5.17 (configuration_qwen3_5.py): partial_rotary_factor 0.25, rope_theta 10000,
// full_attention_interval 4, rms_norm_eps 1e-6, max_position_embeddings 32768. The dimensions have no default
// here: a config without them is rejected rather than guessed. Each dimension (and q_proj rows, conv
// channels) is at most 2^20 and there are at most 4096 layers, so no tensor size can overflow.
//
// tie_word_embeddings is read where transformers reads it, at the top level of config.json (default false);
// for the wrapper, text_config's own value is ignored by transformers and so here too.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/quant_config.h"

namespace qspec {

enum class LayerType { LinearAttention, FullAttention };

struct Qwen35Config {
  std::string architecture;                   // as named in config.json "architectures"[0]
  std::string tensor_prefix;                  // "model.language_model." (wrapper) or "model." (causal LM)
  std::vector<std::string> skipped_prefixes;  // "model.visual.", "mtp." : present in checkpoints, not loaded

  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int vocab_size = 0;
  float rms_norm_eps = 1e-6f;
  bool tie_word_embeddings = false;
  int max_position_embeddings = 0;
  std::vector<LayerType> layer_types;
  std::vector<int> eos_token_ids;

  // gated full attention
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 0.25;
  int rotary_dim = 0;  // int(head_dim * partial_rotary_factor), even

  // gated DeltaNet
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int conv_kernel = 0;

  std::optional<QuantizationConfig> quantization;  // compressed-tensors, when present

  int linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }

  // The layer pattern, compact: "(linear linear linear full) x8", or every layer when there is no period.
  std::string layer_pattern() const;

  // Reads and validates DIR/config.json; throws Error naming the file and the field.
  static Qwen35Config load(const std::string& dir);
  static Qwen35Config parse(const std::string& json_text, const std::string& source);
};

}  // namespace qspec
