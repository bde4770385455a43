#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "error_message.h"
#include "io/model_config.h"
#include "tiny_checkpoint.h"

namespace qspec {
namespace {

using nlohmann::json;
using tiny::tiny_text_config;
using tiny::tiny_wrapper_config;

constexpr LayerType L = LayerType::LinearAttention;
constexpr LayerType F = LayerType::FullAttention;

json tiny_causal_config() {
  json config = tiny_text_config();
  config["architectures"] = {"Qwen3_5ForCausalLM"};
  return config;
}

Qwen35Config parse(const json& config) {
  return Qwen35Config::parse(config.dump(), "config.json");
}

std::string error_of_text(const std::string& text) {
  return testing_support::error_message([&] { Qwen35Config::parse(text, "config.json"); }, "no error");
}
std::string error_of_load(const std::string& dir) {
  return testing_support::error_message([&] { Qwen35Config::load(dir); }, "no error");
}
std::string error_of(const json& config) {
  return error_of_text(config.dump());
}

// The config.json of Qwen/Qwen3.5-4B as reference/qwen35-model.md §1.1 gives it (vision_config abridged).
constexpr const char* kQwen35_4B = R"({
  "architectures": ["Qwen3_5ForConditionalGeneration"],
  "model_type": "qwen3_5",
  "image_token_id": 248056, "video_token_id": 248057,
  "vision_start_token_id": 248053, "vision_end_token_id": 248054,
  "tie_word_embeddings": true,
  "text_config": {
    "model_type": "qwen3_5_text",
    "attention_bias": false, "attn_output_gate": true, "dtype": "bfloat16",
    "eos_token_id": 248044, "bos_token_id": null,
    "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 9216,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention",
                    "linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "mamba_ssm_dtype": "float32", "max_position_embeddings": 262144,
    "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": false,
    "num_attention_heads": 16, "num_hidden_layers": 32, "num_key_value_heads": 4,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "tie_word_embeddings": true,
    "use_cache": true,
    "vocab_size": 248320
  },
  "vision_config": {"depth": 24, "hidden_size": 1024, "model_type": "qwen3_5"}
})";

TEST(ModelConfig, ParsesQwen35_4B) {
  Qwen35Config c = Qwen35Config::parse(kQwen35_4B, "config.json");
  EXPECT_EQ(c.architecture, "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(c.tensor_prefix, "model.language_model.");
  EXPECT_EQ(c.skipped_prefixes, (std::vector<std::string>{"model.visual.", "mtp."}));
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.intermediate_size, 9216);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.vocab_size, 248320);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.layer_pattern(), "(linear linear linear full) x8");
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{248044});
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.linear_key_dim(), 2048);
  EXPECT_EQ(c.linear_value_dim(), 4096);
  EXPECT_EQ(c.conv_dim(), 8192);
  EXPECT_EQ(c.conv_kernel, 4);
  EXPECT_FALSE(c.quantization.has_value());
}

TEST(ModelConfig, ParsesCausalLmAtTheTopLevelWithTransformersDefaults) {
  json config = tiny_causal_config();
  config.erase("rope_parameters");
  config.erase("rms_norm_eps");
  config.erase("max_position_embeddings");
  config.erase("full_attention_interval");
  Qwen35Config c = parse(config);
  EXPECT_EQ(c.architecture, "Qwen3_5ForCausalLM");
  EXPECT_EQ(c.tensor_prefix, "model.");
  EXPECT_EQ(c.layer_types, (std::vector<LayerType>{L, L, L, F}));
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{255});
}

