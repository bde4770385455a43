// The Qwen3.5 tokenizer (HF tokenizers' byte-level BPE, id for id): text -> ids and ids -> text.
// Encoding: added tokens are split out of the raw text first (leftmost-longest), then each remaining segment
// is NFC-normalized, cut into pieces by the split regex, and each piece's bytes are merged by BPE.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/split_regex.h"
#include "tokenizer/token_id.h"

namespace qspec {

struct TokenizerSpec;

struct EncodeOptions {
  // Special added tokens (<|im_start|>, ...) in the text are encoded as plain text, so that user text cannot
  // inject control tokens; non-special ones (<think>, <tool_call>) still match (HF's encode_special_tokens).
  bool special_tokens_as_text = false;
};

class Tokenizer {
 public:
  // Loads MODEL_DIR/tokenizer.json (+ tokenizer_config.json when present); throws qspec::Error on bad files.
  explicit Tokenizer(const std::string& model_dir);
  explicit Tokenizer(const TokenizerSpec& spec);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Throws qspec::Error when `text` is not valid UTF-8. Thread-safe.
  std::vector<TokenId> encode(std::string_view text, EncodeOptions options = {}) const;

  // The text of `ids` (valid UTF-8: bytes that do not form UTF-8 become U+FFFD, as in HF). skip_special drops
  // special added tokens. Throws qspec::Error for an id that is no token.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;

  // Appends the bytes token `id` stands for (nothing for a special token when skip_special); they may end
  // inside a UTF-8 sequence that the next token completes. Throws qspec::Error for an id that is no token.
  void append_token_bytes(TokenId id, bool skip_special, std::string& out) const;

  // The token as it is written in tokenizer.json (byte-level form for BPE tokens: " the" is "Ġthe").
  std::string token_text(TokenId id) const;
  // The id of an added token's content or of a BPE token's tokenizer.json text.
  std::optional<TokenId> find_token(std::string_view text) const;
  // Whether `id` is a token (a model's embedding may have more rows than the tokenizer has tokens).
  bool has_token(TokenId id) const;
  bool is_special(TokenId id) const;

  // One more than the largest id.
  size_t id_count() const { return id_count_; }
  std::optional<TokenId> bos_id() const { return bos_id_; }
  std::optional<TokenId> eos_id() const { return eos_id_; }
  std::optional<TokenId> pad_id() const { return pad_id_; }

 private:
  void encode_segment(std::string_view segment, std::vector<TokenId>& out) const;
  const AddedToken* added_token(TokenId id) const;
  [[noreturn]] void fail_unknown_id(TokenId id) const;

  std::unique_ptr<Bpe> bpe_;
  std::unique_ptr<SplitRegex> split_;
  std::unique_ptr<AddedTokenMatcher> added_matcher_;
  std::unordered_map<TokenId, AddedToken> added_by_id_;
  std::unordered_map<TokenId, std::string> added_bytes_;  // what an added token decodes to
  bool nfc_ = false;
  size_t id_count_ = 0;
  std::optional<TokenId> bos_id_, eos_id_, pad_id_;
};

}  // namespace qspec
