// qspec inspect --model DIR [--json]: what a checkpoint holds (architecture, layer pattern, quantization,
// tensors, parameters, bytes) and whether it matches its config. Reads config.json and the safetensors
// headers only, so it is instant on multi-GB checkpoints. Exits non-zero, after the report, when any tensor
// is missing, unexpected or mis-shaped.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/safetensors.h"

namespace qspec::cli {

namespace {

struct InspectOptions {
  std::string model_dir;
  bool json = false;
};

std::vector<std::string> entries(const std::vector<ModuleMatcher>& matchers) {
  std::vector<std::string> out;
  for (const ModuleMatcher& m : matchers) out.push_back(m.entry());
  return out;
}

nlohmann::json quantization_json(const Qwen35Config& config) {
  if (!config.quantization) return nullptr;
  const QuantizationConfig& q = *config.quantization;
  nlohmann::json groups = nlohmann::json::array();
  for (const QuantizationConfig::Group& g : q.groups)
    groups.push_back({{"name", g.name},
                      {"targets", entries(g.targets)},
                      {"num_bits", g.weights.num_bits},
                      {"group_size", g.weights.group_size}});
  return {{"format", q.format}, {"groups", groups}, {"ignore", entries(q.ignore)}};
}

nlohmann::json report_json(const Qwen35Config& c, const CheckpointReport& r) {
  nlohmann::json skipped = nlohmann::json::object();
  for (const auto& [prefix, s] : r.skipped) skipped[prefix] = {{"count", s.names.size()}, {"bytes", s.bytes}};
  nlohmann::json mismatched = nlohmann::json::array();
  for (const TensorMismatch& m : r.mismatched)
    mismatched.push_back({{"name", m.name}, {"expected", m.expected}, {"got", m.got}});
  return {
      {"model", r.source},
      {"architecture", r.architecture},
      {"tensor_prefix", c.tensor_prefix},
      {"layer_pattern", r.layer_pattern},
      {"config",
       {{"hidden_size", c.hidden_size},
        {"intermediate_size", c.intermediate_size},
        {"num_layers", c.num_layers},
        {"vocab_size", c.vocab_size},
        {"tie_word_embeddings", c.tie_word_embeddings},
        {"num_heads", c.num_heads},
        {"num_kv_heads", c.num_kv_heads},
        {"head_dim", c.head_dim},
        {"rotary_dim", c.rotary_dim},
        {"rope_theta", c.rope_theta},
        {"linear_num_key_heads", c.linear_num_key_heads},
        {"linear_num_value_heads", c.linear_num_value_heads},
        {"linear_key_head_dim", c.linear_key_head_dim},
        {"linear_value_head_dim", c.linear_value_head_dim},
        {"conv_kernel", c.conv_kernel},
        {"eos_token_ids", c.eos_token_ids}}},
      {"quantization", quantization_json(c)},
      {"expected_tensors", r.expected_tensors},
      {"text_params", r.text_params},
      {"bytes_by_dtype", r.bytes_by_dtype},
      {"bytes_by_format", r.bytes_by_format},
      {"skipped", skipped},
      {"missing", r.missing},
      {"unexpected", r.unexpected},
      {"mismatched", mismatched},
      {"ok", r.ok()},
  };
}

std::string human_bytes(uint64_t bytes) {
  if (bytes >= 1'000'000'000) return fmt::format("{:.2f} GB", double(bytes) / 1e9);
  if (bytes >= 1'000'000) return fmt::format("{:.2f} MB", double(bytes) / 1e6);
  if (bytes >= 1'000) return fmt::format("{:.2f} kB", double(bytes) / 1e3);
  return fmt::format("{} B", bytes);
}

std::string human_count(int64_t n) {
  if (n >= 1'000'000'000) return fmt::format("{} ({:.3f} B)", n, double(n) / 1e9);
  if (n >= 1'000'000) return fmt::format("{} ({:.2f} M)", n, double(n) / 1e6);
  return fmt::format("{}", n);
}

std::string byte_list(const std::map<std::string, uint64_t>& bytes) {
  std::vector<std::string> parts;
  for (const auto& [what, n] : bytes) parts.push_back(fmt::format("{} {}", what, human_bytes(n)));
  return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
}

void print_report(const Qwen35Config& c, const CheckpointReport& r) {
  fmt::print("checkpoint    {}\n", r.source);
  fmt::print("architecture  {} (tensors under {})\n", r.architecture, c.tensor_prefix);
  fmt::print("layers        {}: {}\n", c.num_layers, r.layer_pattern);
  fmt::print("model         hidden {}, intermediate {}, vocab {}, embeddings {}\n", c.hidden_size,
             c.intermediate_size, c.vocab_size, c.tie_word_embeddings ? "tied" : "untied");
  fmt::print("attention     {} heads, {} KV heads, head dim {}, rotary dim {}, theta {}\n", c.num_heads,
             c.num_kv_heads, c.head_dim, c.rotary_dim, c.rope_theta);
  fmt::print("gated delta   {} key heads x {}, {} value heads x {}, conv kernel {}\n", c.linear_num_key_heads,
             c.linear_key_head_dim, c.linear_num_value_heads, c.linear_value_head_dim, c.conv_kernel);
  if (c.quantization) {
    for (const QuantizationConfig::Group& g : c.quantization->groups)
      fmt::print("quantization  {}: W{}A16 g{} ({}) for {}\n", g.name, g.weights.num_bits,
                 g.weights.group_size, c.quantization->format, fmt::join(entries(g.targets), ", "));
    fmt::print("  dense       {}\n", fmt::join(entries(c.quantization->ignore), ", "));
  } else {
    fmt::print("quantization  none\n");
  }
  fmt::print("tensors       {} expected, {} missing\n", r.expected_tensors, r.missing.size());
  for (const auto& [prefix, s] : r.skipped)
    fmt::print("  skipped     {}* {} tensors, {}\n", prefix, s.names.size(), human_bytes(s.bytes));
  fmt::print("parameters    {}\n", human_count(r.text_params));
  fmt::print("bytes         {}\n", byte_list(r.bytes_by_dtype));
  fmt::print("              {}\n", byte_list(r.bytes_by_format));
  if (r.ok()) {
    fmt::print("status        ok\n");
  } else {
    fmt::print("status        {} problem tensors\n{}\n",
               r.missing.size() + r.unexpected.size() + r.mismatched.size(), r.problems());
  }
}

void run_inspect(const InspectOptions& options) {
  const Qwen35Config config = Qwen35Config::load(options.model_dir);
  const TensorStore store = TensorStore::open_dir(options.model_dir);
  const CheckpointReport report = check_checkpoint(config, store);
  if (options.json)
    fmt::print("{}\n", report_json(config, report).dump(2));
  else
    print_report(config, report);
  std::fflush(stdout);
  if (!report.ok())
    fail("{}: checkpoint does not match its config ({} missing, {} unexpected, {} mis-shaped tensors)",
         report.source, report.missing.size(), report.unexpected.size(), report.mismatched.size());
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* command =
      app.add_subcommand("inspect", "what a checkpoint holds: architecture, tensors, quantization");
  command->add_option("--model", options->model_dir, "checkpoint directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  command->add_flag("--json", options->json, "print one JSON object instead of text");
  command->callback([options] { run_inspect(*options); });
}

}  // namespace qspec::cli
