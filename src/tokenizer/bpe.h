// Byte-level BPE, the model of HF tokenizers: a piece's bytes start as one token each, then the adjacent pair
// with the lowest merge rank is merged (leftmost first on ties) until no pair has a merge. Results for short
// pieces are cached; encode_piece is thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/merge_table.h"
#include "tokenizer/token_id.h"

namespace qspec {

struct BpeMerge {
  TokenId left, right, merged;
};

class Bpe {
 public:
  // vocab[id]: the bytes token id stands for; it must hold all 256 single bytes. merges: in rank order, each
  // merged == the token of left's bytes + right's bytes (a later duplicate of a pair replaces the earlier, as
  // in HF). ignore_merges: a piece that is itself a token is that token, whatever the merges say.
  Bpe(std::vector<std::string> vocab, const std::vector<BpeMerge>& merges, bool ignore_merges);

  // Appends the tokens of `piece` (non-empty bytes) to `out`.
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;

  // The token that stands for exactly `bytes`.
  std::optional<TokenId> find(std::string_view bytes) const;

  size_t size() const { return vocab_.size(); }
  const std::string& token_bytes(TokenId id) const { return vocab_[static_cast<size_t>(id)]; }

 private:
  void merge_bytes(std::string_view piece, std::vector<TokenId>& out) const;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>>;

  std::vector<std::string> vocab_;
  TokenId byte_token_[256];
  MergeTable merges_;
  bool ignore_merges_;
  std::unordered_map<std::string_view, TokenId> token_of_bytes_;  // views into vocab_

  mutable std::shared_mutex cache_mutex_;
  mutable PieceMap cache_;
};

}  // namespace qspec
