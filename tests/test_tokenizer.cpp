// Tokenizer behaviour that the oracle corpus does not spell out: known ids of the reference, special tokens,
// invalid input, and the UTF-8 / byte-alphabet / NFC building blocks.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "test_tokenizer_support.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/merge_table.h"
#include "tokenizer/nfc.h"
#include "tokenizer/onig_pattern.h"
#include "tokenizer/split_regex.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/utf8.h"

namespace qspec {
namespace {

using test::qwen_tokenizer;

const std::string kReplacement = "\xEF\xBF\xBD";

TEST(Tokenizer, KnownIdsOfTheReference) {
  const Tokenizer& t = qwen_tokenizer();
  EXPECT_EQ(t.encode("user"), (std::vector<TokenId>{846}));
  EXPECT_EQ(t.encode("assistant"), (std::vector<TokenId>{74455}));
  EXPECT_EQ(t.encode("\n\n"), (std::vector<TokenId>{271}));
  EXPECT_EQ(t.encode("Hello, how are you?"), (std::vector<TokenId>{9419, 11, 1204, 513, 488, 30}));
  EXPECT_EQ(t.encode("<|im_start|>user\n"), (std::vector<TokenId>{248045, 846, 198}));
  EXPECT_EQ(t.encode("<think>\n\n</think>\n\n"), (std::vector<TokenId>{248068, 271, 248069, 271}));
  EXPECT_TRUE(t.encode("").empty());
}

TEST(Tokenizer, VocabularyAndConfigTokens) {
  const Tokenizer& t = qwen_tokenizer();
  EXPECT_EQ(t.id_count(), 248077u);
  EXPECT_EQ(t.eos_id(), 248046);
  EXPECT_EQ(t.pad_id(), 248044);
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_EQ(t.find_token("<|im_end|>"), 248046);
  EXPECT_EQ(t.find_token("Ċ"), 198);
  EXPECT_FALSE(t.find_token("no such token").has_value());
  EXPECT_EQ(t.token_text(198), "Ċ");
  EXPECT_EQ(t.token_text(248069), "</think>");
  EXPECT_TRUE(t.is_special(248045));
  EXPECT_FALSE(t.is_special(248068));  // <think> is an added token but not a control token
  EXPECT_FALSE(t.is_special(846));
}

TEST(Tokenizer, SpecialTokensAsTextKeepsNonSpecialAddedTokens) {
  const Tokenizer& t = qwen_tokenizer();
  const std::vector<TokenId> ids = t.encode("<|im_start|><think>", {.special_tokens_as_text = true});
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 248045), 0);
  EXPECT_EQ(ids.back(), 248068);
  EXPECT_EQ(t.decode(ids), "<|im_start|><think>");
}

TEST(Tokenizer, AddedTokensMatchLeftmostLongest) {
  const Tokenizer& t = qwen_tokenizer();
  // "<|im_start" is no token; the one full token inside the text is found.
  const std::vector<TokenId> ids = t.encode("<|im_start<|im_end|>>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 248046), 1);
  EXPECT_EQ(t.decode(ids), "<|im_start<|im_end|>>");
}

TEST(Tokenizer, DecodeSkipsOnlySpecialTokens) {
  const Tokenizer& t = qwen_tokenizer();
  const std::vector<TokenId> ids{248045, 846, 198, 248068, 9419, 248069, 248046};
  EXPECT_EQ(t.decode(ids), "<|im_start|>user\n<think>Hello</think><|im_end|>");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "user\n<think>Hello</think>");
}

