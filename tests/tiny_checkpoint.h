// Small Qwen3.5 configs and checkpoints for the config, checkpoint and inspect tests: a temporary directory,
// a tiny config.json, and a safetensors file holding the tensors a test asks for (zero-filled payloads;
// weight_shape tensors hold their module's [N, K] as a real checkpoint does).
#pragma once

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace qspec::tiny {

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("qspec-cfg-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

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
