// qspec generate: one prompt (token ids, text, or a conversation rendered with the chat template) -> the
// generated text streamed to stdout (ids when the model has no tokenizer), or one JSON object with --json.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/chat_input.h"
#include "cli/commands.h"
#include "cli/model_run_options.h"
#include "core/error.h"
#include "engine/generated_text.h"
#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/model_tokenizer.h"
#include "engine/speculative.h"
#include "tokenizer/chat_template.h"

namespace qspec::cli {

namespace {

struct GenerateArgs {
  ModelRunOptions run;
  // Exactly one prompt.
  std::string prompt_ids;
  std::string prompt_text;
  std::string chat_file;
  bool no_thinking = false;
  bool json = false;
  bool ignore_eos = false;
  // Speculative decoding: a drafter and/or an oracle list of drafts.
  std::string draft_model;
  DraftHead draft_head = DraftHead::Target;
  std::string draft_oracle;
  SpeculativeOptions spec;
};

bool speculative(const GenerateArgs& args) {
  return !args.draft_model.empty() || !args.draft_oracle.empty();
}

// Mean tokens emitted per speculative step (accepted drafts + the target's own token).
double mean_acceptance_length(const GenerationResult& result) {
  return result.steps.empty()
             ? 0.0
             : double(result.accepted_tokens + int64_t(result.steps.size())) / double(result.steps.size());
}

// The option whose prompt is text, which needs a tokenizer; empty for ids.
const char* text_prompt_option(const GenerateArgs& args) {
  if (!args.prompt_text.empty()) return "--prompt";
  return args.chat_file.empty() ? "" : "--chat";
}

std::vector<TokenId> prompt_of(const GenerateArgs& args, const std::optional<ChatInput>& chat,
                               const std::optional<ModelTokenizer>& tokenizer) {
  if (!args.prompt_ids.empty()) return parse_token_ids(args.prompt_ids, "--prompt-ids");
  if (!chat) return tokenizer->tokenizer.encode(args.prompt_text);
  const std::string text = render_chat(ChatTemplate::from_model_dir(tokenizer->directory), chat->messages,
                                       cli_chat_options(args.no_thinking, chat->tools));
  return tokenizer->tokenizer.encode(text);
}

void run_generate(const GenerateArgs& args) {
  const int prompts = !args.prompt_ids.empty() + !args.prompt_text.empty() + !args.chat_file.empty();
  if (prompts != 1) fail("generate: give exactly one of --prompt-ids, --prompt, --chat");
  if (!speculative(args) && (args.spec.spec_tokens != 0 || args.spec.draft_window != 0))
    fail("generate: --spec-tokens and --draft-window need --draft-model or --draft-oracle");
  if (args.draft_model.empty() && args.draft_head != DraftHead::Target)
    fail("generate: --draft-head needs --draft-model");
  // A bad messages file fails before the model is loaded.
  std::optional<ChatInput> chat;
  if (!args.chat_file.empty()) chat = read_chat_input(args.chat_file);
  LoadedModel loaded = LoadedModel::open(args.run.model_dir, args.run.backend, args.run.backend_options);
  const Qwen35Config& config = loaded.model->config();
  const std::optional<ModelTokenizer> tokenizer = open_model_tokenizer(
      args.run.model_dir, args.run.tokenizer_dir, config.vocab_size, text_prompt_option(args));
  const std::vector<TokenId> prompt = prompt_of(args, chat, tokenizer);
  const int context = args.run.context > 0 ? args.run.context : int(prompt.size()) + args.run.max_tokens;
  auto state = loaded.model->new_state(context);
  std::optional<LoadedDrafter> drafter;
  std::unique_ptr<DFlashState> draft_state;
  if (!args.draft_model.empty()) {
    drafter = LoadedDrafter::open(args.draft_model, loaded, args.run.model_dir, args.draft_head);
    draft_state = drafter->model->new_state(context);
  }
  SpeculativeOptions spec = args.spec;
  if (!args.draft_oracle.empty())
    spec.oracle_drafts = read_draft_oracle(args.draft_oracle, config.vocab_size);

  GenerationOptions options;
  options.max_tokens = args.run.max_tokens;
  options.prefill_chunk = args.run.prefill_chunk;
  options.sampling = args.run.sampling;
  options.ignore_eos = args.ignore_eos;
  if (chat) options.stop_ids.push_back(end_of_turn_id(*tokenizer));
  std::optional<GeneratedText> stream;
  if (tokenizer && !args.json) stream.emplace(tokenizer->tokenizer);
  auto print_token = [&](int32_t id) {
    if (args.json) return true;
    if (stream) {
      fmt::print("{}", stream->push(id));
    } else {
      fmt::print("{} ", id);
    }
    std::fflush(stdout);
    return true;
  };
  GenerationResult result;
  if (speculative(args)) {
    const std::optional<Drafter> pair =
        drafter ? std::optional<Drafter>(Drafter{*drafter->model, *draft_state}) : std::nullopt;
    result = generate_speculative(*loaded.model, *state, pair ? &*pair : nullptr, prompt, options, spec,
                                  print_token);
  } else {
    result = generate(*loaded.model, *state, prompt, options, print_token);
  }
  if (args.json) {
    nlohmann::json out = {
        {"model", args.run.model_dir},
        {"architecture", config.architecture},
        {"backend", args.run.backend},
        {"prompt_tokens", prompt.size()},
        {"tokens", result.tokens},
        {"finish_reason", result.finish_reason},
        {"timings",
         {{"prefill_seconds", result.prefill_seconds},
          {"decode_seconds", result.decode_seconds},
          {"decode_tokens_per_second",
           result.decode_seconds > 0 ? double(result.tokens.size() - 1) / result.decode_seconds : 0.0}}},
    };
    if (tokenizer) out["text"] = generated_text(tokenizer->tokenizer, result.tokens);
    if (speculative(args)) {
      nlohmann::json steps = nlohmann::json::array();
      for (const SpeculativeStep& step : result.steps)
        steps.push_back({{"drafts", step.drafts}, {"accepted", step.accepted}});
      out["steps"] = steps;
      out["draft_tokens"] = result.draft_tokens;
      out["accepted_tokens"] = result.accepted_tokens;
      out["mean_acceptance_length"] = mean_acceptance_length(result);
    }
    fmt::print("{}\n", out.dump());
  } else {
    if (stream) fmt::print("{}", stream->finish());
    fmt::print("\n");
    std::fflush(stdout);  // the text ends before the summary on stderr, also when stdout is a pipe
    fmt::print(stderr, "{} tokens, finish: {}, prefill {:.3f} s, decode {:.3f} s\n", result.tokens.size(),
               result.finish_reason, result.prefill_seconds, result.decode_seconds);
    if (speculative(args))
      fmt::print(stderr, "{} speculative steps, {} of {} drafts accepted, mean acceptance length {:.2f}\n",
                 result.steps.size(), result.accepted_tokens, result.draft_tokens,
                 mean_acceptance_length(result));
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "generate text or tokens from a prompt");
  add_model_run_options(*cmd, args->run);
  cmd->add_option("--prompt-ids", args->prompt_ids, "prompt as comma-separated token ids");
  cmd->add_option("--prompt", args->prompt_text, "prompt as text, encoded with the tokenizer");
  cmd->add_option("--chat", args->chat_file,
                  "MESSAGES.json (an array of messages, or {\"messages\", \"tools\"}) rendered with the chat "
                  "template; generation also stops at <|im_end|>");
  cmd->add_flag("--no-thinking", args->no_thinking, "with --chat: render with enable_thinking false");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "do not stop at the model's EOS tokens");
  cmd->add_flag(
      "--json", args->json,
      "print one JSON object (with \"text\" when there is a tokenizer, \"steps\" when speculative)");
  cmd->add_option("--draft-model", args->draft_model, "DFlash drafter directory: speculative decoding");
  add_draft_head_option(*cmd, args->draft_head);
  cmd->add_option("--spec-tokens", args->spec.spec_tokens,
                  "drafts per step (default: the drafter's block size - 1, or 15 with --draft-oracle alone)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--draft-window", args->spec.draft_window,
                  "drafter sliding window: keys within W-1 positions, when context + block > W (0: off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option(
      "--draft-oracle", args->draft_oracle,
      "FILE.json, an array of token ids that replaces the drafter's proposals: the drafts after output "
      "position i are FILE[i..i+K-1] (a --draft-model given too still runs, for timing)");
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace qspec::cli
