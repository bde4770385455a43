#include "tokenizer/added_tokens.h"

#include <algorithm>

namespace qspec {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : by_length_(tokens) {
  std::stable_sort(by_length_.begin(), by_length_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (const AddedToken& token : by_length_) {
    if (!token.content.empty()) is_first_byte_[static_cast<unsigned char>(token.content[0])] = true;
  }
}

AddedTokenMatcher::Found AddedTokenMatcher::find(std::string_view text, bool include_special) const {
  for (size_t position = 0; position < text.size(); ++position) {
    if (!is_first_byte_[static_cast<unsigned char>(text[position])]) continue;
    const std::string_view rest = text.substr(position);
    for (const AddedToken& token : by_length_) {
      if (token.special && !include_special) continue;
      if (!token.content.empty() && rest.starts_with(token.content)) return {position, &token};
    }
  }
  return {text.size(), nullptr};
}

}  // namespace qspec
