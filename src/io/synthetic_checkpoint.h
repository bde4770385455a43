// Synthetic checkpoints with the exact tensor names, shapes, dtypes and quantization layout of a published
// model and random weights scaled so activations stay O(1). Real checkpoints cannot be downloaded here; speed
// is measured on these.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace qspec {

struct SynthOptions {
  std::string arch = "qwen3.5-4b";  // see synth_architectures(); "dflash-*" are drafters
  std::string format = "bf16";      // "bf16", "w4a16-g32", "w4a16-g128"
  uint64_t seed = 0;
  uint64_t shard_bytes = uint64_t(2) << 30;  // a new shard starts past this size
  std::string tokenizer_dir;                 // when set, its tokenizer files are copied into the checkpoint
};

std::vector<std::string> synth_architectures();
std::vector<std::string> synth_formats();

// The config.json a synthetic checkpoint gets (throws Error naming --arch / --format when unknown).
nlohmann::json synthetic_config(const SynthOptions& options);

// True for a DFlash drafter's config.json (architectures ["DFlashDraftModel"]).
bool is_drafter_config(const nlohmann::json& config);

// Writes config.json + model-0000i-of-0000N.safetensors + model.safetensors.index.json into `dir` (created).
void write_synthetic_checkpoint(const std::string& dir, const SynthOptions& options);

// A random drafter with the given config.json (e.g. one shaped for a test's target model).
void write_synthetic_drafter(const std::string& dir, const nlohmann::json& config, uint64_t seed);

}  // namespace qspec
