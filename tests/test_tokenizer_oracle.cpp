// The tokenizer against HF tokenizers, case by case (fixtures of tools/oracle/tokenizer_corpus.py).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "test_tokenizer_support.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer_spec.h"
#include "tokenizer/utf8.h"

namespace qspec {
namespace {

using nlohmann::json;
using test::qwen_tokenizer;
using test::read_jsonl;

struct CorpusCase {
  std::string text;
  std::vector<TokenId> ids;
  std::string nfc;  // the text's NFC (Python unicodedata)
  bool special_tokens_as_text = false;
  bool ignore_merges = false;
};

const std::vector<CorpusCase>& corpus() {
  static const std::vector<CorpusCase> cases = [] {
    std::vector<CorpusCase> out;
    for (const json& line : read_jsonl("corpus.jsonl")) {
      CorpusCase c;
      c.text = line.at("text").get<std::string>();
      c.ids = line.at("ids").get<std::vector<TokenId>>();
      c.nfc = line.value("nfc", c.text);
      c.special_tokens_as_text = line.value("special_tokens_as_text", false);
      c.ignore_merges = line.value("ignore_merges", false);
      out.push_back(std::move(c));
    }
    return out;
  }();
  return cases;
}

// Only the cases without an option: what plain encode() must give.
std::vector<const CorpusCase*> plain_cases() {
  std::vector<const CorpusCase*> out;
  for (const CorpusCase& c : corpus()) {
    if (!c.special_tokens_as_text && !c.ignore_merges) out.push_back(&c);
  }
  return out;
}

std::string head(const std::string& text) {
  return text.substr(0, 80);
}

TEST(TokenizerOracle, CorpusIsTheCommittedOne) {
  // Guards against an empty or truncated fixture making the comparisons below vacuous.
  std::ifstream file(QSPEC_FIXTURES_DIR "/tokenizer/meta.json");
  EXPECT_EQ(corpus().size(), json::parse(file).at("cases").get<size_t>());
  EXPECT_GE(plain_cases().size(), 2000u);
}

TEST(TokenizerOracle, EncodeEqualsHfOnEveryCorpusText) {
  size_t mismatches = 0;
  for (const CorpusCase* c : plain_cases()) {
    const std::vector<TokenId> ids = qwen_tokenizer().encode(c->text);
    if (ids != c->ids && ++mismatches <= 10)
      ADD_FAILURE() << "ids differ from HF for " << json(head(c->text)).dump();
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(TokenizerOracle, SpecialTokensAsTextEqualsHfEncodeSpecialTokens) {
  size_t cases = 0;
  for (const CorpusCase& c : corpus()) {
    if (!c.special_tokens_as_text) continue;
    ++cases;
    EXPECT_EQ(qwen_tokenizer().encode(c.text, {.special_tokens_as_text = true}), c.ids)
        << json(head(c.text)).dump();
  }
  EXPECT_GE(cases, 200u);
}

TEST(TokenizerOracle, IgnoreMergesEqualsHf) {
  TokenizerSpec spec = read_tokenizer_spec(test::qwen_tokenizer_dir());
  ASSERT_FALSE(spec.ignore_merges);
  spec.ignore_merges = true;
  const Tokenizer tokenizer(spec);
  size_t cases = 0;
  for (const CorpusCase& c : corpus()) {
    if (!c.ignore_merges) continue;
    ++cases;
    EXPECT_EQ(tokenizer.encode(c.text), c.ids) << json(head(c.text)).dump();
    EXPECT_NE(qwen_tokenizer().encode(c.text), c.ids)
        << "the option must matter here: " << json(head(c.text)).dump();
  }
  EXPECT_GE(cases, 100u);
}

TEST(TokenizerOracle, DecodeOfEncodeIsNfcOfText) {
  for (const CorpusCase* c : plain_cases()) {
    EXPECT_EQ(qwen_tokenizer().decode(c->ids), c->nfc) << json(head(c->text)).dump();
  }
}

TEST(TokenizerOracle, DecodeEqualsHfIncludingCutCharacters) {
  const std::vector<json> cases = read_jsonl("decode.jsonl");
  ASSERT_GE(cases.size(), 800u);
  size_t with_replacement = 0;
  for (const json& c : cases) {
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    const auto text = c.at("text").get<std::string>();
    with_replacement += text.find("\xEF\xBF\xBD") != std::string::npos;
    EXPECT_EQ(qwen_tokenizer().decode(ids, c.at("skip_special").get<bool>()), text) << c.dump();
  }
  EXPECT_GE(with_replacement, 20u) << "the fixture must exercise cut UTF-8 sequences";
}

TEST(TokenizerOracle, StreamingDecodeEmitsOnlyWholeCharactersAndTheSameText) {
  for (const bool skip_special : {false, true}) {
    for (const CorpusCase* c : plain_cases()) {
      StreamDecoder stream(qwen_tokenizer(), skip_special);
      std::string streamed;
      for (const TokenId id : c->ids) {
        const std::string chunk = stream.push(id);
        ASSERT_NO_THROW(utf8::require_valid(chunk, "a streamed chunk")) << json(head(c->text)).dump();
        streamed += chunk;
      }
      streamed += stream.finish();
      EXPECT_EQ(streamed, qwen_tokenizer().decode(c->ids, skip_special)) << json(head(c->text)).dump();
    }
  }
}

TEST(TokenizerOracle, StreamingDecodeOfCutSequencesEqualsHf) {
  for (const json& c : read_jsonl("decode.jsonl")) {
    StreamDecoder stream(qwen_tokenizer(), c.at("skip_special").get<bool>());
    std::string streamed;
    for (const TokenId id : c.at("ids").get<std::vector<TokenId>>()) {
      const std::string chunk = stream.push(id);
      ASSERT_NO_THROW(utf8::require_valid(chunk, "a streamed chunk")) << c.dump();
      streamed += chunk;
    }
    streamed += stream.finish();
    EXPECT_EQ(streamed, c.at("text").get<std::string>()) << c.dump();
  }
}

uint64_t fnv1a64_of_int32_le(const std::vector<TokenId>& ids) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (const TokenId id : ids) {
    const auto bits = static_cast<uint32_t>(id);
    for (int shift = 0; shift < 32; shift += 8) {
      hash ^= (bits >> shift) & 0xFFu;
      hash *= 0x100000001B3ull;
    }
  }
  return hash;
}

TEST(TokenizerOracle, OneMegabyteTextEqualsHf) {
  std::ifstream file(QSPEC_FIXTURES_DIR "/tokenizer/large.json");
  const json expected = json::parse(file);
  const auto target_bytes = expected.at("bytes").get<size_t>();
  std::string text;
  while (text.size() < 1'000'000) {
    for (const CorpusCase* c : plain_cases()) {
      text += c->text + "\n";
      if (text.size() >= 1'000'000) break;
    }
  }
  ASSERT_EQ(text.size(), target_bytes);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<TokenId> ids = qwen_tokenizer().encode(text);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(ids.size(), expected.at("count").get<size_t>());
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(fnv1a64_of_int32_le(ids)));
  EXPECT_EQ(std::string(hash), expected.at("fnv1a64_of_int32_le").get<std::string>());
  RecordProperty("encode_mb_per_s", std::to_string(static_cast<double>(text.size()) / 1e6 / seconds));
}

TEST(TokenizerOracle, ConcurrentEncodesOnAColdCacheEqualHf) {
  const Tokenizer tokenizer(test::qwen_tokenizer_dir());
  const std::vector<const CorpusCase*> cases = plain_cases();
  std::vector<size_t> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < mismatches.size(); ++t) {
    threads.emplace_back([&, t] {
      // Each thread walks the corpus from a different start so that cache inserts and lookups interleave.
      for (size_t i = 0; i < cases.size(); ++i) {
        const CorpusCase& c = *cases[(i + t * cases.size() / 4) % cases.size()];
        mismatches[t] += tokenizer.encode(c.text) != c.ids;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const size_t count : mismatches) EXPECT_EQ(count, 0u);
}

}  // namespace
}  // namespace qspec
