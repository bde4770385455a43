// Loading tokenizer.json / tokenizer_config.json: a small valid tokenizer, and one clear error (file + field)
// for each way a file can be wrong.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "temp_dir.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace qspec {
namespace {

using nlohmann::json;

const char* const kQwenSplit =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// 256 byte tokens (id = byte), "ab" (256, merged from a+b), "abc" (257, reachable by no merge), "Ġab" (258),
// and two added tokens: <|x|> (special, 259) and <y> (not special, 260).
json tiny_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::encode_byte(static_cast<unsigned char>(b))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["Ġab"] = 258;
  const auto added = [](int id, const char* content, bool special) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", special}};
  };
  return json{{"version", "1.0"},
              {"added_tokens", json::array({added(259, "<|x|>", true), added(260, "<y>", false)})},
              {"normalizer", {{"type", "NFC"}}},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers", json::array({{{"type", "Split"},
                                                {"pattern", {{"Regex", kQwenSplit}}},
                                                {"behavior", "Isolated"},
                                                {"invert", false}},
                                               {{"type", "ByteLevel"},
                                                {"add_prefix_space", false},
                                                {"trim_offsets", false},
                                                {"use_regex", false}}})}}},
              {"post_processor", {{"type", "ByteLevel"}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", json::array({json::array({"a", "b"}), "Ġ ab"})}}}};
}

json tiny_config() {
  return json{{"eos_token", "<|x|>"},
              {"pad_token", {{"content", "<y>"}}},
              {"bos_token", nullptr},
              {"added_tokens_decoder", {{"259", {{"content", "<|x|>"}}}, {"260", {{"content", "<y>"}}}}}};
}

// A model directory under the temp dir, removed at the end of the test.
class TokenizerFiles : public ::testing::Test {
 protected:
  void write(const std::string& name, const std::string& text) const { dir_.write(name, text); }
  Tokenizer load(const json& tokenizer, const json* config = nullptr) const {
    write("tokenizer.json", tokenizer.dump());
    if (config != nullptr) write("tokenizer_config.json", config->dump());
    return Tokenizer(dir_.str());
  }
  // The message of the error that loading gives; fails the test when there is none.
  std::string load_error(const json& tokenizer, const json* config = nullptr) const {
    try {
      load(tokenizer, config);
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "loading did not fail";
    return "";
  }

  testing_support::TempDir dir_;
};

#define EXPECT_ERROR_HAS(message, part) EXPECT_NE((message).find(part), std::string::npos) << (message)

TEST_F(TokenizerFiles, TinyTokenizerEncodesDecodesAndReadsTheConfig) {
  const json config = tiny_config();
  const Tokenizer t = load(tiny_tokenizer(), &config);
  EXPECT_EQ(t.encode("abc"), (std::vector<TokenId>{256, 'c'}));
  EXPECT_EQ(t.encode("x ab"), (std::vector<TokenId>{'x', 258}));
  EXPECT_EQ(t.encode("a<|x|>b<y>"), (std::vector<TokenId>{'a', 259, 'b', 260}));
  EXPECT_EQ(t.decode(std::vector<TokenId>{256, 258, 259, 260}, true), "ab ab<y>");
  EXPECT_EQ(t.eos_id(), 259);
  EXPECT_EQ(t.pad_id(), 260);
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_EQ(t.id_count(), 261u);
}

TEST_F(TokenizerFiles, IgnoreMergesTakesAWholePieceThatIsAToken) {
  json tokenizer = tiny_tokenizer();
  tokenizer["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(tokenizer).encode("abc"), (std::vector<TokenId>{257}));
  EXPECT_EQ(load(tokenizer).encode("abcd"), (std::vector<TokenId>{256, 'c', 'd'}));
}

TEST_F(TokenizerFiles, LegacyStringMergesAreAccepted) {
  json tokenizer = tiny_tokenizer();
  tokenizer["model"]["merges"] = json::array({"a b"});
  EXPECT_EQ(load(tokenizer).encode("ab"), (std::vector<TokenId>{256}));
}

TEST_F(TokenizerFiles, MissingFileAndBrokenJson) {
  const auto load_dir_error = [&] {
    try {
      Tokenizer t(dir_.str());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "loading did not fail";
    return std::string();
  };
  EXPECT_ERROR_HAS(load_dir_error(), "tokenizer.json: cannot open");
  const std::string text = tiny_tokenizer().dump();
  write("tokenizer.json", text.substr(0, text.size() / 2));
  EXPECT_ERROR_HAS(load_dir_error(), "tokenizer.json: not valid JSON");
}

struct BadField {
  const char* what;
  void (*mutate)(json&);
  const char* message;
};

TEST_F(TokenizerFiles, EachBadFieldIsNamed) {
  const BadField cases[] = {
      {"top level", [](json& j) { j = json::array(); }, "the top level: expected an object"},
      {"model", [](json& j) { j.erase("model"); }, "tokenizer.json: model: missing"},
      {"type", [](json& j) { j["model"]["type"] = "WordPiece"; },
       "model.type: expected \"BPE\", got \"WordPiece\""},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout: expected null"},
      {"byte_fallback", [](json& j) { j["model"]["byte_fallback"] = true; },
       "model.byte_fallback: expected false"},
      {"suffix", [](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; },
       "model.end_of_word_suffix: expected null"},
      {"ignore_merges", [](json& j) { j["model"]["ignore_merges"] = "yes"; },
       "model.ignore_merges: expected true or false"},
      {"vocab type", [](json& j) { j["model"]["vocab"] = json::array(); }, "model.vocab: expected an object"},
      {"vocab id type", [](json& j) { j["model"]["vocab"]["ab"] = "256"; },
       "model.vocab[\"ab\"]: expected an integer"},
      {"merges missing", [](json& j) { j["model"].erase("merges"); }, "model.merges: missing"},
      {"prefix", [](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix"},
      {"vocab id", [](json& j) { j["model"]["vocab"]["ab"] = 999; },
       "model.vocab[\"ab\"]: expected an integer in [0, 258]"},
      {"vocab duplicate", [](json& j) { j["model"]["vocab"]["ab"] = 257; }, "appears twice"},
      {"vocab byte",
       [](json& j) {
         j["model"]["vocab"].erase("A");
         j["model"]["vocab"]["zz"] = 'A';
       },
       "tokenizer.json: model.vocab has no token for byte 0x41"},
      {"merges type", [](json& j) { j["model"]["merges"] = "a b"; }, "model.merges: expected an array"},
      {"merge shape", [](json& j) { j["model"]["merges"][1] = 7; },
       "model.merges[1]: expected a pair of tokens"},
      {"merge text", [](json& j) { j["model"]["merges"][1] = "a b c"; },
       "model.merges[1]: expected \"LEFT RIGHT\""},
      {"merge token",
       [](json& j) {
         j["model"]["merges"][0] = json::array({"a", "q"});
       },
       "model.merges[0]: expected tokens of model.vocab, and \"aq\" is not one"},
      {"added array", [](json& j) { j["added_tokens"] = 3; }, "added_tokens: expected an array"},
      {"added entry", [](json& j) { j["added_tokens"][1] = "<y>"; }, "added_tokens[1]: expected an object"},
      {"added special", [](json& j) { j["added_tokens"][1]["special"] = 1; },
       "added_tokens[1].special: expected true"},
      {"added content type", [](json& j) { j["added_tokens"][0].erase("content"); },
       "added_tokens[0].content: missing"},
      {"added id", [](json& j) { j["added_tokens"][0]["id"] = -4; },
       "added_tokens[0].id: expected an integer"},
      {"added duplicate", [](json& j) { j["added_tokens"][1]["id"] = 259; },
       "added_tokens[0] also has id 259"},
      {"added vocab id", [](json& j) { j["added_tokens"][1]["id"] = 5; },
       "added_tokens[1].id: expected an id above"},
      {"added content", [](json& j) { j["added_tokens"][0]["content"] = ""; },
       "added_tokens[0].content: expected a non-empty"},
      {"added lstrip", [](json& j) { j["added_tokens"][1]["lstrip"] = true; },
       "added_tokens[1].lstrip: expected false"},
      {"added normalized", [](json& j) { j["added_tokens"][0]["normalized"] = true; },
       "added_tokens[0].normalized"},
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type: expected \"NFC\""},
      {"pre_tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer.type"},
      {"split steps", [](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); },
       "pre_tokenizer.pretokenizers: expected"},
      {"behavior", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "pretokenizers[0].behavior: expected \"Isolated\""},
      {"regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}"; },
       "pre_tokenizer.pretokenizers[0].pattern.Regex: the split regex \"(\\p{L}\" does not compile"},
      {"string pattern",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}};
       },
       "pattern.Regex: missing"},
      {"pre_tokenizer missing", [](json& j) { j.erase("pre_tokenizer"); },
       "tokenizer.json: pre_tokenizer: missing"},
      {"invert", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       "invert: expected false"},
      {"byte level type", [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Whitespace"; },
       "pretokenizers[1].type: expected \"ByteLevel\""},
      {"prefix space", [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "add_prefix_space: expected false"},
      {"normalizer type", [](json& j) { j["normalizer"] = "NFC"; }, "normalizer: expected an object"},
      {"use_regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; },
       "use_regex: expected false"},
      {"decoder", [](json& j) { j.erase("decoder"); }, "tokenizer.json: decoder: missing"},
      {"decoder type", [](json& j) { j["decoder"]["type"] = "WordPiece"; },
       "decoder.type: expected \"ByteLevel\""},
      {"post_processor",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       "post_processor.type"},
  };
  for (const BadField& c : cases) {
    json tokenizer = tiny_tokenizer();
    c.mutate(tokenizer);
    const std::string message = load_error(tokenizer);
    EXPECT_ERROR_HAS(message, c.message) << " (case " << c.what << ")";
    EXPECT_ERROR_HAS(message, "tokenizer.json") << " (case " << c.what << ")";
  }
}

TEST_F(TokenizerFiles, EachBadConfigFieldIsNamed) {
  const BadField cases[] = {
      {"not an object", [](json& j) { j = "x"; }, "tokenizer_config.json: the top level: expected an object"},
      {"eos unknown", [](json& j) { j["eos_token"] = "<|nope|>"; },
       "tokenizer_config.json: eos_token: expected a token"},
      {"eos type", [](json& j) { j["eos_token"] = 5; },
       "tokenizer_config.json: eos_token: expected a string"},
      {"pad content",
       [](json& j) {
         j["pad_token"] = {{"text", "<y>"}};
       },
       "pad_token.content: missing"},
      {"decoder id",
       [](json& j) {
         j["added_tokens_decoder"]["261"] = {{"content", "<|x|>"}};
       },
       "added_tokens_decoder[\"261\"]: expected the same id"},
      {"decoder entry", [](json& j) { j["added_tokens_decoder"]["259"] = 1; },
       "added_tokens_decoder[\"259\"]: expected an object"},
  };
  for (const BadField& c : cases) {
    json config = tiny_config();
    c.mutate(config);
    EXPECT_ERROR_HAS(load_error(tiny_tokenizer(), &config), c.message) << " (case " << c.what << ")";
  }
  write("tokenizer_config.json", "{\"eos_token\": ");
  write("tokenizer.json", tiny_tokenizer().dump());
  EXPECT_THROW(
      {
        try {
          Tokenizer t(dir_.str());
        } catch (const Error& e) {
          EXPECT_ERROR_HAS(std::string(e.what()), "tokenizer_config.json: not valid JSON");
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace qspec
