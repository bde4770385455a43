// compressed-tensors quantization_config (format "pack-quantized", symmetric int4 group quantization: W4A16).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <string>
#include <vector>

namespace qspec {

struct WeightQuantScheme {
  int num_bits = 4;
  int group_size = 128;
};

struct QuantizationConfig {
  struct Group {
    std::vector<std::string> targets;  // class names ("Linear") or "re:" regexes over module names
    WeightQuantScheme weights;
  };
  std::string format;  // "pack-quantized"
  std::vector<Group> groups;
  std::vector<std::string> ignore;  // module names or "re:" regexes that stay dense

  // The scheme for a Linear module name ("model.language_model.layers.0.mlp.up_proj"), or nullopt when the
  // module stays dense (ignored or targeted by no group).
  std::optional<WeightQuantScheme> scheme_for(const std::string& module) const;

  // Parses the quantization_config object of config.json; rejects clearly (naming the field) any format other
  // than pack-quantized, asymmetric weights, act-order group indices, bits != 4, activation quantization.
  static QuantizationConfig parse(const nlohmann::json& quantization_config, const std::string& source);
};

}  // namespace qspec
