#include "engine/model_tokenizer.h"

#include <filesystem>

#include "core/error.h"

namespace qspec {

std::optional<ModelTokenizer> open_model_tokenizer(const std::string& model_dir,
                                                   const std::string& tokenizer_dir, int vocab_size,
                                                   std::string_view needed_by) {
  std::string directory = tokenizer_dir;
  if (directory.empty()) {
    if (!std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json")) {
      if (needed_by.empty()) return std::nullopt;
      fail("{} needs a tokenizer: {} has no tokenizer.json; give --tokenizer DIR", needed_by, model_dir);
    }
    directory = model_dir;
  }
  Tokenizer tokenizer(directory);
  if (tokenizer.id_count() > size_t(vocab_size))
    fail("tokenizer {} has {} ids but model {} has a vocabulary of {}: they do not belong together",
         directory, tokenizer.id_count(), model_dir, vocab_size);
  return ModelTokenizer{std::move(directory), std::move(tokenizer)};
}

TokenId end_of_turn_id(const ModelTokenizer& model_tokenizer) {
  constexpr const char* end_of_turn = "<|im_end|>";
  const std::optional<TokenId> id = model_tokenizer.tokenizer.find_token(end_of_turn);
  if (!id) fail("tokenizer {}: no {} token to end a chat turn", model_tokenizer.directory, end_of_turn);
  return *id;
}

}  // namespace qspec