TEST(ModelConfig, LayerTypesFromListOrInterval) {
  json config = tiny_causal_config();
  config["full_attention_interval"] = 2;
  EXPECT_EQ(parse(config).layer_types, (std::vector<LayerType>{L, F, L, F}));
  EXPECT_EQ(parse(config).layer_pattern(), "(linear full) x2");
  // An explicit list wins over the interval; "mamba"/"attention" are transformers' legacy names.
  config["layer_types"] = {"full_attention", "linear_attention", "mamba", "attention"};
  EXPECT_EQ(parse(config).layer_types, (std::vector<LayerType>{F, L, L, F}));
  EXPECT_EQ(parse(config).layer_pattern(), "full linear linear full");
  config["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
  EXPECT_EQ(parse(config).layer_pattern(), "(full) x4");
}

TEST(ModelConfig, RopeParametersWinOverLegacyTopLevelKeys) {
  json config = tiny_causal_config();
  config.erase("rope_parameters");
  config["rope_theta"] = 5e6;
  config["partial_rotary_factor"] = 0.5;
  Qwen35Config legacy = parse(config);
  EXPECT_DOUBLE_EQ(legacy.rope_theta, 5e6);
  EXPECT_EQ(legacy.rotary_dim, 16);
  config["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.125}};
  Qwen35Config both = parse(config);
  EXPECT_DOUBLE_EQ(both.rope_theta, 1e7);
  EXPECT_EQ(both.rotary_dim, 4);
  // A key missing from rope_parameters falls back to the top level, then to the default.
  config["rope_parameters"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse(config).rotary_dim, 16);
  EXPECT_DOUBLE_EQ(parse(config).rope_theta, 5e6);
}

// What transformers 5.17 does (checked by building both models): the top-level tie_word_embeddings decides,
// for the wrapper too; text_config's value is ignored.
TEST(ModelConfig, TieWordEmbeddingsIsReadAtTheTopLevelLikeTransformers) {
  json config = tiny_wrapper_config(true);
  EXPECT_TRUE(parse(config).tie_word_embeddings);
  config["text_config"]["tie_word_embeddings"] = false;
  EXPECT_TRUE(parse(config).tie_word_embeddings);
  config.erase("tie_word_embeddings");
  config["text_config"]["tie_word_embeddings"] = true;
  EXPECT_FALSE(parse(config).tie_word_embeddings);
  json causal = tiny_causal_config();
  causal["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse(causal).tie_word_embeddings);
}

TEST(ModelConfig, EosTokenIdIsAnIdOrAList) {
  json config = tiny_causal_config();
  config["eos_token_id"] = {248046, 248044};
  EXPECT_EQ(parse(config).eos_token_ids, (std::vector<int>{248046, 248044}));
  config["eos_token_id"] = nullptr;
  EXPECT_TRUE(parse(config).eos_token_ids.empty());
}

TEST(ModelConfig, ParsesQuantizationConfig) {
  json config = tiny_wrapper_config(true);
  config["quantization_config"] = tiny::w4a16_quantization_config(32);
  Qwen35Config c = parse(config);
  ASSERT_TRUE(c.quantization.has_value());
  EXPECT_EQ(c.quantization->scheme_for("model.language_model.layers.0.mlp.up_proj")->group_size, 32);
  EXPECT_FALSE(c.quantization->scheme_for("model.language_model.layers.0.linear_attn.in_proj_a").has_value());

  config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  EXPECT_EQ(
      error_of(config),
      "config.json: quantization_config.config_groups.group_0.weights.num_bits: expected 4 (W4A16), got 8");
}

TEST(ModelConfig, LoadsConfigJsonFromADirectory) {
  tiny::TempDir dir;
  tiny::write_config(dir.path(), tiny_wrapper_config(false));
  Qwen35Config c = Qwen35Config::load(dir.str());
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_FALSE(c.tie_word_embeddings);

  tiny::TempDir empty;
  EXPECT_EQ(error_of_load(empty.str()),
            "cannot open " + empty.str() + "/config.json: expected the model's config.json there");

  tiny::TempDir directory;
  std::filesystem::create_directory(directory.path() / "config.json");
  EXPECT_TRUE(error_of_load(directory.str()).starts_with(directory.str() + "/config.json: invalid JSON: "))
      << error_of_load(directory.str());

  tiny::write_config(empty.path(), json{{"architectures", {"LlamaForCausalLM"}}});
  EXPECT_EQ(error_of_load(empty.str()), "unsupported architecture LlamaForCausalLM in " + empty.str() +
                                            "/config.json (expected Qwen3_5ForCausalLM or "
                                            "Qwen3_5ForConditionalGeneration)");
}

TEST(ModelConfig, RejectsOtherArchitecturesAndBadJson) {
  EXPECT_EQ(error_of(json{{"architectures", {"Qwen3NextForCausalLM"}}}),
            "unsupported architecture Qwen3NextForCausalLM in config.json (expected Qwen3_5ForCausalLM or "
            "Qwen3_5ForConditionalGeneration)");
  EXPECT_EQ(error_of(json::object()),
            "config.json: architectures: missing (expected a list of architecture names)");
  EXPECT_EQ(error_of(json{{"architectures", json::array()}}),
            "config.json: architectures: expected a list of architecture names, got []");
  EXPECT_EQ(error_of(json{{"architectures", "Qwen3_5ForCausalLM"}}),
            "config.json: architectures: expected a list of architecture names, got \"Qwen3_5ForCausalLM\"");
  EXPECT_EQ(error_of_text("[1, 2]"), "config.json: expected a JSON object at the top level, got [1,2]");
  EXPECT_TRUE(error_of_text("{\"architectures\": [").starts_with("config.json: invalid JSON: "));
}

TEST(ModelConfig, RejectsInconsistentModelType) {
  json causal = tiny_causal_config();
  causal["model_type"] = "qwen3_5";
  EXPECT_EQ(error_of(causal), "config.json: model_type: expected \"qwen3_5_text\", got \"qwen3_5\"");
  json wrapper = tiny_wrapper_config(true);
  wrapper["model_type"] = "qwen3_next";
  EXPECT_EQ(error_of(wrapper), "config.json: model_type: expected \"qwen3_5\", got \"qwen3_next\"");
  wrapper = tiny_wrapper_config(true);
  wrapper["text_config"]["model_type"] = "qwen3";
  EXPECT_EQ(error_of(wrapper),
            "config.json: text_config.model_type: expected \"qwen3_5_text\", got \"qwen3\"");
  wrapper.erase("text_config");
  EXPECT_EQ(error_of(wrapper), "config.json: text_config: missing (expected an object)");
}

struct Rejection {
  std::string pointer;  // into the wrapper config
  json value;           // null: the field is removed
  std::string message;
};

TEST(ModelConfig, RejectsBadFieldsNamingTheFieldPath) {
  const std::string t = "config.json: text_config.";
  const std::vector<Rejection> rejections = {
      {"/text_config/head_dim", "x", t + "head_dim: expected a positive integer, got \"x\""},
      {"/text_config/head_dim", nullptr, t + "head_dim: missing (expected a positive integer)"},
      {"/text_config/hidden_size", 0, t + "hidden_size: expected a positive integer, got 0"},
      {"/text_config/hidden_size", -64, t + "hidden_size: expected a positive integer, got -64"},
      {"/text_config/hidden_size", 64.5, t + "hidden_size: expected a positive integer, got 64.5"},
      {"/text_config/hidden_size", 4294967296,
       t + "hidden_size: expected a positive integer, got 4294967296"},
      {"/text_config/vocab_size", 1048577,
       t + "vocab_size: expected a positive integer of at most 1048576, got 1048577"},
      {"/text_config/num_hidden_layers", 100000,
       t + "num_hidden_layers: expected a positive integer of at most 4096, got 100000"},
      {"/text_config/head_dim", 262144,
       t + "num_attention_heads: 2 x num_attention_heads x head_dim (q_proj rows) = 2097152, "
           "expected at most 1048576"},
      {"/text_config/linear_value_head_dim", 262144,
       t + "linear_num_key_heads: 2 x linear_num_key_heads x linear_key_head_dim + linear_num_value_heads x "
           "linear_value_head_dim (conv channels) = 1048640, expected at most 1048576"},
      {"/text_config/vocab_size", true, t + "vocab_size: expected a positive integer, got true"},
      {"/text_config/intermediate_size", nullptr,
       t + "intermediate_size: missing (expected a positive integer)"},
      {"/text_config/num_hidden_layers", nullptr,
       t + "num_hidden_layers: missing (expected a positive integer)"},
      {"/text_config/num_attention_heads", nullptr,
       t + "num_attention_heads: missing (expected a positive integer)"},
      {"/text_config/num_key_value_heads", 3,
       t + "num_attention_heads: expected a multiple of text_config.num_key_value_heads (3), got 4"},
      {"/text_config/linear_num_key_heads", 3,
       t + "linear_num_value_heads: expected a multiple of text_config.linear_num_key_heads (3), got 4"},
      {"/text_config/linear_key_head_dim", nullptr,
       t + "linear_key_head_dim: missing (expected a positive integer)"},
      {"/text_config/linear_value_head_dim", "16",
       t + "linear_value_head_dim: expected a positive integer, got \"16\""},
      {"/text_config/linear_conv_kernel_dim", 0,
       t + "linear_conv_kernel_dim: expected a positive integer, got 0"},
      {"/text_config/max_position_embeddings", 0,
       t + "max_position_embeddings: expected a positive integer, got 0"},
      {"/text_config/rms_norm_eps", -1, t + "rms_norm_eps: expected a positive number, got -1"},
      {"/text_config/hidden_act", "gelu", t + "hidden_act: expected \"silu\", got \"gelu\""},
      {"/text_config/hidden_act", 5, t + "hidden_act: expected a string, got 5"},
      {"/text_config/attention_bias", true,
       t + "attention_bias: expected false (Qwen3.5 has no biases), got true"},
      {"/text_config/layer_types", json::array({"linear_attention", "full_attention"}),
       t + "layer_types: expected a list of 4 layer types (num_hidden_layers), got "
           "[\"linear_attention\",\"full_attention\"]"},
      {"/text_config/layer_types",
       json::array({"linear_attention", "linear_attention", "sliding", "full_attention"}),
       t + "layer_types[2]: expected \"linear_attention\" or \"full_attention\", got \"sliding\""},
      {"/text_config/full_attention_interval", 0,
       t + "full_attention_interval: expected a positive integer, got 0"},
      {"/text_config/rope_parameters", "default", t + "rope_parameters: expected an object, got \"default\""},
      {"/text_config/rope_parameters/rope_type", "yarn",
       t + "rope_parameters.rope_type: expected \"default\" (RoPE scaling not supported), got \"yarn\""},
      {"/text_config/rope_parameters/rope_theta", 0,
       t + "rope_parameters.rope_theta: expected a positive number, got 0"},
      {"/text_config/rope_parameters/partial_rotary_factor", 1.5,
       t + "rope_parameters.partial_rotary_factor: expected a factor in (0, 1], got 1.5"},
      {"/text_config/rope_parameters/partial_rotary_factor", 0.1,
       t + "rope_parameters.partial_rotary_factor: head_dim 32 x 0.1 gives rotary dimension 3, expected a "
           "positive "
           "even number"},
      {"/text_config/rope_parameters/partial_rotary_factor", 0.01,
       t + "rope_parameters.partial_rotary_factor: head_dim 32 x 0.01 gives rotary dimension 0, expected a "
           "positive "
           "even number"},
      {"/text_config/rope_parameters/mrope_section", json::array({11, "x"}),
       t + "rope_parameters.mrope_section: expected a list of non-negative integers, got [11,\"x\"]"},
      {"/text_config/eos_token_id", "</s>",
       t + "eos_token_id: expected a token id or a list of token ids, got \"</s>\""},
      {"/text_config/eos_token_id", json::array({1, -2}),
       t + "eos_token_id: expected a token id or a list of token ids, got [1,-2]"},
      {"/tie_word_embeddings", "yes",
       "config.json: tie_word_embeddings: expected true or false, got \"yes\""},
      {"/quantization_config", "w4a16",
       "config.json: quantization_config: expected an object, got \"w4a16\""},
  };
  for (const Rejection& r : rejections) {
    json config = tiny_wrapper_config(true);
    const json::json_pointer pointer(r.pointer);
    if (r.value.is_null())
      config[pointer.parent_pointer()].erase(pointer.back());
    else
      config[pointer] = r.value;
    EXPECT_EQ(error_of(config), r.message) << r.pointer;
  }
}

TEST(ModelConfig, RejectsBadLegacyRopeKeysWithTheirOwnPath) {
  json config = tiny_causal_config();
  config.erase("rope_parameters");
  config["partial_rotary_factor"] = 2;
  EXPECT_EQ(error_of(config), "config.json: partial_rotary_factor: expected a factor in (0, 1], got 2");
  config["partial_rotary_factor"] = "quarter";
  EXPECT_EQ(error_of(config),
            "config.json: partial_rotary_factor: expected a positive number, got \"quarter\"");
}

}  // namespace
}  // namespace qspec
