// Added tokens (<|im_start|>, <think>, ...): found in the raw text before normalization and BPE, by
// leftmost-longest match (as HF tokenizers' Aho-Corasick), and encoded as their one id.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/token_id.h"

namespace qspec {

struct AddedToken {
  TokenId id;
  std::string content;
  bool special;  // control token: skipped by decode(skip_special) and by encode(added_tokens_as_text)
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  struct Found {
    size_t begin;  // == text.size(): none found
    const AddedToken* token;
  };
  // The leftmost added token in `text` (the longest one starting there); special tokens only when
  // `include_special`.
  Found find(std::string_view text, bool include_special) const;

 private:
  std::vector<AddedToken> by_length_;      // longest first, so the first hit at a position is the longest
  std::array<bool, 256> is_first_byte_{};  // a cheap filter: most positions cannot start an added token
};

}  // namespace qspec
