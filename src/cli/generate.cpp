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
};

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
  // A bad messages file fails before the model is loaded.
  std::optional<ChatInput> chat;
  if (!args.chat_file.empty()) chat = read_chat_input(args.chat_file);
  LoadedModel loaded = LoadedModel::open(args.run.model_dir, args.run.backend);
  const Qwen35Config& config = loaded.model->config();
  const std::optional<ModelTokenizer> tokenizer = open_model_tokenizer(
      args.run.model_dir, args.run.tokenizer_dir, config.vocab_size, text_prompt_option(args));
  const std::vector<TokenId> prompt = prompt_of(args, chat, tokenizer);
  const int context = args.run.context > 0 ? args.run.context : int(prompt.size()) + args.run.max_tokens;
  auto state = loaded.model->new_state(context);

  GenerationOptions options;
  options.max_tokens = args.run.max_tokens;
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
  GenerationResult result = generate(*loaded.model, *state, prompt, options, print_token);
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
    fmt::print("{}\n", out.dump());
  } else {
    if (stream) fmt::print("{}", stream->finish());
    fmt::print("\n");
    std::fflush(stdout);  // the text ends before the summary on stderr, also when stdout is a pipe
    fmt::print(stderr, "{} tokens, finish: {}, prefill {:.3f} s, decode {:.3f} s\n", result.tokens.size(),
               result.finish_reason, result.prefill_seconds, result.decode_seconds);
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
  cmd->add_flag("--json", args->json, "print one JSON object (with \"text\" when there is a tokenizer)");
  cmd->callback([args] { run_generate(*args); });
}

}  // namespace qspec::cli
