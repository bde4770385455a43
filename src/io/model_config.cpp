#include "io/model_config.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <limits>

#include "core/error.h"
#include "io/config_fields.h"

namespace qspec {

namespace {

constexpr std::string_view kCausalLm = "Qwen3_5ForCausalLM";
constexpr std::string_view kConditionalGeneration = "Qwen3_5ForConditionalGeneration";

// transformers 5.17 defaults (Qwen3_5TextConfig and its __post_init__).
constexpr double kDefaultRopeTheta = 10000.0;
constexpr double kDefaultPartialRotaryFactor = 0.25;
constexpr int kDefaultFullAttentionInterval = 4;
constexpr int kDefaultMaxPositionEmbeddings = 32768;
constexpr double kDefaultRmsNormEps = 1e-6;

void require_model_type(const ConfigFields& fields, std::string_view expected) {
  if (auto model_type = fields.optional_string("model_type"); model_type && *model_type != expected)
    fields.fail_field("model_type", fmt::format("\"{}\"", expected));
}

std::string read_architecture(const ConfigFields& root) {
  const nlohmann::json& list = root.require("architectures", "a list of architecture names");
  if (!list.is_array() || list.empty() || !list[0].is_string())
    root.fail_field("architectures", "a list of architecture names");
  std::string architecture = list[0].get<std::string>();
  if (architecture != kCausalLm && architecture != kConditionalGeneration)
    fail("unsupported architecture {} in {} (expected {} or {})", architecture, root.source(), kCausalLm,
         kConditionalGeneration);
  return architecture;
}

LayerType parse_layer_type(const nlohmann::json& value, const std::string& source, const std::string& field) {
  // "mamba" and "attention" are the legacy names transformers remaps (remap_legacy_layer_types).
  if (value == "linear_attention" || value == "mamba") return LayerType::LinearAttention;
  if (value == "full_attention" || value == "attention") return LayerType::FullAttention;
  fail("{}: {}: expected \"linear_attention\" or \"full_attention\", got {}", source, field,
       json_excerpt(value));
}

std::vector<LayerType> read_layer_types(const ConfigFields& text, int num_layers) {
  std::vector<LayerType> types;
  if (text.has("layer_types")) {
    const nlohmann::json& list = text.at("layer_types");
    if (!list.is_array() || list.size() != size_t(num_layers))
      text.fail_field("layer_types", fmt::format("a list of {} layer types (num_hidden_layers)", num_layers));
    for (size_t i = 0; i < list.size(); ++i)
      types.push_back(
          parse_layer_type(list[i], text.source(), fmt::format("{}[{}]", text.path_of("layer_types"), i)));
    return types;
  }
  int interval =
      text.optional_positive_int("full_attention_interval").value_or(kDefaultFullAttentionInterval);
  for (int i = 0; i < num_layers; ++i)
    types.push_back((i + 1) % interval == 0 ? LayerType::FullAttention : LayerType::LinearAttention);
  return types;
}

void read_rope(const ConfigFields& text, Qwen35Config& config) {
  // rope_parameters wins over the legacy top-level keys, as in transformers' rope standardisation.
  config.rope_theta = text.positive_number("rope_theta", kDefaultRopeTheta);
  config.partial_rotary_factor = text.positive_number("partial_rotary_factor", kDefaultPartialRotaryFactor);
  if (text.has("rope_parameters")) {
    ConfigFields rope = text.object("rope_parameters");
    if (auto type = rope.optional_string("rope_type"); type && *type != "default")
      rope.fail_field("rope_type", "\"default\" (RoPE scaling not supported)");
    config.rope_theta = rope.positive_number("rope_theta", config.rope_theta);
    config.partial_rotary_factor =
        rope.positive_number("partial_rotary_factor", config.partial_rotary_factor);
    // mRoPE sections only matter for image/video positions; text positions are equal in all three streams.
    if (rope.has("mrope_section")) {
      const nlohmann::json& sections = rope.at("mrope_section");
      bool valid = sections.is_array();
      for (const nlohmann::json& s : sections)
        valid = valid && s.is_number_integer() && s.get<int64_t>() >= 0;
      if (!valid) rope.fail_field("mrope_section", "a list of non-negative integers");
    }
  }
  const std::string factor_field =
      text.has("rope_parameters") ? "rope_parameters.partial_rotary_factor" : "partial_rotary_factor";
  if (config.partial_rotary_factor > 1.0)
    fail("{}: {}: expected a factor in (0, 1], got {}", text.source(), text.path_of(factor_field),
         config.partial_rotary_factor);
  // transformers truncates: dim = int(head_dim * partial_rotary_factor).
  config.rotary_dim = static_cast<int>(config.head_dim * config.partial_rotary_factor);
  if (config.rotary_dim <= 0 || config.rotary_dim % 2 != 0)
    fail("{}: {}: head_dim {} x {} gives rotary dimension {}, expected a positive even number", text.source(),
         text.path_of(factor_field), config.head_dim, config.partial_rotary_factor, config.rotary_dim);
}

std::vector<int> read_eos(const ConfigFields& text) {
  if (!text.has("eos_token_id")) return {};
  const nlohmann::json& value = text.at("eos_token_id");
  std::vector<int> ids;
  auto add = [&](const nlohmann::json& id) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int>::max())
      text.fail_field("eos_token_id", "a token id or a list of token ids");
    ids.push_back(id.get<int>());
  };
  if (value.is_array()) {
    for (const nlohmann::json& id : value) add(id);
  } else {
    add(value);
  }
  return ids;
}

