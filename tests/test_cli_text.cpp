// Text in, text out through the qspec binary: tokenize --chat, generate --prompt/--chat and qspec chat, end
// to end on a tiny random Qwen3.5 with the real vocabulary (qspec synth --arch qwen3.5-tiny), and their
// errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/half.h"
#include "run_command.h"
#include "temp_dir.h"
#include "test_tokenizer_support.h"
#include "tokenizer/utf8.h"

namespace qspec {
namespace {

namespace fs = std::filesystem;
using testing_support::CommandResult;
using testing_support::run_command;

const std::string kTokenizerDir = test::qwen_tokenizer_dir();
const std::string kVocab256Model = std::string(QSPEC_FIXTURES_DIR) + "/qwen35/causal-tied-bf16";

CommandResult qspec(const std::string& arguments) {
  return run_command(std::string(QSPEC_BINARY) + " " + arguments);
}

const nlohmann::ordered_json& oracle_case(const std::string& name) {
  static const nlohmann::ordered_json fixture = nlohmann::ordered_json::parse(
      std::ifstream(fs::path(QSPEC_FIXTURES_DIR) / "chat_template" / "cases.json"));
  for (const auto& test_case : fixture["cases"])
    if (test_case["name"] == name) return test_case;
  throw std::runtime_error("no chat template case " + name);
}

// What generate and chat print for generated ids: special tokens and ids without a token dropped.
std::string text_of(const std::vector<TokenId>& ids) {
  std::vector<TokenId> tokens;
  for (const TokenId id : ids)
    if (test::qwen_tokenizer().has_token(id)) tokens.push_back(id);
  return test::qwen_tokenizer().decode(tokens, /*skip_special=*/true);
}

void expect_valid_utf8(const std::string& text) {
  EXPECT_NO_THROW(utf8::require_valid(text, "output")) << text;
}

void expect_error(const CommandResult& run, const std::string& message) {
  EXPECT_FALSE(run.signaled) << run.err;
  EXPECT_EQ(run.exit_code, 1) << run.out;
  EXPECT_NE(run.err.find("error: " + message), std::string::npos) << "expected: " << message << "\n"
                                                                  << run.err;
}

class TextCli : public ::testing::Test {
 protected:
  // The tiny model is written once for all tests of the suite.
  static void SetUpTestSuite() {
    tiny_model_ = std::make_unique<testing_support::TempDir>();
    const CommandResult synth = qspec("synth --arch qwen3.5-tiny --tokenizer '" + kTokenizerDir +
                                      "' --out '" + tiny_model_->str() + "'");
    ASSERT_EQ(synth.exit_code, 0) << synth.err;
  }
  static void TearDownTestSuite() { tiny_model_.reset(); }

  static std::string tiny() { return "--model '" + tiny_model_->str() + "'"; }

  // A file in this test's directory with `contents`; returns its quoted path.
  std::string file(const std::string& name, const std::string& contents) const {
    dir_.write(name, contents);
    return "'" + (dir_.path() / name).string() + "'";
  }

  // generate ... --json, parsed.
  nlohmann::json generate_json(const std::string& arguments) const {
    const CommandResult run = qspec("generate " + tiny() + " --json " + arguments);
    EXPECT_EQ(run.exit_code, 0) << run.err;
    return nlohmann::json::parse(run.out);
  }

  std::string chat(const std::string& input, const std::string& arguments) const {
    const CommandResult run = qspec("chat " + tiny() + " " + arguments + " < " + file("input.txt", input));
    EXPECT_EQ(run.exit_code, 0) << run.err;
    EXPECT_FALSE(run.signaled);
    expect_valid_utf8(run.out);
    return run.out;
  }