TEST(Tokenizer, UnknownIdsAreErrors) {
  const Tokenizer& t = qwen_tokenizer();
  for (const TokenId id : {-1, 248077, 248319}) {
    const std::vector<TokenId> ids{id};
    EXPECT_THROW(t.decode(ids), Error) << id;
    EXPECT_THROW(t.token_text(id), Error) << id;
    StreamDecoder stream(t);
    EXPECT_THROW(stream.push(id), Error) << id;
    EXPECT_FALSE(t.has_token(id)) << id;
  }
  for (const TokenId id : {0, 248043, 248044, 248076}) EXPECT_TRUE(t.has_token(id)) << id;
  try {
    const std::vector<TokenId> ids{248100};
    t.decode(ids);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 248100"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, InvalidUtf8InputIsAnErrorNamingTheOffset) {
  const Tokenizer& t = qwen_tokenizer();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ab\xFF", "invalid sequence at byte offset 2 (byte 0xFF)"},
      {"\xC0\xAF", "invalid sequence at byte offset 0 (byte 0xC0)"},       // overlong '/'
      {"x\xED\xA0\x80", "invalid sequence at byte offset 1 (byte 0xED)"},  // a surrogate
      {"\xF4\x90\x80\x80", "invalid sequence at byte offset 0"},           // above U+10FFFF
      {"ok \xE4\xBD", "truncated sequence at byte offset 3 (byte 0xE4)"},
      {"<|im_start|>\x80", "invalid sequence at byte offset 12 (byte 0x80)"},
  };
  for (const auto& [text, message] : cases) {
    try {
      t.encode(text);
      ADD_FAILURE() << "no error for " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the text to encode is not valid UTF-8: " + message),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Tokenizer, EmbeddedNulIsText) {
  const std::string text("a\0b", 3);
  EXPECT_EQ(qwen_tokenizer().decode(qwen_tokenizer().encode(text)), text);
}

TEST(ParseTokenIds, AcceptsCommaSeparatedIdsAndNamesTheBadOne) {
  EXPECT_EQ(parse_token_ids("1,22, 333 ,0", "--ids"), (std::vector<TokenId>{1, 22, 333, 0}));
  for (const char* bad : {"", "1,,2", "1,-2", "x", "1.5", "99999999999", "1,2,"}) {
    try {
      parse_token_ids(bad, "--ids");
      ADD_FAILURE() << "no error for \"" << bad << "\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--ids: expected comma-separated token ids"), std::string::npos)
          << e.what();
    }
  }
}

TEST(StreamDecoder, HoldsACutCharacterUntilItIsComplete) {
  const Tokenizer& t = qwen_tokenizer();
  const std::vector<TokenId> ids = t.encode("🫠");
  ASSERT_GT(ids.size(), 1u) << "the emoji must be split over tokens for this test";
  StreamDecoder stream(t);
  std::string streamed;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    EXPECT_EQ(stream.push(ids[i]), "");
  }
  EXPECT_EQ(stream.push(ids.back()), "🫠");
  EXPECT_EQ(stream.finish(), "");
}

TEST(StreamDecoder, FinishReplacesAnIncompleteTail) {
  const Tokenizer& t = qwen_tokenizer();
  const std::vector<TokenId> ids = t.encode("🫠");
  StreamDecoder stream(t);
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.finish(), kReplacement);
  EXPECT_EQ(stream.finish(), "");
}

TEST(Utf8, ScanFollowsTheWellFormedTable) {
  using utf8::Scan;
  const auto scan = [](std::string_view bytes) { return utf8::scan_sequence(bytes); };
  EXPECT_EQ(scan("A").scan, Scan::kComplete);
  EXPECT_EQ(scan("\xC3\xA9").length, 2u);
  EXPECT_EQ(scan("\xF0\x9F\x98\x80").length, 4u);
  EXPECT_EQ(scan("\xF0\x9F\x98").scan, Scan::kIncomplete);
  EXPECT_EQ(scan("\xE0\x80\x80").scan, Scan::kInvalid);  // overlong
  EXPECT_EQ(scan("\xE0\x80\x80").length, 1u);
  EXPECT_EQ(scan("\xE4\xBD"
                 "A")
                .length,
            2u);  // the maximal subpart: lead + one good continuation
  EXPECT_EQ(scan("\xBF").scan, Scan::kInvalid);
  EXPECT_EQ(scan("\xF5\x80\x80\x80").scan, Scan::kInvalid);
}

TEST(Utf8, LossyMatchesUnicodeMaximalSubpartReplacement) {
  // Expected strings are Python's bytes.decode("utf-8", "replace"), the same policy as Rust's
  // from_utf8_lossy.
  EXPECT_EQ(utf8::to_valid_lossy("a\xF0\x9F\x98"), "a" + kReplacement);
  EXPECT_EQ(utf8::to_valid_lossy("\xED\xA0\x80"), kReplacement + kReplacement + kReplacement);
  EXPECT_EQ(utf8::to_valid_lossy("\xE4\xBD"
                                 "A"),
            kReplacement + "A");
  EXPECT_EQ(utf8::to_valid_lossy("\xC3\xA9\x80"), "é" + kReplacement);
  std::string decided;
  EXPECT_EQ(utf8::append_decided("ok\xE4\xBD", decided), 2u);
  EXPECT_EQ(decided, "ok");
}

TEST(ByteLevel, MapsEveryByteToOneCodePointAndBack) {
  EXPECT_EQ(byte_level::encode_byte(' '), "Ġ");
  EXPECT_EQ(byte_level::encode_byte('\n'), "Ċ");
  EXPECT_EQ(byte_level::encode_byte('a'), "a");
  std::string all_bytes, encoded;
  for (int b = 0; b < 256; ++b) {
    all_bytes += static_cast<char>(b);
    encoded += byte_level::encode_byte(static_cast<unsigned char>(b));
  }
  EXPECT_EQ(byte_level::decode(encoded), all_bytes);
  EXPECT_FALSE(byte_level::decode("中").has_value());
  EXPECT_FALSE(byte_level::decode(" ").has_value());  // a space is not in the alphabet; Ġ stands for it
}

