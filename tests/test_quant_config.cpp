#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "error_message.h"
#include "io/quant_config.h"

namespace qspec {
namespace {

using nlohmann::json;

// What llm-compressor writes for W4A16 (reference/kernels-and-anchors.md §1.2).
json w4a16_config() {
  return json::parse(R"({
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "global_compression_ratio": null,
    "kv_cache_scheme": null,
    "ignore": ["lm_head", "re:.*in_proj_[ab]$", "re:model[.]visual.*"],
    "config_groups": {
      "group_0": {
        "targets": ["Linear"],
        "input_activations": null,
        "output_activations": null,
        "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32,
                    "dynamic": false, "actorder": null, "observer": "minmax", "observer_kwargs": {},
                    "block_structure": null}
      }
    }
  })");
}

std::string error_of(const json& config) {
  return testing_support::error_message([&] { QuantizationConfig::parse(config, "config.json"); },
                                        "no error");
}

std::optional<int> group_of(const QuantizationConfig& config, const std::string& module) {
  auto scheme = config.scheme_for(module);
  if (!scheme) return std::nullopt;
  return scheme->group_size;
}

TEST(QuantConfig, ParsesLlmCompressorW4A16) {
  QuantizationConfig config = QuantizationConfig::parse(w4a16_config(), "config.json");
  EXPECT_EQ(config.format, "pack-quantized");
  ASSERT_EQ(config.groups.size(), 1u);
  EXPECT_EQ(config.groups[0].name, "group_0");
  EXPECT_EQ(config.groups[0].weights.num_bits, 4);
  EXPECT_EQ(config.groups[0].weights.group_size, 32);
  ASSERT_EQ(config.ignore.size(), 3u);
  EXPECT_FALSE(config.ignore[0].is_regex());
  EXPECT_TRUE(config.ignore[1].is_regex());
}

TEST(QuantConfig, SchemeForHonoursIgnoreNamesAndRegexes) {
  QuantizationConfig config = QuantizationConfig::parse(w4a16_config(), "config.json");
  EXPECT_EQ(group_of(config, "model.language_model.layers.0.mlp.up_proj"), 32);
  EXPECT_EQ(group_of(config, "model.language_model.layers.0.linear_attn.in_proj_qkv"), 32);
  EXPECT_EQ(group_of(config, "lm_head"), std::nullopt);
  EXPECT_EQ(group_of(config, "model.language_model.layers.0.linear_attn.in_proj_a"), std::nullopt);
  EXPECT_EQ(group_of(config, "model.language_model.layers.0.linear_attn.in_proj_b"), std::nullopt);
  // "$" anchors the end: in_proj_ab is not in_proj_a.
  EXPECT_EQ(group_of(config, "model.language_model.layers.0.linear_attn.in_proj_ab"), 32);
  EXPECT_EQ(group_of(config, "model.visual.blocks.0.attn.qkv"), std::nullopt);
  // An exact name is not a prefix match.
  EXPECT_EQ(group_of(config, "lm_head_2"), 32);
}

TEST(QuantConfig, RegexesAreAnchoredAtTheStartOnlyLikePythonReMatch) {
  ModuleMatcher mlp("re:.*mlp", "test");
  EXPECT_TRUE(mlp.matches_name("model.layers.0.mlp.up_proj"));  // end left free
  ModuleMatcher layers("re:layers[.]0", "test");
  EXPECT_FALSE(layers.matches_name("model.layers.0.mlp.up_proj"));  // start anchored
  EXPECT_TRUE(layers.matches_name("layers.0.mlp"));
  ModuleMatcher name("model.layers.0.mlp", "test");
  EXPECT_FALSE(name.matches_name("model.layers.0.mlp.up_proj"));
  EXPECT_TRUE(name.matches_name("model.layers.0.mlp"));
}

struct GroupSpec {
  std::string name;
  std::vector<std::string> targets;
  int group_size;
};

json with_groups(const std::vector<GroupSpec>& groups) {
  json config = w4a16_config();
  config["ignore"] = json::array();
  const json weights = config["config_groups"]["group_0"]["weights"];
  config["config_groups"] = json::object();
  for (const GroupSpec& spec : groups) {
    json group = {{"targets", spec.targets}, {"weights", weights}};
    group["weights"]["group_size"] = spec.group_size;
    config["config_groups"][spec.name] = group;
  }
  return config;
}