  static std::unique_ptr<testing_support::TempDir> tiny_model_;
  testing_support::TempDir dir_;
};

std::unique_ptr<testing_support::TempDir> TextCli::tiny_model_;

TEST_F(TextCli, TokenizeChatRendersLikeTheOracleAndEncodesTheRenderedText) {
  struct Case {
    std::string oracle, flags;
    bool as_object;  // {"messages", "tools"} rather than a bare array
  };
  for (const Case& c : {Case{"single_turn_default_thinking", "", false},
                        Case{"single_turn_thinking_off", "--no-thinking", false},
                        Case{"system_and_user", "", true}, Case{"tools_defined", "", true}}) {
    SCOPED_TRACE(c.oracle);
    const auto& oracle = oracle_case(c.oracle);
    const nlohmann::ordered_json input =
        c.as_object ? nlohmann::ordered_json{{"messages", oracle["messages"]}, {"tools", oracle["tools"]}}
                    : oracle["messages"];
    const CommandResult run = qspec("tokenize --model '" + kTokenizerDir + "' --json " + c.flags +
                                    " --chat " + file("messages.json", input.dump()));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const nlohmann::json out = nlohmann::json::parse(run.out);
    const std::string expected = oracle["expected"].get<std::string>();
    EXPECT_EQ(out.at("text"), expected);
    EXPECT_EQ(out.at("ids").get<std::vector<TokenId>>(), test::qwen_tokenizer().encode(expected));
  }
}

TEST_F(TextCli, BadMessagesFilesNameTheFile) {
  const std::pair<std::string, std::string> cases[] = {
      {"[{\"role\": \"user\"", "malformed JSON"},
      {"{\"messages\": 3}", "expected a JSON array of messages or an object with \"messages\", got number"},
      {"{\"tools\": []}", "the object has no \"messages\""},
      {"\"hello\"", "expected a JSON array of messages"},
      {"[{\"content\": \"hi\"}]", "message 0 is not an object with a string \"role\""},
      {"[{\"role\": \"user\", \"content\": \"hi\"}, 7]", "message 1 is not an object"},
      {"{\"messages\": [], \"tools\": {}}", "\"tools\" must be a list of tool schemas or null, got object"},
  };
  for (const auto& [contents, message] : cases) {
    SCOPED_TRACE(contents);
    const std::string path = file("messages.json", contents);
    const std::string unquoted = path.substr(1, path.size() - 2);
    expect_error(qspec("tokenize --model '" + kTokenizerDir + "' --chat " + path),
                 "--chat " + unquoted + ": " + message);
    expect_error(qspec("generate " + tiny() + " --chat " + path), "--chat " + unquoted + ": " + message);
  }
  expect_error(qspec("tokenize --model '" + kTokenizerDir + "' --chat /nonexistent.json"),
               "--chat /nonexistent.json: cannot open");
  expect_error(qspec("tokenize --model '" + kTokenizerDir + "' --chat '" + dir_.str() + "'"),
               "--chat " + dir_.str() + ": cannot open as a file");
  // The template's own checks still apply to a well-formed file.
  expect_error(qspec("tokenize --model '" + kTokenizerDir + "' --chat " + file("empty.json", "[]")),
               "chat_template.jinja");
}

TEST_F(TextCli, GenerateNeedsExactlyOnePromptAndATokenizerForText) {
  const std::string one_of = "generate: give exactly one of --prompt-ids, --prompt, --chat";
  expect_error(qspec("generate " + tiny()), one_of);
  expect_error(qspec("generate " + tiny() + " --prompt hi --prompt-ids 1"), one_of);
  expect_error(qspec("generate " + tiny() + " --prompt hi --chat " + file("m.json", "[]")), one_of);
  expect_error(
      qspec("generate --model " + kVocab256Model + " --prompt hi"),
      "--prompt needs a tokenizer: " + kVocab256Model + " has no tokenizer.json; give --tokenizer DIR");
  expect_error(qspec("generate --model " + kVocab256Model + " --chat " + file("m.json", "[]")),
               "--chat needs a tokenizer");
  expect_error(qspec("generate --model " + kVocab256Model + " --prompt hi --tokenizer /nonexistent"),
               "/nonexistent/tokenizer.json: cannot open");
}

TEST_F(TextCli, ATokenizerLargerThanTheModelVocabularyIsAnError) {
  const std::string mismatch = "tokenizer " + kTokenizerDir + " has 248077 ids but model " + kVocab256Model +
                               " has a vocabulary of 256";
  expect_error(
      qspec("generate --model " + kVocab256Model + " --tokenizer '" + kTokenizerDir + "' --prompt hi"),
      mismatch);
  expect_error(qspec("chat --model " + kVocab256Model + " --tokenizer '" + kTokenizerDir + "' < /dev/null"),
               mismatch);
}

TEST_F(TextCli, GeneratePromptStreamsTheTextOfItsTokens) {
  const nlohmann::json out = generate_json("--prompt 'Hello, how are you?' -n 24");
  const auto tokens = out.at("tokens").get<std::vector<TokenId>>();
  ASSERT_EQ(tokens.size(), 24u);
  EXPECT_EQ(out.at("prompt_tokens"), 6);  // the ids tokenize gives this text
  const std::string text = out.at("text").get<std::string>();
  EXPECT_EQ(text, text_of(tokens));
  EXPECT_FALSE(text.empty());
  expect_valid_utf8(text);
  // The same ids as a prompt give the same tokens; streamed, the same text.
  EXPECT_EQ(generate_json("--prompt-ids 9419,11,1204,513,488,30 -n 24").at("tokens"), out.at("tokens"));
  // Prefilled 2 tokens at a time, the same tokens.
  EXPECT_EQ(generate_json("--prompt-ids 9419,11,1204,513,488,30 -n 24 --prefill-chunk 2").at("tokens"),
            out.at("tokens"));
  const CommandResult streamed = qspec("generate " + tiny() + " --prompt 'Hello, how are you?' -n 24");
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  EXPECT_EQ(streamed.out, text + "\n");
}

TEST_F(TextCli, GenerateChatPrefillsTheRenderedConversation) {
  const std::string messages = file("m.json", R"([{"role": "user", "content": "Hi"}])");
  for (const std::string flags : {"", "--no-thinking"}) {
    SCOPED_TRACE(flags);
    const CommandResult tokenized =
        qspec("tokenize --model '" + kTokenizerDir + "' " + flags + " --chat " + messages);
    ASSERT_EQ(tokenized.exit_code, 0) << tokenized.err;
    const nlohmann::json out = generate_json(flags + " -n 12 --chat " + messages);
    const std::string ids = tokenized.out.substr(0, tokenized.out.find('\n'));
    const nlohmann::json same = generate_json("-n 12 --prompt-ids " + ids);
    EXPECT_EQ(out.at("tokens"), same.at("tokens"));
    EXPECT_EQ(out.at("text"), text_of(out.at("tokens").get<std::vector<TokenId>>()));
  }
}

// In place in the tiny model's single safetensors file: embedding row `to` becomes twice row `from`.
void set_embedding_row_to_double(const fs::path& model_dir, TokenId from, TokenId to) {
  const fs::path path = model_dir / "model-00001-of-00001.safetensors";
  std::fstream file(path, std::ios::binary | std::ios::in | std::ios::out);
  uint64_t header_size = 0;
  file.read(reinterpret_cast<char*>(&header_size), sizeof(header_size));
  std::string header(header_size, '\0');
  file.read(header.data(), std::streamsize(header_size));
  const auto embedding = nlohmann::json::parse(header).at("model.language_model.embed_tokens.weight");
  ASSERT_EQ(embedding.at("dtype"), "BF16");
  const int64_t hidden = embedding.at("shape")[1].get<int64_t>();
  const auto row_offset = [&](TokenId id) {
    return std::streamoff(8 + header_size + embedding.at("data_offsets")[0].get<uint64_t>() +
                          uint64_t(id) * uint64_t(hidden) * 2);
  };
  std::vector<uint16_t> row(size_t(hidden), 0);
  file.seekg(row_offset(from));
  file.read(reinterpret_cast<char*>(row.data()), std::streamsize(row.size() * 2));
  for (uint16_t& value : row) value = f32_to_bf16(2.0f * bf16_to_f32(value));
  file.seekp(row_offset(to));
  file.write(reinterpret_cast<const char*>(row.data()), std::streamsize(row.size() * 2));
  ASSERT_TRUE(file.good());
}

TEST_F(TextCli, GenerateChatStopsAtTheEndOfTurnToken) {
  // A copy of the tiny model whose template leaves <|im_end|> out of the prompt, and whose <|im_end|> row is
  // twice the row of the greedy second token: the first steps are unchanged, then <|im_end|> has twice the
  // winning (positive) logit and is chosen.
  const fs::path model = dir_.path() / "model";
  fs::copy(tiny_model_->path(), model);
  std::ofstream(model / "chat_template.jinja") << "{{- messages[0]['content'] }}";
  const std::string messages = file("m.json", R"([{"role": "user", "content": "Hello"}])");
  const std::string run = "generate --model '" + model.string() + "' --json -n 8 ";
  const auto unchanged = nlohmann::json::parse(qspec(run + "--chat " + messages).out);
  const auto tokens = unchanged.at("tokens").get<std::vector<TokenId>>();
  ASSERT_EQ(tokens.size(), 8u);
  const TokenId end_of_turn = *test::qwen_tokenizer().find_token("<|im_end|>");
  ASSERT_EQ(std::count(tokens.begin(), tokens.end(), end_of_turn), 0);
  set_embedding_row_to_double(model, tokens[1], end_of_turn);

  const auto stopped = nlohmann::json::parse(qspec(run + "--chat " + messages).out);
  EXPECT_EQ(stopped.at("tokens"), nlohmann::json({tokens[0], end_of_turn}));
  EXPECT_EQ(stopped.at("finish_reason"), "stop");
  EXPECT_EQ(stopped.at("text"), text_of({tokens[0]}));
  // A plain text prompt has no end of turn: the same model goes on.
  const auto plain = nlohmann::json::parse(qspec(run + "--prompt Hello").out);
  EXPECT_EQ(plain.at("tokens")[1], end_of_turn);
  EXPECT_EQ(plain.at("tokens").size(), 8u);
}

TEST_F(TextCli, ATokenizerWithoutTheEndOfTurnTokenCannotChat) {
  // The real tokenizer with <|im_end|> renamed.
  const fs::path tokenizer = dir_.path() / "tokenizer";
  fs::create_directory(tokenizer);
  fs::copy_file(fs::path(kTokenizerDir) / "chat_template.jinja", tokenizer / "chat_template.jinja");
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    std::stringstream contents;
    contents << std::ifstream(fs::path(kTokenizerDir) / name).rdbuf();
    std::string text = contents.str();
    const std::string end_of_turn = "<|im_end|>";
    ASSERT_NE(text.find(end_of_turn), std::string::npos) << name;
    for (size_t at; (at = text.find(end_of_turn)) != std::string::npos;)
      text.replace(at, end_of_turn.size(), "<|im_stop|>");
    std::ofstream(tokenizer / name, std::ios::binary) << text;
  }

