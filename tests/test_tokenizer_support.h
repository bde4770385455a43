// Shared by the tokenizer tests: the committed Qwen3.5 tokenizer, loaded once, and the oracle fixture cases.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace qspec::test {

inline std::string qwen_tokenizer_dir() {
  return QSPEC_FIXTURES_DIR "/../../models/qwen3.5-tokenizer";
}

inline const Tokenizer& qwen_tokenizer() {
  static const Tokenizer tokenizer(qwen_tokenizer_dir());
  return tokenizer;
}

// The lines of a JSON-lines fixture under tests/fixtures/tokenizer/.
inline std::vector<nlohmann::json> read_jsonl(const std::string& name) {
  std::ifstream file(std::string(QSPEC_FIXTURES_DIR "/tokenizer/") + name);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(file, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

}  // namespace qspec::test
