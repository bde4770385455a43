#include "engine/generated_text.h"

namespace qspec {

GeneratedText::GeneratedText(const Tokenizer& tokenizer)
    : tokenizer_(&tokenizer), decoder_(tokenizer, /*skip_special=*/true) {}

std::string GeneratedText::push(TokenId id) {
  return tokenizer_->has_token(id) ? decoder_.push(id) : std::string();
}

std::string GeneratedText::finish() {
  return decoder_.finish();
}

std::string generated_text(const Tokenizer& tokenizer, std::span<const TokenId> ids) {
  GeneratedText stream(tokenizer);
  std::string text;
  for (const TokenId id : ids) text += stream.push(id);
  return text + stream.finish();
}

}  // namespace qspec
