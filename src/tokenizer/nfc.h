// Unicode Normalization Form C (canonical composition), the normalizer of the Qwen3.5 tokenizer, as HF
// tokenizers computes it: utf8proc's NFC, except that the combining marks HF's older Unicode tables do not
// know are starters.
#pragma once

#include <string>
#include <string_view>

namespace qspec {

// `text` (valid UTF-8) in NFC, as HF tokenizers normalizes it.
std::string to_nfc(std::string_view text);

}  // namespace qspec
