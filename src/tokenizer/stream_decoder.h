// Decodes tokens one at a time as they are generated, emitting only whole UTF-8 characters: a token that ends
// inside a character (byte-level BPE splits emoji and CJK) is held until the next tokens complete it.
// The concatenation of everything push() and finish() return equals Tokenizer::decode of all the tokens.
#pragma once

#include <string>

#include "tokenizer/token_id.h"

namespace qspec {

class Tokenizer;

class StreamDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);

  // The text that `id` completes (possibly empty). Throws qspec::Error for an id that is no token.
  std::string push(TokenId id);
  // The held bytes at the end of the stream: an incomplete character becomes U+FFFD. The decoder is then
  // empty.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes of an incomplete character, at most 3
};

}  // namespace qspec
