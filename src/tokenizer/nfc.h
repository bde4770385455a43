// Unicode Normalization Form C (canonical composition), the normalizer of the Qwen3.5 tokenizer.
#pragma once

#include <string>
#include <string_view>

namespace qspec {

// `text` (valid UTF-8) in NFC.
std::string to_nfc(std::string_view text);

}  // namespace qspec
