// qspec generate: one prompt (token ids) -> generated ids on stdout, or one JSON object with --json.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "engine/generator.h"
#include "engine/loaded_model.h"

namespace qspec::cli {

namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt_ids;
  std::string backend = "cpu";
  int max_tokens = 32;
  int context = 0;
  bool json = false;
  bool ignore_eos = false;
  SamplingParams sampling;
};

std::vector<int32_t> parse_ids(const std::string& text, const char* option) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 0 || value > INT32_MAX)
      fail("{}: expected comma-separated non-negative token ids, got '{}'", option, item);
    ids.push_back(int32_t(value));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

void run_generate(const GenerateArgs& args) {
  std::vector<int32_t> prompt = parse_ids(args.prompt_ids, "--prompt-ids");
  LoadedModel loaded = LoadedModel::open(args.model_dir, args.backend);
  const Qwen35Config& config = loaded.model->config();
  int context = args.context > 0 ? args.context : int(prompt.size()) + args.max_tokens;
  auto state = loaded.model->new_state(context);

  GenerationOptions options;
  options.max_tokens = args.max_tokens;
  options.sampling = args.sampling;
  options.ignore_eos = args.ignore_eos;
  auto print_token = [&](int32_t id) {
    if (!args.json) {
      fmt::print("{} ", id);
      std::fflush(stdout);
    }
    return true;
  };
  GenerationResult result = generate(*loaded.model, *state, prompt, options, print_token);
  if (args.json) {
    nlohmann::json out = {
        {"model", args.model_dir},
        {"architecture", config.architecture},
        {"backend", args.backend},
        {"prompt_tokens", prompt.size()},
        {"tokens", result.tokens},
        {"finish_reason", result.finish_reason},
        {"timings",
         {{"prefill_seconds", result.prefill_seconds},
          {"decode_seconds", result.decode_seconds},
          {"decode_tokens_per_second",
           result.decode_seconds > 0 ? double(result.tokens.size() - 1) / result.decode_seconds : 0.0}}},
    };
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("\n");
    fmt::print(stderr, "{} tokens, finish: {}, prefill {:.3f} s, decode {:.3f} s\n", result.tokens.size(),
               result.finish_reason, result.prefill_seconds, result.decode_seconds);
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "generate tokens from a prompt");
  cmd->add_option("--model", args->model_dir, "checkpoint directory")->required();
  cmd->add_option("--prompt-ids", args->prompt_ids, "prompt as comma-separated token ids")->required();
  cmd->add_option("--max-tokens,-n", args->max_tokens, "tokens to generate")->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", args->sampling.temperature, "0 = greedy");
  cmd->add_option("--top-k", args->sampling.top_k, "0 = all");
  cmd->add_option("--top-p", args->sampling.top_p);
  cmd->add_option("--seed", args->sampling.seed);
  cmd->add_option("--backend", args->backend, "cpu");
  cmd->add_option("--ctx-size", args->context, "context length (default: prompt + max tokens)");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "do not stop at the model's EOS tokens");
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace qspec::cli
