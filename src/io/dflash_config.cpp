#include "io/dflash_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <limits>

#include "core/error.h"
#include "io/config_fields.h"

namespace qspec {

namespace {

constexpr std::string_view kArchitecture = "DFlashDraftModel";
constexpr int kMaxDimension = 1 << 20;
constexpr int kMaxLayers = 4096;
constexpr int kMaxBlockSize = 256;

int dimension(const ConfigFields& fields, std::string_view key, int max = kMaxDimension) {
  const int value = fields.positive_int(key);
  if (value > max) fields.fail_field(key, fmt::format("a positive integer of at most {}", max));
  return value;
}

int non_negative_int(const ConfigFields& fields, const nlohmann::json& value, std::string_view key) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
      value.get<int64_t>() > std::numeric_limits<int>::max())
    fields.fail_field(key, "a non-negative integer");
  return value.get<int>();
}

void read_dflash_fields(const ConfigFields& dflash, DFlashConfig& config) {
  config.mask_token_id =
      non_negative_int(dflash, dflash.require("mask_token_id", "a token id"), "mask_token_id");
  const nlohmann::json& ids = dflash.require("target_layer_ids", "a non-empty list of target layer ids");
  if (!ids.is_array() || ids.empty())
    dflash.fail_field("target_layer_ids", "a non-empty list of target layer ids");
  for (const nlohmann::json& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxLayers)
      dflash.fail_field("target_layer_ids", "a non-empty list of target layer ids (integers >= 0)");
    config.target_layer_ids.push_back(id.get<int>());
  }
}

// Only the all-non-causal design is implemented: causal sliding-window layers (z-lab's newer drafters) would
// silently give other drafts.
void reject_sliding_layers(const ConfigFields& root, int num_layers) {
  if (root.boolean("use_sliding_window", false))
    root.fail_field("use_sliding_window", "false (causal sliding-window drafter layers are not supported)");
  if (root.has("rope_scaling")) root.fail_field("rope_scaling", "null (RoPE scaling is not supported)");
  if (!root.has("layer_types")) return;
  const nlohmann::json& types = root.at("layer_types");
  if (!types.is_array() || types.size() != size_t(num_layers))
    root.fail_field("layer_types", fmt::format("a list of {} layer types (num_hidden_layers)", num_layers));
  for (const nlohmann::json& type : types)
    if (type != "full_attention")
      root.fail_field("layer_types",
                      "\"full_attention\" for every layer (sliding-window layers are not supported)");
}

}  // namespace

DFlashConfig DFlashConfig::load(const std::string& dir) {
  return parse(read_config_text(dir, "the drafter's"), dir + "/config.json");
}

DFlashConfig DFlashConfig::parse(const std::string& json_text, const std::string& source) {
  const nlohmann::json json = parse_config_json(json_text, source);
  ConfigFields root(json, source, "");
  const nlohmann::json& architectures = root.require("architectures", "[\"DFlashDraftModel\"]");
  if (!architectures.is_array() || architectures.empty() || architectures[0] != kArchitecture)
    root.fail_field("architectures", "[\"DFlashDraftModel\"] (a DFlash drafter)");
  if (auto model_type = root.optional_string("model_type"); model_type && *model_type != "qwen3")
    root.fail_field("model_type", "\"qwen3\"");

  DFlashConfig config;
  config.source = source;
  config.block_size = dimension(root, "block_size", kMaxBlockSize);
  if (config.block_size < 2) root.fail_field("block_size", "at least 2 (the bonus token and one draft)");
  read_dflash_fields(root.object("dflash_config"), config);
  config.num_layers = dimension(root, "num_hidden_layers", kMaxLayers);
  if (root.has("num_target_layers"))
    config.num_target_layers = dimension(root, "num_target_layers", kMaxLayers);
  config.hidden_size = dimension(root, "hidden_size");
  config.intermediate_size = dimension(root, "intermediate_size");
  config.vocab_size = dimension(root, "vocab_size");
  config.num_heads = dimension(root, "num_attention_heads");
  config.num_kv_heads = dimension(root, "num_key_value_heads");
  if (config.num_heads % config.num_kv_heads != 0)
    root.fail_field("num_attention_heads",
                    fmt::format("a multiple of num_key_value_heads ({})", config.num_kv_heads));
  config.head_dim =
      root.has("head_dim") ? dimension(root, "head_dim") : config.hidden_size / config.num_heads;
  if (config.head_dim % 2 != 0) root.fail_field("head_dim", "an even number (rotary pairs)");
  if (int64_t(config.num_heads) * config.head_dim > kMaxDimension)
    root.fail_field("num_attention_heads",
                    fmt::format("num_attention_heads x head_dim <= {}", kMaxDimension));
  config.rope_theta = root.positive_number("rope_theta", config.rope_theta);
  config.rms_norm_eps = static_cast<float>(root.positive_number("rms_norm_eps", 1e-6));
  if (auto act = root.optional_string("hidden_act"); act && *act != "silu")
    root.fail_field("hidden_act", "\"silu\"");
  if (root.boolean("attention_bias", false)) root.fail_field("attention_bias", "false");
  reject_sliding_layers(root, config.num_layers);
  if (root.has("quantization_config"))
    config.quantization = QuantizationConfig::parse(root.at("quantization_config"), source);
  return config;
}

