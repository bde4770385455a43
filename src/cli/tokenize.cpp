// qspec tokenize: text -> ids (comma-separated, or JSON with the tokens) and ids -> text, with a model
// directory's tokenizer; a conversation is rendered with the directory's chat template first.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/chat_input.h"
#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {

struct TokenizeArgs {
  std::string model_dir;
  // Exactly one source: text to encode, a file to encode, a conversation to render and encode, or ids to
  // decode.
  std::string text;
  std::string file;
  std::string chat_file;
  std::string decode_ids;
  bool no_thinking = false;
  bool json = false;
  bool no_special = false;
  int bench_repeats = 0;  // > 0: time that many encodes of the input instead of printing ids
};

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("--file {}: cannot open", path);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

// Every input source other than --decode becomes text here.
std::string text_to_encode(const TokenizeArgs& args) {
  if (!args.file.empty()) return read_file(args.file);
  if (!args.chat_file.empty()) {
    const ChatInput chat = read_chat_input(args.chat_file);
    return render_chat(ChatTemplate::from_model_dir(args.model_dir), chat.messages,
                       cli_chat_options(args.no_thinking, chat.tools));
  }
  return args.text;
}

nlohmann::json token_texts(const Tokenizer& tokenizer, const std::vector<TokenId>& ids) {
  nlohmann::json tokens = nlohmann::json::array();
  for (const TokenId id : ids) tokens.push_back(tokenizer.token_text(id));
  return tokens;
}

void run_encode(const Tokenizer& tokenizer, const TokenizeArgs& args) {
  const std::string text = text_to_encode(args);
  const std::vector<TokenId> ids = tokenizer.encode(text, {.special_tokens_as_text = args.no_special});
  if (args.json) {
    nlohmann::json out{{"ids", ids}, {"tokens", token_texts(tokenizer, ids)}};
    // A rendered conversation is text the user did not write; show it.
    if (!args.chat_file.empty()) out["text"] = text;
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("{}\n", fmt::join(ids, ","));
  }
}

void run_decode(const Tokenizer& tokenizer, const TokenizeArgs& args) {
  const std::vector<TokenId> ids = parse_token_ids(args.decode_ids, "--decode");
  const std::string text = tokenizer.decode(ids, /*skip_special=*/args.no_special);
  if (args.json) {
    const nlohmann::json out{{"text", text}, {"tokens", token_texts(tokenizer, ids)}};
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("{}", text);
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Single-threaded encode speed; the first encode runs on a cold BPE cache, the best one on a warm cache.
void run_bench(const TokenizeArgs& args) {
  if (!args.decode_ids.empty()) fail("--bench: times encoding; give --text, --file or --chat");
  auto start = std::chrono::steady_clock::now();
  const Tokenizer tokenizer(args.model_dir);
  const double load_seconds = seconds_since(start);
  const std::string text = text_to_encode(args);
  const EncodeOptions options{.special_tokens_as_text = args.no_special};
  double first_seconds = 0, best_seconds = 0;
  size_t tokens = 0;
  for (int repeat = 0; repeat < args.bench_repeats; ++repeat) {
    start = std::chrono::steady_clock::now();
    tokens = tokenizer.encode(text, options).size();
    const double seconds = seconds_since(start);
    first_seconds = repeat == 0 ? seconds : first_seconds;
    best_seconds = repeat == 0 ? seconds : std::min(best_seconds, seconds);
  }
  const auto megabytes = static_cast<double>(text.size()) / 1e6;
  const nlohmann::json out{{"load_s", load_seconds},
                           {"bytes", text.size()},
                           {"tokens", tokens},
                           {"repeats", args.bench_repeats},
                           {"first_s", first_seconds},
                           {"best_s", best_seconds},
                           {"mb_per_s_first", megabytes / first_seconds},
                           {"mb_per_s_best", megabytes / best_seconds}};
  fmt::print("{}\n", out.dump());
}

void run_tokenize(const TokenizeArgs& args) {
  const int sources =
      !args.text.empty() + !args.file.empty() + !args.chat_file.empty() + !args.decode_ids.empty();
  if (sources != 1) fail("tokenize: give exactly one of --text, --file, --chat, --decode");
  if (args.bench_repeats > 0) {
    run_bench(args);
    return;
  }
  const Tokenizer tokenizer(args.model_dir);
  if (!args.decode_ids.empty()) {
    run_decode(tokenizer, args);
  } else {
    run_encode(tokenizer, args);
  }
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* command = app.add_subcommand("tokenize", "text <-> token ids with a model's tokenizer");
  command->add_option("--model", args->model_dir, "directory with tokenizer.json (+ tokenizer_config.json)")
      ->required();
  command->add_option("--text", args->text, "text to encode");
  command->add_option("--file", args->file, "file whose contents to encode");
  command->add_option("--chat", args->chat_file,
                      "MESSAGES.json (an array of messages, or {\"messages\", \"tools\"}) to render with "
                      "the chat template (with the generation prompt) and encode");
  command->add_flag("--no-thinking", args->no_thinking, "with --chat: render with enable_thinking false");
  command->add_option("--decode", args->decode_ids, "comma-separated ids to decode");
  command->add_flag("--json", args->json,
                    "print {\"ids\", \"tokens\"} (+ the rendered \"text\" with --chat; {\"text\", "
                    "\"tokens\"} for --decode)");
  command->add_flag("--no-special", args->no_special,
                    "encode control tokens such as <|im_start|> as plain text; with --decode, drop them");
  command->add_option("--bench", args->bench_repeats, "time N encodes of the input; print timing JSON")
      ->check(CLI::PositiveNumber);
  command->callback([args] { run_tokenize(*args); });
}

}  // namespace qspec::cli
