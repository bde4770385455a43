#include "io/quant_config.h"

#include <nlohmann/json.hpp>

#include <map>

#include "core/error.h"
#include "io/config_fields.h"

namespace qspec {

namespace {

constexpr std::string_view kRegexPrefix = "re:";

std::vector<ModuleMatcher> parse_module_list(const ConfigFields& fields, std::string_view key) {
  constexpr std::string_view expected = "a list of module names or \"re:\" patterns";
  const nlohmann::json& list = fields.require(key, expected);
  if (!list.is_array()) fields.fail_field(key, expected);
  std::vector<ModuleMatcher> matchers;
  for (size_t i = 0; i < list.size(); ++i) {
    std::string field = fmt::format("{}[{}]", fields.path_of(key), i);
    if (!list[i].is_string())
      fail("{}: {}: expected a module name or \"re:\" pattern, got {}", fields.source(), field,
           json_excerpt(list[i]));
    matchers.emplace_back(list[i].get<std::string>(), fields.source() + ": " + field);
  }
  return matchers;
}

// The field must be absent or null: qspec runs W4A16 only.
void require_null(const ConfigFields& fields, std::string_view key, std::string_view why) {
  if (fields.has(key)) fields.fail_field(key, fmt::format("null ({})", why));
}

void require_string(const ConfigFields& fields, std::string_view key, std::string_view expected) {
  if (fields.string(key) != expected) fields.fail_field(key, fmt::format("\"{}\"", expected));
}

WeightQuantScheme parse_weights(const ConfigFields& weights) {
  WeightQuantScheme scheme;
  const nlohmann::json& bits = weights.require("num_bits", "4 (W4A16)");
  if (!bits.is_number_integer() || bits.get<int64_t>() != 4) weights.fail_field("num_bits", "4 (W4A16)");
  scheme.num_bits = 4;
  require_string(weights, "type", "int");
  if (!weights.boolean("symmetric", true))
    weights.fail_field("symmetric", "true: asymmetric (zero points) not supported");
  if (weights.boolean("dynamic", false)) weights.fail_field("dynamic", "false (static weight scales)");
  if (auto strategy = weights.optional_string("strategy"); strategy && *strategy != "group")
    weights.fail_field("strategy", "\"group\" (per-group scales; other strategies not supported)");
  scheme.group_size = weights.positive_int("group_size");
  if (auto actorder = weights.optional_string("actorder")) {
    if (*actorder == "group" || *actorder == "dynamic")
      weights.fail_field("actorder", "null, \"static\" or \"weight\": act-order g_idx not supported");
    if (*actorder != "static" && *actorder != "weight")
      weights.fail_field("actorder", "null, \"static\" or \"weight\"");
  }
  require_null(weights, "block_structure", "block quantization not supported");
  return scheme;
}

QuantizationConfig::Group parse_group(const ConfigFields& group, const std::string& name) {
  if (auto format = group.optional_string("format"); format && *format != "pack-quantized")
    group.fail_field("format", "\"pack-quantized\"");
  require_null(group, "input_activations", "W4A16: activations are not quantized");
  require_null(group, "output_activations", "W4A16: activations are not quantized");
  QuantizationConfig::Group parsed{name, parse_module_list(group, "targets"),
                                   parse_weights(group.object("weights"))};
  if (parsed.targets.empty()) group.fail_field("targets", "at least one target");
  return parsed;
}

}  // namespace

ModuleMatcher::ModuleMatcher(std::string entry, const std::string& field) : entry_(std::move(entry)) {
  if (!entry_.starts_with(kRegexPrefix)) return;
  try {
    regex_.emplace(entry_.substr(kRegexPrefix.size()), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail("{}: invalid regex \"{}\": {}", field, entry_, e.what());
  }
}

bool ModuleMatcher::matches_name(const std::string& module) const {
  if (!regex_) return entry_ == module;
  // match_continuous anchors the match at the start of the name and leaves its end free, like Python's
  // re.match.
  return std::regex_search(module, *regex_, std::regex_constants::match_continuous);
}

std::optional<WeightQuantScheme> QuantizationConfig::scheme_for(const std::string& module) const {
  for (const ModuleMatcher& entry : ignore)
    if (entry.matches(module)) return std::nullopt;

  // Target entry -> its group, sorted by entry text as compressed-tensors sorts them.
  std::map<std::string, std::pair<const ModuleMatcher*, const Group*>> targets;
  for (const Group& group : groups)
    for (const ModuleMatcher& target : group.targets)
      targets.emplace(target.entry(), std::pair{&target, &group});

  auto first_match = [&](auto&& accepts) -> std::optional<WeightQuantScheme> {
    for (const auto& [entry, target] : targets)
      if (accepts(*target.first)) return target.second->weights;
    return std::nullopt;
  };
  if (auto exact =
          first_match([&](const ModuleMatcher& t) { return !t.is_regex() && t.matches_name(module); }))
    return exact;
  if (auto regex =
          first_match([&](const ModuleMatcher& t) { return t.is_regex() && t.matches_name(module); }))
    return regex;
  return first_match([](const ModuleMatcher& t) { return t.is_class(); });
}

QuantizationConfig QuantizationConfig::parse(const nlohmann::json& quantization_config,
                                             const std::string& source) {
  ConfigFields fields(quantization_config, source, "quantization_config");
  require_string(fields, "quant_method", "compressed-tensors");
  QuantizationConfig config;
  config.format = fields.string("format");
  if (config.format != "pack-quantized")
    fields.fail_field("format",
                      "\"pack-quantized\" (W4A16 packed int4; other compressed-tensors formats are not "
                      "supported)");
  require_null(fields, "kv_cache_scheme", "KV cache quantization not supported");
  // compressed-tensors writes {} for "no transforms" and "no sparsity".
  if (fields.has("transform_config")) {
    ConfigFields transforms = fields.object("transform_config");
    if (transforms.has("config_groups") && !transforms.at("config_groups").empty())
      transforms.fail_field("config_groups", "none (weight transforms not supported)");
  }
  if (fields.has("sparsity_config")) {
    ConfigFields sparsity = fields.object("sparsity_config");
    if (auto format = sparsity.optional_string("format"); format && *format != "dense")
      sparsity.fail_field("format", "\"dense\" (sparse weights not supported)");
  }

  ConfigFields groups = fields.object("config_groups");
  // compressed-tensors gives a target listed twice to the later group in file order, which nlohmann::json
  // (keys sorted) does not keep: such a config is rejected rather than read differently.
  std::map<std::string, std::string> group_of_target;
  for (const auto& [name, group] : quantization_config.at("config_groups").items()) {
    config.groups.push_back(parse_group(groups.object(name), name));
    for (const ModuleMatcher& target : config.groups.back().targets)
      if (auto [it, added] = group_of_target.emplace(target.entry(), name); !added)
        fail("{}: {}: target \"{}\" is also listed by group {} (ambiguous)", source,
             groups.object(name).path_of("targets"), target.entry(), it->second);
  }
  if (config.groups.empty()) fields.fail_field("config_groups", "at least one group");
  if (fields.has("ignore")) config.ignore = parse_module_list(fields, "ignore");
  return config;
}

}  // namespace qspec