void DFlashConfig::check_target(const Qwen35Config& target, const std::string& target_dir) const {
  if (hidden_size != target.hidden_size)
    fail("{}: hidden_size {} differs from the target's {} ({}): the drafter belongs to another model", source,
         hidden_size, target.hidden_size, target_dir);
  if (vocab_size != target.vocab_size)
    fail("{}: vocab_size {} differs from the target's {} ({}): the drafter belongs to another model", source,
         vocab_size, target.vocab_size, target_dir);
  if (num_target_layers != 0 && num_target_layers != target.num_layers)
    fail("{}: num_target_layers {} differs from the target's {} layers ({})", source, num_target_layers,
         target.num_layers, target_dir);
  for (int id : target_layer_ids)
    if (id >= target.num_layers)
      fail("{}: dflash_config.target_layer_ids: layer {} is beyond the target's {} layers ({})", source, id,
           target.num_layers, target_dir);
  if (mask_token_id >= target.vocab_size)
    fail("{}: dflash_config.mask_token_id {} is outside the target's vocabulary of {} ({})", source,
         mask_token_id, target.vocab_size, target_dir);
}

std::vector<TensorSpec> DFlashConfig::tensor_specs() const {
  // linear_tensor_specs reads only the quantization_config of the config it is given.
  Qwen35Config linear_config;
  linear_config.quantization = quantization;
  const int64_t H = hidden_size, FF = intermediate_size;
  const int64_t q_dim = int64_t(num_heads) * head_dim, kv_dim = int64_t(num_kv_heads) * head_dim;
  std::vector<TensorSpec> specs;
  auto add_vector = [&](std::string name, int64_t length) {
    specs.push_back({std::move(name), {length}, {DType::BF16, DType::F16, DType::F32}, length, "dense"});
  };
  auto add_linear = [&](const std::string& module, int64_t out_features, int64_t in_features) {
    for (TensorSpec& spec : linear_tensor_specs(linear_config, module, out_features, in_features))
      specs.push_back(std::move(spec));
  };
  add_linear("fc", H, int64_t(target_layer_ids.size()) * H);
  add_vector("hidden_norm.weight", H);
  for (int i = 0; i < num_layers; ++i) {
    const std::string p = fmt::format("layers.{}.", i);
    add_vector(p + "input_layernorm.weight", H);
    add_linear(p + "self_attn.q_proj", q_dim, H);
    add_linear(p + "self_attn.k_proj", kv_dim, H);
    add_linear(p + "self_attn.v_proj", kv_dim, H);
    add_linear(p + "self_attn.o_proj", H, q_dim);
    add_vector(p + "self_attn.q_norm.weight", head_dim);
    add_vector(p + "self_attn.k_norm.weight", head_dim);
    add_vector(p + "post_attention_layernorm.weight", H);
    add_linear(p + "mlp.gate_proj", FF, H);
    add_linear(p + "mlp.up_proj", FF, H);
    add_linear(p + "mlp.down_proj", H, FF);
  }
  add_vector("norm.weight", H);
  return specs;
}

LinearTensors DFlashConfig::find_linear(const TensorStore& store, const std::string& module,
                                        int64_t out_features, int64_t in_features) const {
  Qwen35Config linear_config;
  linear_config.quantization = quantization;
  return qspec::find_linear(linear_config, store, module, out_features, in_features);
}

}  // namespace qspec