void require_divisible(const ConfigFields& text, std::string_view key, int value,
                       std::string_view divisor_key, int divisor) {
  if (value % divisor != 0)
    text.fail_field(key, fmt::format("a multiple of {} ({})", text.path_of(divisor_key), divisor));
}

// Bounds that keep every tensor size and the parameter count far inside int64 (and every dimension an int),
// so that an absurd config is an error rather than an overflow or an allocation of the whole memory.
constexpr int64_t kMaxDimension = 1 << 20;
constexpr int kMaxLayers = 4096;

int dimension(const ConfigFields& text, std::string_view key, int64_t max = kMaxDimension) {
  int value = text.positive_int(key);
  if (value > max) text.fail_field(key, fmt::format("a positive integer of at most {}", max));
  return value;
}

// A dimension derived from several fields (q_proj rows, conv channels) must be within bounds too.
void require_derived_bound(const ConfigFields& text, std::string_view key, std::string_view formula,
                           int64_t value) {
  if (value > kMaxDimension)
    fail("{}: {}: {} = {}, expected at most {}", text.source(), text.path_of(key), formula, value,
         kMaxDimension);
}

void read_text_config(const ConfigFields& text, Qwen35Config& config) {
  config.vocab_size = dimension(text, "vocab_size");
  config.hidden_size = dimension(text, "hidden_size");
  config.intermediate_size = dimension(text, "intermediate_size");
  config.num_layers = dimension(text, "num_hidden_layers", kMaxLayers);
  config.num_heads = dimension(text, "num_attention_heads");
  config.num_kv_heads = dimension(text, "num_key_value_heads");
  config.head_dim = dimension(text, "head_dim");
  config.linear_num_key_heads = dimension(text, "linear_num_key_heads");
  config.linear_num_value_heads = dimension(text, "linear_num_value_heads");
  config.linear_key_head_dim = dimension(text, "linear_key_head_dim");
  config.linear_value_head_dim = dimension(text, "linear_value_head_dim");
  config.conv_kernel = dimension(text, "linear_conv_kernel_dim");
  require_derived_bound(text, "num_attention_heads", "2 x num_attention_heads x head_dim (q_proj rows)",
                        2 * int64_t(config.num_heads) * config.head_dim);
  require_derived_bound(text, "linear_num_key_heads",
                        "2 x linear_num_key_heads x linear_key_head_dim + linear_num_value_heads x "
                        "linear_value_head_dim (conv channels)",
                        2 * int64_t(config.linear_num_key_heads) * config.linear_key_head_dim +
                            int64_t(config.linear_num_value_heads) * config.linear_value_head_dim);
  config.max_position_embeddings =
      text.optional_positive_int("max_position_embeddings").value_or(kDefaultMaxPositionEmbeddings);
  config.rms_norm_eps = static_cast<float>(text.positive_number("rms_norm_eps", kDefaultRmsNormEps));

  require_divisible(text, "num_attention_heads", config.num_heads, "num_key_value_heads",
                    config.num_kv_heads);
  require_divisible(text, "linear_num_value_heads", config.linear_num_value_heads, "linear_num_key_heads",
                    config.linear_num_key_heads);
  if (auto act = text.optional_string("hidden_act"); act && *act != "silu")
    text.fail_field("hidden_act", "\"silu\"");
  if (text.boolean("attention_bias", false))
    text.fail_field("attention_bias", "false (Qwen3.5 has no biases)");

  config.layer_types = read_layer_types(text, config.num_layers);
  read_rope(text, config);
  config.eos_token_ids = read_eos(text);
}

}  // namespace

std::string Qwen35Config::layer_pattern() const {
  auto name = [](LayerType t) { return t == LayerType::FullAttention ? "full" : "linear"; };
  const size_t n = layer_types.size();
  for (size_t period = 1; period < n; ++period) {
    if (n % period != 0) continue;
    bool repeats = true;
    for (size_t i = period; i < n && repeats; ++i) repeats = layer_types[i] == layer_types[i - period];
    if (!repeats) continue;
    std::vector<std::string> names;
    for (size_t i = 0; i < period; ++i) names.emplace_back(name(layer_types[i]));
    return fmt::format("({}) x{}", fmt::join(names, " "), n / period);
  }
  std::vector<std::string> names;
  for (LayerType t : layer_types) names.emplace_back(name(t));
  return fmt::format("{}", fmt::join(names, " "));
}

Qwen35Config Qwen35Config::load(const std::string& dir) {
  return parse(read_config_text(dir, "the model's"), dir + "/config.json");
}

Qwen35Config Qwen35Config::parse(const std::string& json_text, const std::string& source) {
  const nlohmann::json json = parse_config_json(json_text, source);
  ConfigFields root(json, source, "");

  Qwen35Config config;
  config.architecture = read_architecture(root);
  config.skipped_prefixes = {"model.visual.", "mtp."};
  if (config.architecture == kCausalLm) {
    require_model_type(root, "qwen3_5_text");
    config.tensor_prefix = "model.";
    read_text_config(root, config);
  } else {
    require_model_type(root, "qwen3_5");
    ConfigFields text = root.object("text_config");
    require_model_type(text, "qwen3_5_text");
    config.tensor_prefix = "model.language_model.";
    read_text_config(text, config);
  }
  config.tie_word_embeddings = root.boolean("tie_word_embeddings", false);
  if (root.has("quantization_config"))
    config.quantization = QuantizationConfig::parse(root.at("quantization_config"), source);
  return config;
}

}  // namespace qspec
