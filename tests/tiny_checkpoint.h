// Small Qwen3.5 configs and checkpoints for the config, checkpoint and inspect tests: a temporary directory,
// a tiny config.json, and a safetensors file holding the tensors a test asks for (zero-filled payloads;
// weight_shape tensors hold their module's [N, K] as a real checkpoint does).
#pragma once

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "temp_dir.h"

namespace qspec::tiny {

using testing_support::TempDir;

// H=64, FF=128, 4 layers (3 GDN + 1 attention), 4 heads / 2 KV heads of 32, GDN 2 key / 4 value heads of 16,
// vocab 256, conv kernel 4, rotary dim 8.
inline nlohmann::json tiny_text_config() {
  return nlohmann::json::parse(R"({
    "model_type": "qwen3_5_text",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 4096,
    "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_section": [1, 1, 2], "mrope_interleaved": true},
    "eos_token_id": 255
  })");
}

// The text config of Qwen/Qwen3.5-4B (reference/qwen35-model.md §1.1).
inline nlohmann::json qwen35_4b_text_config() {
  nlohmann::json text = tiny_text_config();
  text.update(nlohmann::json{{"vocab_size", 248320},
                             {"hidden_size", 2560},
                             {"intermediate_size", 9216},
                             {"num_hidden_layers", 32},
                             {"num_attention_heads", 16},
                             {"num_key_value_heads", 4},
                             {"head_dim", 256},
                             {"linear_num_key_heads", 16},
                             {"linear_num_value_heads", 32},
                             {"linear_key_head_dim", 128},
                             {"linear_value_head_dim", 128},
                             {"max_position_embeddings", 262144},
                             {"eos_token_id", 248044}});
  text["rope_parameters"]["mrope_section"] = {11, 11, 10};
  return text;
}

// The names and shapes of the 4B checkpoint's tensors outside the text model: 297 model.visual.* (shapes
// abridged) and 15 mtp.* (reference/qwen35-model.md §2.2).
inline std::vector<TensorSpec> qwen35_4b_skipped_tensors() {
  std::vector<TensorSpec> specs;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    specs.push_back(TensorSpec{std::move(name), std::move(shape), {DType::BF16}, 0, "dense"});
  };
  auto add_weight_bias = [&](const std::string& module, int64_t rows) {
    add(module + ".weight", {rows, 1024});
    add(module + ".bias", {rows});
  };
  add_weight_bias("model.visual.patch_embed.proj", 1024);
  add("model.visual.pos_embed.weight", {2304, 1024});
  for (int i = 0; i < 24; ++i)
    for (const char* module : {"norm1", "norm2", "attn.qkv", "attn.proj", "mlp.linear_fc1", "mlp.linear_fc2"})
      add_weight_bias("model.visual.blocks." + std::to_string(i) + "." + module, 1024);
  for (const char* module : {"norm", "linear_fc1", "linear_fc2"})
    add_weight_bias(std::string("model.visual.merger.") + module, 1024);
  add("mtp.fc.weight", {2560, 5120});
  for (const char* norm : {"pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"})
    add(std::string("mtp.") + norm + ".weight", {2560});
  const std::string layer = "mtp.layers.0.";
  add(layer + "input_layernorm.weight", {2560});
  add(layer + "post_attention_layernorm.weight", {2560});
  add(layer + "self_attn.q_proj.weight", {8192, 2560});
  add(layer + "self_attn.k_proj.weight", {1024, 2560});
  add(layer + "self_attn.v_proj.weight", {1024, 2560});
  add(layer + "self_attn.o_proj.weight", {2560, 4096});
  add(layer + "self_attn.q_norm.weight", {256});
  add(layer + "self_attn.k_norm.weight", {256});
  add(layer + "mlp.gate_proj.weight", {9216, 2560});
  add(layer + "mlp.up_proj.weight", {9216, 2560});
  add(layer + "mlp.down_proj.weight", {2560, 9216});
  return specs;
}

// A safetensors file whose header lists `specs` (in the first dtype each allows) and whose payload is a hole:
// a sparse file of the full size, for layouts too large to write (the 4B's 8.4 GB).
inline void write_header_only_safetensors(const std::filesystem::path& path,
                                          const std::vector<TensorSpec>& specs) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const TensorSpec& spec : specs) {
    uint64_t nbytes = dtype_size(spec.dtypes[0]);
    for (int64_t d : spec.shape) nbytes *= uint64_t(d);
    header[spec.name] = {{"dtype", dtype_name(spec.dtypes[0])},
                         {"shape", spec.shape},
                         {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  const std::string text = header.dump();
  const uint64_t length = text.size();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&length), sizeof(length));
    out << text;
  }
  std::filesystem::resize_file(path, sizeof(length) + length + offset);
}

// config.json of Qwen3_5ForConditionalGeneration around tiny_text_config().
inline nlohmann::json tiny_wrapper_config(bool tied) {
  nlohmann::json text = tiny_text_config();
  return {{"architectures", {"Qwen3_5ForConditionalGeneration"}},
          {"model_type", "qwen3_5"},
          {"tie_word_embeddings", tied},
          {"text_config", text}};
}

// W4A16 with `group_size`, everything but the GDN b/a projections and the LM head.
inline nlohmann::json w4a16_quantization_config(int group_size) {
  nlohmann::json config = nlohmann::json::parse(R"({
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "ignore": ["lm_head", "re:.*in_proj_[ab]$"],
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
      "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 0,
                  "actorder": null}}}
  })");
  config["config_groups"]["group_0"]["weights"]["group_size"] = group_size;
  return config;
}

// A zero-filled tensor.
inline TensorData zero_tensor(std::string name, DType dtype, std::vector<int64_t> shape) {
  size_t numel = 1;
  for (int64_t d : shape) numel *= size_t(d);
  return TensorData{std::move(name), dtype, std::move(shape),
                    std::vector<uint8_t>(numel * dtype_size(dtype))};
}

// One tensor per spec of text_model_schema(config), in the first dtype each spec allows.
inline std::vector<TensorData> schema_tensors(const Qwen35Config& config) {
  std::vector<TensorData> tensors;
  std::vector<int64_t> linear_shape;  // [N, K] of the last weight_packed, for the weight_shape after it
  for (const TensorSpec& spec : text_model_schema(config)) {
    tensors.push_back(zero_tensor(spec.name, spec.dtypes[0], spec.shape));
    if (spec.name.ends_with(".weight_packed")) linear_shape = {spec.shape[0], spec.shape[1] * 8};
    if (spec.name.ends_with(".weight_shape"))
      std::memcpy(tensors.back().bytes.data(), linear_shape.data(), 2 * sizeof(int64_t));
  }
  return tensors;
}

inline TensorData* find_tensor(std::vector<TensorData>& tensors, std::string_view name) {
  for (TensorData& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

inline void write_config(const std::filesystem::path& dir, const nlohmann::json& config) {
  std::ofstream(dir / "config.json") << config.dump(2);
}

inline void write_checkpoint(const std::filesystem::path& dir, const nlohmann::json& config,
                             const std::vector<TensorData>& tensors) {
  write_config(dir, config);
  write_safetensors((dir / "model.safetensors").string(), tensors);
}

}  // namespace qspec::tiny