TEST(MergeTable, FindsPairsAndALaterDuplicateReplaces) {
  MergeTable table(1000);
  for (TokenId i = 0; i < 1000; ++i) table.insert_or_assign(i, i + 1, {i, 5000 + i});
  table.insert_or_assign(7, 8, {99, 42});
  for (TokenId i = 0; i < 1000; ++i) {
    const MergeTable::Merge* merge = table.find(i, i + 1);
    ASSERT_NE(merge, nullptr) << i;
    EXPECT_EQ(merge->merged, i == 7 ? 42 : 5000 + i);
  }
  EXPECT_EQ(table.find(1, 0), nullptr);
  EXPECT_EQ(table.find(0, 0), nullptr);
  EXPECT_EQ(table.find(2147483647, 2147483647), nullptr);
}

TEST(Nfc, ComposesAndReorders) {
  EXPECT_EQ(to_nfc("e\xCC\x81"), "é");
  EXPECT_EQ(to_nfc("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB"), "한");  // conjoining jamo
  EXPECT_EQ(to_nfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");      // canonical order: dot below first
  EXPECT_EQ(to_nfc("\xE2\x84\xAB"), "Å");                           // Angstrom sign -> A with ring
  EXPECT_EQ(to_nfc(std::string("plain ascii\0x", 13)), std::string("plain ascii\0x", 13));
}

TEST(Nfc, MarksNewerThanHfsTablesAreStarters) {
  // U+089F (class 230, Unicode 14) before U+059A (class 222): NFC would swap them; HF does not know U+089F.
  EXPECT_EQ(to_nfc("a\u089F\u059A"), "a\u089F\u059A");
  EXPECT_EQ(to_nfc("a\u0301\u059A"), "\u00E1\u059A");   // known marks are still reordered and composed...
  EXPECT_EQ(to_nfc("e\u089F\u0301"), "e\u089F\u0301");  // ...but not composed across a starter
  EXPECT_EQ(to_nfc("e\u0301\u089F"), "\u00E9\u089F");
}

TEST(OnigPattern, TranslatesWhiteSpaceAndNewerUnicode) {
  EXPECT_EQ(onig_to_pcre2(R"(a\s+(?!\S))"), R"(a\p{White_Space}+(?!\P{White_Space}))");
  EXPECT_EQ(onig_to_pcre2(R"(\\s)"), R"(\\s)");  // an escaped backslash, then a literal s
  const std::string outside = onig_to_pcre2(R"(\p{N})");
  EXPECT_TRUE(outside.starts_with(R"([\p{N}\x{10D40}-\x{10D49})")) << outside;
  EXPECT_TRUE(outside.ends_with("]")) << outside;
  const std::string inside = onig_to_pcre2(R"([^\r\n\p{L}\p{N}])");
  EXPECT_TRUE(inside.starts_with(R"([^\r\n\p{L}\x{1C89}-\x{1C8A})")) << inside;
  EXPECT_EQ(std::count(inside.begin(), inside.end(), '['), 1) << inside;
  EXPECT_EQ(onig_to_pcre2(R"([]\s]x)"), R"([]\p{White_Space}]x)");
}

std::vector<std::string> split_pieces(std::string_view text) {
  static const SplitRegex qwen_split(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      "test");
  std::vector<std::string> pieces;
  qwen_split.split(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

TEST(SplitRegex, SplitsAsHfIncludingNewerUnicodeAndWhiteSpace) {
  using Pieces = std::vector<std::string>;
  // Expected pieces are HF's pre_tokenize_str.
  EXPECT_EQ(split_pieces("Hello, world!  It's 42\n\n"),
            (Pieces{"Hello", ",", " world", "!", " ", " It", "'s", " ", "4", "2", "\n\n"}));
  EXPECT_EQ(split_pieces("\u1C89!"), (Pieces{"\u1C89", "!"}));                // a letter since Unicode 16
  EXPECT_EQ(split_pieces("!\U00010D40x"), (Pieces{"!", "\U00010D40", "x"}));  // a digit since Unicode 16
  EXPECT_EQ(split_pieces("a\u0897!"), (Pieces{"a\u0897", "!"}));              // a mark since Unicode 16
  EXPECT_EQ(split_pieces(" \u180E "), (Pieces{" \u180E", " "}));              // U+180E is not White_Space
  EXPECT_EQ(split_pieces("caf\u00E9\u0301s"), (Pieces{"caf\u00E9\u0301s"}));  // marks join letters (\p{M})
}

}  // namespace
}  // namespace qspec
