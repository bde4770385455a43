// qspec tokenize: text -> ids (comma-separated, or JSON with the tokens) and ids -> text, with a model
// directory's tokenizer.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {
namespace {

struct TokenizeArgs {
  std::string model_dir;
  // Exactly one source: text to encode, a file to encode, or ids to decode.
  std::string text;
  std::string file;
  std::string decode_ids;
  bool json = false;
  bool no_special = false;
};

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("--file {}: cannot open", path);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

std::string text_to_encode(const TokenizeArgs& args) {
  if (!args.file.empty()) return read_file(args.file);
  return args.text;
}

nlohmann::json token_texts(const Tokenizer& tokenizer, const std::vector<TokenId>& ids) {
  nlohmann::json tokens = nlohmann::json::array();
  for (const TokenId id : ids) tokens.push_back(tokenizer.token_text(id));
  return tokens;
}

void run_encode(const Tokenizer& tokenizer, const TokenizeArgs& args) {
  const std::vector<TokenId> ids =
      tokenizer.encode(text_to_encode(args), {.special_tokens_as_text = args.no_special});
  if (args.json) {
    const nlohmann::json out{{"ids", ids}, {"tokens", token_texts(tokenizer, ids)}};
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

void run_tokenize(const TokenizeArgs& args) {
  const int sources = !args.text.empty() + !args.file.empty() + !args.decode_ids.empty();
  if (sources != 1) fail("tokenize: give exactly one of --text, --file, --decode");
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
  command->add_option("--decode", args->decode_ids, "comma-separated ids to decode");
  command->add_flag("--json", args->json,
                    "print {\"ids\", \"tokens\"} (or {\"text\", \"tokens\"} for --decode)");
  command->add_flag("--no-special", args->no_special,
                    "encode control tokens such as <|im_start|> as plain text; with --decode, drop them");
  command->callback([args] { run_tokenize(*args); });
}

}  // namespace qspec::cli