  const std::string messages = file("m.json", R"([{"role": "user", "content": "Hi"}])");
  const std::string with_tokenizer = tiny() + " -n 2 --tokenizer '" + tokenizer.string() + "'";
  const std::string no_end_of_turn =
      "tokenizer " + tokenizer.string() + ": no <|im_end|> token to end a chat turn";
  EXPECT_EQ(qspec("generate " + with_tokenizer + " --prompt Hi").exit_code, 0);
  expect_error(qspec("generate " + with_tokenizer + " --chat " + messages), no_end_of_turn);
  expect_error(qspec("chat " + with_tokenizer + " < /dev/null"), no_end_of_turn);
}

TEST_F(TextCli, ChatShowsReasoningApartAndKeepsOnlyTheAnswer) {
  // A copy of the tiny model whose template is only the contents of the messages (so the prompt has no
  // </think>), and whose </think> row is twice the row of the greedy second token: the reply is one token of
  // reasoning, </think>, then the answer.
  const fs::path model = dir_.path() / "model";
  fs::copy(tiny_model_->path(), model);
  std::ofstream(model / "chat_template.jinja") << "{%- for m in messages %}{{- m['content'] }}{%- endfor %}";
  const std::string run = "generate --model '" + model.string() + "' --json -n 8 --chat ";
  const auto first_turn = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Hi"}}});
  const auto unchanged = nlohmann::json::parse(qspec(run + file("m1.json", first_turn.dump())).out);
  const auto tokens = unchanged.at("tokens").get<std::vector<TokenId>>();
  ASSERT_EQ(tokens.size(), 8u);
  const TokenId think_end = *test::qwen_tokenizer().find_token("</think>");
  set_embedding_row_to_double(model, tokens[1], think_end);

  const auto reply = nlohmann::json::parse(qspec(run + file("m1.json", first_turn.dump())).out);
  ASSERT_EQ(reply.at("tokens")[1], think_end);
  const std::string reasoning = text_of({tokens[0]});
  const std::string full = reply.at("text");
  const std::string reasoning_block = reasoning + "</think>";
  ASSERT_EQ(full.rfind(reasoning_block, 0), 0u) << full;
  const std::string answer = full.substr(full.find_first_not_of('\n', reasoning_block.size()));
  // The second turn sees the answer without the reasoning.
  auto second_turn = first_turn;
  second_turn.push_back({{"role", "assistant"}, {"content", answer}});
  second_turn.push_back({{"role", "user"}, {"content", "Go on"}});
  const std::string second =
      nlohmann::json::parse(qspec(run + file("m2.json", second_turn.dump())).out).at("text");

  const CommandResult chat =
      qspec("chat --model '" + model.string() + "' -n 8 < " + file("in.txt", "Hi\nGo on\n"));
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_EQ(chat.out, "[thinking]\n" + reasoning + "\n[/thinking]\n" + answer + "\n[thinking]\n" + second +
                          "\n[/thinking]\n\n");
}

TEST_F(TextCli, ChatKeepsTheHistoryResetsAndEndsAtEof) {
  // --no-thinking: each reply is all answer, so it goes into the history as printed.
  const std::string first =
      generate_json("--no-thinking -n 8 --chat " + file("m1.json", R"([{"role": "user", "content": "Hi"}])"))
          .at("text");
  nlohmann::ordered_json two_turns = nlohmann::ordered_json::array();
  two_turns.push_back({{"role", "user"}, {"content", "Hi"}});
  two_turns.push_back({{"role", "assistant"}, {"content", first}});
  two_turns.push_back({{"role", "user"}, {"content", "And then?"}});
  const std::string second =
      generate_json("--no-thinking -n 8 --chat " + file("m2.json", two_turns.dump())).at("text");
  EXPECT_NE(first, second);

  EXPECT_EQ(chat("Hi\nAnd then?\n", "--no-thinking -n 8"), first + "\n" + second + "\n");
  // /reset forgets the first turn; empty lines are no turns; /exit ends before the last line.
  EXPECT_EQ(chat("Hi\n/reset\n\nHi\n/exit\nAnd then?\n", "--no-thinking -n 8"), first + "\n" + first + "\n");
  EXPECT_EQ(chat("", "--no-thinking -n 8"), "");
}

TEST_F(TextCli, ChatWithThinkingMarksTheReasoning) {
  const std::string reasoning =
      generate_json("-n 6 --chat " + file("m.json", R"([{"role": "user", "content": "Hi"}])")).at("text");
  EXPECT_EQ(chat("Hi\n", "-n 6"), "[thinking]\n" + reasoning + "\n[/thinking]\n\n");
}

TEST_F(TextCli, ChatErrors) {
  expect_error(qspec("chat --model " + kVocab256Model + " < /dev/null"),
               "chat needs a tokenizer: " + kVocab256Model + " has no tokenizer.json");
  expect_error(qspec("chat " + tiny() + " -n 2 < " + file("bad.txt", "Hi\n\xff\n")),
               "stdin line 2 is not valid UTF-8");
}

}  // namespace
}  // namespace qspec
