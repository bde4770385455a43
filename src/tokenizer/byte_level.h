// GPT-2's byte-level alphabet: every byte is shown as one printable code point, so that a byte-level BPE
// vocabulary can be stored as text (tokenizer.json). Printable Latin-1 bytes map to themselves; the other 68
// bytes map to U+0100.. in byte order (space -> U+0120 'Ġ', newline -> U+010A 'Ċ').
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace qspec::byte_level {

// The UTF-8 text of the code point that stands for `byte`.
const std::string& encode_byte(unsigned char byte);

// The bytes that `text` stands for, or nothing when one of its code points is not in the alphabet.
// `text` must be valid UTF-8.
std::optional<std::string> decode(std::string_view text);

}  // namespace qspec::byte_level
