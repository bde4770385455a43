#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/nfc.h"
#include "tokenizer/tokenizer_spec.h"
#include "tokenizer/utf8.h"

namespace qspec {

Tokenizer::Tokenizer(const std::string& model_dir) : Tokenizer(read_tokenizer_spec(model_dir)) {}

namespace {

std::unique_ptr<Bpe> make_bpe(const TokenizerSpec& spec) {
  try {
    return std::make_unique<Bpe>(spec.vocab, spec.merges, spec.ignore_merges);
  } catch (const Error& e) {
    fail("{}: {}", spec.tokenizer_json_path, e.what());
  }
}

}  // namespace

Tokenizer::Tokenizer(const TokenizerSpec& spec)
    : bpe_(make_bpe(spec)),
      split_(std::make_unique<SplitRegex>(
          spec.split_pattern, spec.tokenizer_json_path + ": pre_tokenizer.pretokenizers[0].pattern.Regex")),
      added_matcher_(std::make_unique<AddedTokenMatcher>(spec.added_tokens)),
      nfc_(spec.nfc),
      id_count_(spec.vocab.size()),
      bos_id_(spec.bos_id),
      eos_id_(spec.eos_id),
      pad_id_(spec.pad_id) {
  for (const AddedToken& token : spec.added_tokens) {
    added_by_id_.emplace(token.id, token);
    // As HF's ByteLevel decoder: content written in the byte alphabet decodes to its bytes, other content as
    // is.
    added_bytes_.emplace(token.id, byte_level::decode(token.content).value_or(token.content));
    id_count_ = std::max(id_count_, static_cast<size_t>(token.id) + 1);
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, EncodeOptions options) const {
  utf8::require_valid(text, "the text to encode");
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 1);
  std::string_view rest = text;
  while (!rest.empty()) {
    const AddedTokenMatcher::Found found = added_matcher_->find(rest, !options.special_tokens_as_text);
    encode_segment(rest.substr(0, found.begin), ids);
    if (found.token == nullptr) break;
    ids.push_back(found.token->id);
    rest.remove_prefix(found.begin + found.token->content.size());
  }
  return ids;
}

void Tokenizer::encode_segment(std::string_view segment, std::vector<TokenId>& out) const {
  if (segment.empty()) return;
  // The normalizer runs per segment between added tokens, as in HF.
  const std::string normalized = nfc_ ? to_nfc(segment) : std::string(segment);
  split_->split(normalized, [&](std::string_view piece) { bpe_->encode_piece(piece, out); });
}

const AddedToken* Tokenizer::added_token(TokenId id) const {
  const auto found = added_by_id_.find(id);
  return found == added_by_id_.end() ? nullptr : &found->second;
}

void Tokenizer::fail_unknown_id(TokenId id) const {
  fail("token id {} is not a token of this tokenizer (ids are 0..{})", id, id_count_ - 1);
}

void Tokenizer::append_token_bytes(TokenId id, bool skip_special, std::string& out) const {
  if (const AddedToken* token = added_token(id)) {
    if (!(skip_special && token->special)) out += added_bytes_.at(id);
    return;
  }
  if (id < 0 || static_cast<size_t>(id) >= bpe_->size()) fail_unknown_id(id);
  out += bpe_->token_bytes(id);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string bytes;
  for (const TokenId id : ids) append_token_bytes(id, skip_special, bytes);
  return utf8::to_valid_lossy(bytes);
}

bool Tokenizer::has_token(TokenId id) const {
  return added_token(id) != nullptr || (id >= 0 && static_cast<size_t>(id) < bpe_->size());
}

std::string Tokenizer::token_text(TokenId id) const {
  if (const AddedToken* token = added_token(id)) return token->content;
  if (id < 0 || static_cast<size_t>(id) >= bpe_->size()) fail_unknown_id(id);
  std::string text;
  for (const char byte : bpe_->token_bytes(id))
    text += byte_level::encode_byte(static_cast<unsigned char>(byte));
  return text;
}

std::optional<TokenId> Tokenizer::find_token(std::string_view text) const {
  for (const auto& [id, token] : added_by_id_) {
    if (token.content == text) return id;
  }
  // The same rule as for the vocabulary on load: text outside the byte alphabet stands for itself.
  return bpe_->find(byte_level::decode(text).value_or(std::string(text)));
}

bool Tokenizer::is_special(TokenId id) const {
  const AddedToken* token = added_token(id);
  return token != nullptr && token->special;
}

}  // namespace qspec
