// The tokenizer a checkpoint is used with: the checkpoint directory's own tokenizer.json, or another
// directory's (--tokenizer) for a checkpoint that has none. Every id it can produce must be a row of the
// model's embedding, or a prompt could index past it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace qspec {

struct ModelTokenizer {
  std::string directory;  // holds tokenizer.json, tokenizer_config.json and the chat template if any
  Tokenizer tokenizer;
};

// nullopt when tokenizer_dir is empty and model_dir has no tokenizer.json, unless `needed_by` (the option or
// command that needs it) is given: then that is an Error. Throws qspec::Error naming both directories and
// both sizes when the tokenizer has more ids than the model's vocab_size.
std::optional<ModelTokenizer> open_model_tokenizer(const std::string& model_dir,
                                                   const std::string& tokenizer_dir, int vocab_size,
                                                   std::string_view needed_by = {});

// The id of the chat template's end-of-turn token <|im_end|>; generation of a reply stops there. Throws
// qspec::Error naming the tokenizer directory when it has no such token.
TokenId end_of_turn_id(const ModelTokenizer& model_tokenizer);

}  // namespace qspec
