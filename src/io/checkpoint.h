// The tensors a Qwen3.5 text model must have (names, shapes, dtypes, as its config and quantization_config
// say) and their validation against a TensorStore. Everything here works from the safetensors headers: no
// tensor bytes are read, except the 2-element weight_shape of a quantized module in find_linear.
//
// For the model loader:
//   - names: model_tensor(c, "embed_tokens.weight"), layer_module(c, i, "mlp.up_proj"), kLmHeadModule;
//   - check_checkpoint(c, store) once, then find_linear(...) for each Linear module (dense or W4A16) and
//     store.get(name) for the other tensors, whose shapes and dtypes check_checkpoint has then verified.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace qspec {

// The top-level name of the untied LM head (no tensor prefix, in both architectures).
inline constexpr std::string_view kLmHeadModule = "lm_head";

// config.tensor_prefix + suffix: "model.language_model.embed_tokens.weight".
std::string model_tensor(const Qwen35Config& config, std::string_view suffix);
// config.tensor_prefix + "layers.{layer}." + suffix: "model.language_model.layers.3.self_attn.q_proj".
std::string layer_module(const Qwen35Config& config, int layer, std::string_view suffix);

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<DType> dtypes;  // any one of these
  int64_t params = 0;  // model parameters it holds: numel, N*K for weight_packed, 0 for scales and shapes
  std::string format;  // "dense" or "W4A16 g128"
};

// The tensors of the Linear module `module` with weight [out_features, in_features]: `<module>.weight` (BF16,
// F16 or F32) when dense; when quantization_config quantizes it, `<module>.weight_packed` I32 [N, K/8],
// `.weight_scale` BF16/F16 [N, K/group], `.weight_shape` I64/I32 [2]. Throws Error naming the module when K
// is not a multiple of 8 and of the group size.
std::vector<TensorSpec> linear_tensor_specs(const Qwen35Config& config, const std::string& module,
                                            int64_t out_features, int64_t in_features);

// Every tensor of the text model, embeddings first, then layer by layer.
std::vector<TensorSpec> text_model_schema(const Qwen35Config& config);

// The validated tensors of one Linear module: `weight` when dense, else `packed` + `scales` + `group_size`.
struct LinearTensors {
  const TensorView* weight = nullptr;  // [N, K] BF16/F16/F32
  const TensorView* packed = nullptr;  // I32 [N, K/8], 8 nibbles per word, LSB first, value = nibble - 8
  const TensorView* scales = nullptr;  // BF16/F16 [N, K/group_size]
  int group_size = 0;

  bool quantized() const { return packed != nullptr; }
};

// Finds and validates the tensors of `module` (shapes and dtypes as linear_tensor_specs says; weight_shape
// holds [N, K]; no weight_zero_point / weight_g_idx); throws Error naming the module and what was expected.
LinearTensors find_linear(const Qwen35Config& config, const TensorStore& store, const std::string& module,
                          int64_t out_features, int64_t in_features);

struct TensorMismatch {
  std::string name;
  std::string expected;  // "BF16|F16|F32 [64, 32]" or why the tensor must not be there
  std::string got;       // "I8 [64, 32]"
};

struct SkippedTensors {
  std::vector<std::string> names;
  uint64_t bytes = 0;
};

struct CheckpointReport {
  std::string source;  // the checkpoint directory or file
  std::string architecture;
  std::string layer_pattern;
  size_t expected_tensors = 0;  // in the text model's schema
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;  // neither in the schema nor under a skipped prefix
  std::vector<TensorMismatch> mismatched;
  std::map<std::string, SkippedTensors> skipped;    // by prefix ("mtp.")
  int64_t text_params = 0;                          // quantized linears count N*K
  std::map<std::string, uint64_t> bytes_by_dtype;   // text-model tensors present, by dtype name
  std::map<std::string, uint64_t> bytes_by_format;  // text-model tensors present, "dense" or "W4A16 g128"

  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  // One line per problem tensor: "missing NAME", "unexpected NAME", "NAME: expected ..., got ...".
  std::string problems() const;
};

// Compares the store with text_model_schema(config) from the headers alone.
CheckpointReport check_checkpoint(const Qwen35Config& config, const TensorStore& store);

}  // namespace qspec
