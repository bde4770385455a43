// Helpers of the speculative-decoding tests: the fixture models, and reading backend tensors to the host.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "fixture_files.h"
#include "io/synthetic_checkpoint.h"
#include "model/qwen35.h"

namespace qspec::speculative_testing {

// The Qwen3.5 fixture checkpoints of tools/oracle/make_qwen35_fixtures.py, sorted.
inline std::vector<std::filesystem::path> target_fixture_dirs() {
  return fixture_files::fixture_dirs("qwen35", "config.json");
}

// A gtest parameter name from a fixture directory ("causal-tied-bf16" -> "causal_tied_bf16").
inline std::string fixture_test_name(const std::filesystem::path& dir) {
  std::string name = dir.filename().string();
  std::replace_if(
      name.begin(), name.end(), [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }, '_');
  return name;
}

// A contiguous F32 tensor's values.
inline std::vector<float> read_floats(Backend& backend, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  backend.read(out.data(), t);
  return out;
}

// Every buffer of a target state, as the host sees it: conv and recurrent states, and the KV rows before
// n_past.
inline std::vector<std::vector<float>> state_contents(Backend& backend, const Qwen35State& state) {
  std::vector<std::vector<float>> contents;
  for (const Qwen35State::Layer& layer : state.layers) {
    if (layer.conv_state) {
      contents.push_back(read_floats(backend, layer.conv_state->tensor()));
      contents.push_back(read_floats(backend, layer.recurrent_state->tensor()));
    } else {
      contents.push_back(read_floats(backend, layer.k_cache->tensor().rows_view(0, state.n_past)));
      contents.push_back(read_floats(backend, layer.v_cache->tensor().rows_view(0, state.n_past)));
    }
  }
  return contents;
}

// The config.json of a small random DFlash drafter for `target`: block 16, two layers reading the target's
// first and last layers, the mask token near the end of the vocabulary.
inline nlohmann::json drafter_config_for(const Qwen35Config& target) {
  return {{"architectures", {"DFlashDraftModel"}},
          {"model_type", "qwen3"},
          {"block_size", 16},
          {"dflash_config",
           {{"mask_token_id", target.vocab_size - 3}, {"target_layer_ids", {0, target.num_layers - 1}}}},
          {"num_hidden_layers", 2},
          {"num_target_layers", target.num_layers},
          {"hidden_size", target.hidden_size},
          {"intermediate_size", 2 * target.hidden_size},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 16},
          {"rope_theta", 10000000},
          {"rms_norm_eps", 1e-6},
          {"vocab_size", target.vocab_size}};
}

}  // namespace qspec::speculative_testing
