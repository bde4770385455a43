#include "tokenizer/stream_decoder.h"

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace qspec {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(TokenId id) {
  tokenizer_->append_token_bytes(id, skip_special_, pending_);
  std::string text;
  const size_t decided = utf8::append_decided(pending_, text);
  pending_.erase(0, decided);
  return text;
}

std::string StreamDecoder::finish() {
  std::string text = utf8::to_valid_lossy(pending_);
  pending_.clear();
  return text;
}

}  // namespace qspec
