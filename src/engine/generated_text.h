// The text of generated ids as a user reads it, streamed: whole UTF-8 characters only, special tokens
// (<|im_end|>, <|endoftext|>) dropped, and ids without a token (padding rows of the model's embedding, which
// a model can still sample) skipped, as HF's decode skips them.
#pragma once

#include <span>
#include <string>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace qspec {

class GeneratedText {
 public:
  // `tokenizer` must outlive this.
  explicit GeneratedText(const Tokenizer& tokenizer);

  // The text that `id` completes (possibly empty).
  std::string push(TokenId id);
  // The held bytes of an incomplete character, as U+FFFD.
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  StreamDecoder decoder_;
};

// All of it at once: the concatenation of what GeneratedText streams for `ids`.
std::string generated_text(const Tokenizer& tokenizer, std::span<const TokenId> ids);

}  // namespace qspec
