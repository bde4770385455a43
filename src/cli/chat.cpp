// qspec chat: a conversation on stdin/stdout with the model's chat template, each reply streamed.
// Lines from stdin are user turns; "/reset" clears the history, "/exit" or end of input ends the chat.
#include <fmt/format.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "cli/chat_input.h"
#include "cli/chat_reply.h"
#include "cli/commands.h"
#include "cli/model_run_options.h"
#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/model_tokenizer.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/utf8.h"

namespace qspec::cli {

namespace {

struct ChatArgs {
  ChatArgs() { run.max_tokens = 512; }  // a reply, possibly with reasoning, is longer than a test generation

  ModelRunOptions run;
  std::string system;
  bool no_thinking = false;
};

class ChatSession {
 public:
  explicit ChatSession(const ChatArgs& args)
      : args_(args),
        loaded_(LoadedModel::open(args.run.model_dir, args.run.backend, args.run.backend_options)),
        tokenizer_(std::move(*open_model_tokenizer(args.run.model_dir, args.run.tokenizer_dir,
                                                   loaded_.model->config().vocab_size, "chat"))),
        template_(ChatTemplate::from_model_dir(tokenizer_.directory)),
        end_of_turn_(end_of_turn_id(tokenizer_)) {
    reset();
  }

  void reset() {
    history_ = nlohmann::ordered_json::array();
    if (!args_.system.empty()) history_.push_back({{"role", "system"}, {"content", args_.system}});
  }

  // Simple and exact: the whole conversation is rendered again and prefilled into a fresh state each turn.
  // Reusing the previous turn's state for the unchanged prefix is later work.
  void reply_to(const std::string& user_line, int line_number) {
    utf8::require_valid(user_line, fmt::format("stdin line {}", line_number));
    history_.push_back({{"role", "user"}, {"content", user_line}});
    const ChatOptions options = cli_chat_options(args_.no_thinking);
    const std::vector<TokenId> prompt =
        tokenizer_.tokenizer.encode(render_chat(template_, history_, options));
    const int context = args_.run.context > 0 ? args_.run.context : int(prompt.size()) + args_.run.max_tokens;
    auto state = loaded_.model->new_state(context);

    GenerationOptions generation;
    generation.max_tokens = args_.run.max_tokens;
    generation.prefill_chunk = args_.run.prefill_chunk;
    generation.sampling = args_.run.sampling;
    generation.stop_ids.push_back(end_of_turn_);
    ChatReply reply(tokenizer_.tokenizer, /*in_reasoning=*/!args_.no_thinking, ::isatty(STDOUT_FILENO) != 0,
                    stdout);
    generate(*loaded_.model, *state, prompt, generation, [&](int32_t id) {
      reply.push(id);
      return true;
    });
    history_.push_back({{"role", "assistant"}, {"content", reply.finish()}});
  }

 private:
  const ChatArgs& args_;
  LoadedModel loaded_;
  ModelTokenizer tokenizer_;
  ChatTemplate template_;
  TokenId end_of_turn_;
  nlohmann::ordered_json history_;
};

void run_chat(const ChatArgs& args) {
  ChatSession session(args);
  const bool prompt_user = ::isatty(STDIN_FILENO) != 0;
  for (int line_number = 1;; ++line_number) {
    if (prompt_user) {
      fmt::print("> ");
      std::fflush(stdout);
    }
    std::string line;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      session.reset();
    } else if (!line.empty()) {
      session.reply_to(line, line_number);
    }
  }
}

}  // namespace

void register_chat(CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* cmd = app.add_subcommand(
      "chat", "chat on stdin/stdout with the model's chat template (/reset clears, /exit or EOF ends)");
  add_model_run_options(*cmd, args->run);
  cmd->add_option("--system", args->system, "system prompt");
  cmd->add_flag("--no-thinking", args->no_thinking, "render with enable_thinking false (no reasoning)");
  cmd->callback([args] { run_chat(*args); });
}

}  // namespace qspec::cli
