// What a model directory's tokenizer.json (+ tokenizer_config.json when present) says, read and validated:
// every field the encoder and decoder rely on is checked here, and a bad one is a qspec::Error naming file
// and field. Supported: the byte-level BPE layout of Qwen2/3/3.5 (NFC or no normalizer, Split(regex,
// isolated) + ByteLevel pre-tokenizer, ByteLevel decoder).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/token_id.h"

namespace qspec {

struct TokenizerSpec {
  std::string tokenizer_json_path;  // for messages
  std::vector<std::string> vocab;   // id -> the bytes it stands for (ids are 0..N-1)
  std::vector<BpeMerge> merges;     // rank order
  bool ignore_merges = false;
  std::vector<AddedToken> added_tokens;
  bool nfc = false;
  std::string split_pattern;
  // From tokenizer_config.json, when present.
  std::optional<TokenId> bos_id, eos_id, pad_id;
};

// Reads DIR/tokenizer.json and, if it exists, DIR/tokenizer_config.json.
TokenizerSpec read_tokenizer_spec(const std::string& model_dir);

}  // namespace qspec
