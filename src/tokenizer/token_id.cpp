#include "tokenizer/token_id.h"

#include <charconv>
#include <limits>

#include "core/error.h"

namespace qspec {

std::vector<TokenId> parse_token_ids(std::string_view text, std::string_view what) {
  std::vector<TokenId> ids;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    std::string_view item =
        text.substr(begin, comma == std::string_view::npos ? text.size() - begin : comma - begin);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    TokenId id = 0;
    const auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || error != std::errc() || end != item.data() + item.size() || id < 0) {
      fail("{}: expected comma-separated token ids (integers in [0, {}]), got \"{}\"", what,
           std::numeric_limits<TokenId>::max(), item);
    }
    ids.push_back(id);
    if (comma == std::string_view::npos) return ids;
    begin = comma + 1;
  }
}

}  // namespace qspec
