// The id of one token: an index into the BPE vocabulary or an added token's id.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace qspec {

using TokenId = int32_t;

// "12,34, 5" -> {12, 34, 5}. Throws qspec::Error naming `what` (e.g. the option) on anything else.
std::vector<TokenId> parse_token_ids(std::string_view text, std::string_view what);

}  // namespace qspec