TEST(QuantConfig, ExactTargetBeatsRegexWhichBeatsClass) {
  QuantizationConfig parsed = QuantizationConfig::parse(with_groups({
                                                            {"a_class", {"Linear"}, 128},
                                                            {"b_regex", {"re:.*mlp[.].*"}, 64},
                                                            {"c_name", {"model.layers.1.mlp.up_proj"}, 16},
                                                            {"d_regex", {"re:.*down_proj$"}, 8},
                                                        }),
                                                        "config.json");
  EXPECT_EQ(group_of(parsed, "model.layers.1.mlp.up_proj"), 16);        // exact name
  EXPECT_EQ(group_of(parsed, "model.layers.0.mlp.up_proj"), 64);        // regex
  EXPECT_EQ(group_of(parsed, "model.layers.0.self_attn.q_proj"), 128);  // class
  // Both regexes match down_proj; compressed-tensors tries them in sorted order: ".*down_proj$" <
  // ".*mlp[.].*".
  EXPECT_EQ(group_of(parsed, "model.layers.0.mlp.down_proj"), 8);
}

TEST(QuantConfig, RejectsATargetListedByTwoGroups) {
  EXPECT_EQ(
      error_of(with_groups({{"a", {"Linear"}, 128}, {"b", {"re:.*mlp", "Linear"}, 64}})),
      "config.json: quantization_config.config_groups.b.targets: target \"Linear\" is also listed by group a "
      "(ambiguous)");
}

TEST(QuantConfig, ModulesNoGroupTargetsStayDense) {
  json config = w4a16_config();
  config["config_groups"]["group_0"]["targets"] = json::array({"re:.*mlp[.].*"});
  QuantizationConfig parsed = QuantizationConfig::parse(config, "config.json");
  EXPECT_EQ(group_of(parsed, "model.layers.0.mlp.gate_proj"), 32);
  EXPECT_EQ(group_of(parsed, "model.layers.0.self_attn.q_proj"), std::nullopt);
}

TEST(QuantConfig, AcceptsStaticActOrderAndOmittedOptionalFields) {
  for (const char* actorder : {"static", "weight"}) {
    json config = w4a16_config();
    config["config_groups"]["group_0"]["weights"]["actorder"] = actorder;
    EXPECT_EQ(error_of(config), "no error") << actorder;
  }
  json config = w4a16_config();
  json& weights = config["config_groups"]["group_0"]["weights"];
  for (const char* key : {"symmetric", "strategy", "dynamic", "actorder", "block_structure"})
    weights.erase(key);
  config["config_groups"]["group_0"].erase("input_activations");
  config.erase("ignore");
  EXPECT_EQ(error_of(config), "no error");
  // What compressed-tensors 0.20 writes when there are no transforms and no sparsity.
  config["transform_config"] = json::object();
  config["sparsity_config"] = json::object();
  config["config_groups"]["group_0"]["format"] = nullptr;
  EXPECT_EQ(error_of(config), "no error");
  config["transform_config"] = {{"config_groups", json::object()}};
  config["sparsity_config"] = {{"format", "dense"}};
  EXPECT_EQ(error_of(config), "no error");
}

struct Rejection {
  std::string pointer;  // JSON pointer of the field to change
  json value;
  std::string message;
};

