// compressed-tensors quantization_config (format "pack-quantized", symmetric int4 group quantization: W4A16).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace qspec {

struct WeightQuantScheme {
  int num_bits = 4;
  int group_size = 128;
};

// One entry of `targets` or `ignore`: a module name ("lm_head"), the class name "Linear" (every module qspec
// asks about is a Linear), or "re:" + a regex over module names. Regexes follow Python's re.match, as
// compressed-tensors does: anchored at the start of the name only ("re:.*mlp" matches "...mlp.up_proj"). They
// are compiled as ECMAScript, which agrees with Python's syntax for the patterns these configs use.
class ModuleMatcher {
 public:
  // Throws Error naming `field` when the regex does not compile.
  ModuleMatcher(std::string entry, const std::string& field);

  const std::string& entry() const { return entry_; }
  bool is_regex() const { return regex_.has_value(); }
  bool is_class() const { return entry_ == "Linear"; }
  bool matches_name(const std::string& module) const;  // exact name or regex; not the class
  bool matches(const std::string& module) const { return is_class() || matches_name(module); }

 private:
  std::string entry_;
  std::optional<std::regex> regex_;
};

struct QuantizationConfig {
  struct Group {
    std::string name;  // the key in config_groups ("group_0")
    std::vector<ModuleMatcher> targets;
    WeightQuantScheme weights;
  };
  std::string format;  // "pack-quantized"
  std::vector<Group> groups;
  std::vector<ModuleMatcher> ignore;  // modules that stay dense

  // The scheme for a Linear module name ("model.language_model.layers.0.mlp.up_proj"), or nullopt when the
  // module stays dense (ignored or targeted by no group). As in compressed-tensors, an exact-name target wins
  // over a regex target (regexes tried in sorted order), which wins over "Linear".
  std::optional<WeightQuantScheme> scheme_for(const std::string& module) const;

  // Parses the quantization_config object of config.json; rejects clearly (naming the field) any format other
  // than pack-quantized, asymmetric weights, act-order group indices, bits != 4, activation quantization, and
  // a target listed by two groups.
  static QuantizationConfig parse(const nlohmann::json& quantization_config, const std::string& source);
};

}  // namespace qspec
