// The id of one token: an index into the BPE vocabulary or an added token's id.
#pragma once

#include <cstdint>

namespace qspec {

using TokenId = int32_t;

}  // namespace qspec