TEST(QuantConfig, RejectsUnsupportedSchemesNamingTheField) {
  const std::string w = "config.json: quantization_config.config_groups.group_0.weights.";
  const std::vector<Rejection> rejections = {
      {"/quant_method", "gptq",
       "config.json: quantization_config.quant_method: expected \"compressed-tensors\", got \"gptq\""},
      {"/format", "int-quantized",
       "config.json: quantization_config.format: expected \"pack-quantized\" (W4A16 packed int4; other "
       "compressed-tensors formats are not supported), got \"int-quantized\""},
      {"/format", "marlin-24",
       "config.json: quantization_config.format: expected \"pack-quantized\" (W4A16 packed int4; other "
       "compressed-tensors formats are not supported), got \"marlin-24\""},
      {"/format", "float-quantized",
       "config.json: quantization_config.format: expected \"pack-quantized\" (W4A16 packed int4; other "
       "compressed-tensors formats are not supported), got \"float-quantized\""},
      {"/kv_cache_scheme",
       {{"num_bits", 8}},
       "config.json: quantization_config.kv_cache_scheme: expected null (KV cache quantization not "
       "supported), got "
       "{\"num_bits\":8}"},
      {"/transform_config",
       {{"config_groups", {{"u", {{"type", "hadamard"}}}}}},
       "config.json: quantization_config.transform_config.config_groups: expected none (weight transforms "
       "not "
       "supported), got {\"u\":{\"type\":\"hadamard\"}}"},
      {"/sparsity_config",
       {{"format", "sparse-24-bitmask"}},
       "config.json: quantization_config.sparsity_config.format: expected \"dense\" (sparse weights not "
       "supported), "
       "got \"sparse-24-bitmask\""},
      {"/config_groups", json::object(),
       "config.json: quantization_config.config_groups: expected at least one group, got {}"},
      {"/config_groups/group_0/targets", json::array(),
       "config.json: quantization_config.config_groups.group_0.targets: expected at least one target, got "
       "[]"},
      {"/config_groups/group_0/targets", "Linear",
       "config.json: quantization_config.config_groups.group_0.targets: expected a list of module names or "
       "\"re:\" "
       "patterns, got \"Linear\""},
      {"/config_groups/group_0/format", "float-quantized",
       "config.json: quantization_config.config_groups.group_0.format: expected \"pack-quantized\", got "
       "\"float-quantized\""},
      {"/config_groups/group_0/input_activations",
       {{"num_bits", 8}},
       "config.json: quantization_config.config_groups.group_0.input_activations: expected null (W4A16: "
       "activations are not quantized), got {\"num_bits\":8}"},
      {"/config_groups/group_0/weights/num_bits", 8, w + "num_bits: expected 4 (W4A16), got 8"},
      {"/config_groups/group_0/weights/type", "float", w + "type: expected \"int\", got \"float\""},
      {"/config_groups/group_0/weights/symmetric", false,
       w + "symmetric: expected true: asymmetric (zero points) not supported, got false"},
      {"/config_groups/group_0/weights/strategy", "channel",
       w + "strategy: expected \"group\" (per-group scales; other strategies not supported), got "
           "\"channel\""},
      {"/config_groups/group_0/weights/group_size", 0, w + "group_size: expected a positive integer, got 0"},
      {"/config_groups/group_0/weights/group_size", nullptr,
       w + "group_size: expected a positive integer, got null"},
      {"/config_groups/group_0/weights/actorder", "group",
       w + "actorder: expected null, \"static\" or \"weight\": act-order g_idx not supported, got \"group\""},
      {"/config_groups/group_0/weights/actorder", "dynamic",
       w + "actorder: expected null, \"static\" or \"weight\": act-order g_idx not supported, got "
           "\"dynamic\""},
      {"/config_groups/group_0/weights/actorder", "sideways",
       w + "actorder: expected null, \"static\" or \"weight\", got \"sideways\""},
      {"/config_groups/group_0/weights/dynamic", true,
       w + "dynamic: expected false (static weight scales), got true"},
      {"/ignore/1", "re:(unclosed", ""},  // message checked below: std::regex wording varies
      {"/ignore/0", 7,
       "config.json: quantization_config.ignore[0]: expected a module name or \"re:\" pattern, got 7"},
  };
  for (const Rejection& r : rejections) {
    json config = w4a16_config();
    config[json::json_pointer(r.pointer)] = r.value;
    std::string error = error_of(config);
    if (r.message.empty()) {
      EXPECT_TRUE(
          error.starts_with("config.json: quantization_config.ignore[1]: invalid regex \"re:(unclosed\": "))
          << error;
    } else {
      EXPECT_EQ(error, r.message) << r.pointer;
    }
  }
}

TEST(QuantConfig, RejectsMissingFields) {
  for (const char* key : {"quant_method", "format", "config_groups"}) {
    json config = w4a16_config();
    config.erase(key);
    EXPECT_EQ(error_of(config), fmt::format("config.json: quantization_config.{}: missing (expected {})", key,
                                            key == std::string("config_groups") ? "an object" : "a string"));
  }
  json config = w4a16_config();
  config["config_groups"]["group_0"].erase("weights");
  EXPECT_EQ(error_of(config),
            "config.json: quantization_config.config_groups.group_0.weights: missing (expected an "
            "object)");
  config = w4a16_config();
  config["config_groups"]["group_0"].erase("targets");
  EXPECT_EQ(error_of(config),
            "config.json: quantization_config.config_groups.group_0.targets: missing (expected a "
            "list of module names or \"re:\" patterns)");
  config = w4a16_config();
  config["config_groups"]["group_0"]["weights"].erase("num_bits");
  EXPECT_EQ(error_of(config),
            "config.json: quantization_config.config_groups.group_0.weights.num_bits: missing (expected 4 "
            "(W4A16))");
  EXPECT_EQ(error_of(json::array()), "config.json: quantization_config: expected an object, got []");
}

}  // namespace
}  // namespace qspec
