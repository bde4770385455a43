// UTF-8 scanning shared by the encoder (reject invalid input) and the decoders (never emit a broken
// sequence). The rules are Unicode's well-formed byte sequences (Table 3-7); invalid input is replaced by
// U+FFFD once per "maximal subpart", the same policy as Rust's String::from_utf8_lossy that HF tokenizers'
// decoder uses.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace qspec::utf8 {

enum class Scan { kComplete, kInvalid, kIncomplete };

// The first sequence of `bytes` (non-empty): kComplete with its length; kInvalid with the length of the
// maximal subpart to replace (at least 1); kIncomplete when all of `bytes` is a proper prefix of a valid
// sequence.
struct Sequence {
  Scan scan;
  size_t length;
};
Sequence scan_sequence(std::string_view bytes);

// Throws qspec::Error naming `what`, the byte offset and the byte value when `text` is not valid UTF-8.
void require_valid(std::string_view text, std::string_view what);

// Appends the longest prefix of `bytes` that decides its text to `out`: complete sequences as they are,
// invalid ones as U+FFFD. Returns how many bytes were consumed; the rest is an incomplete sequence (fewer
// than 4 bytes).
size_t append_decided(std::string_view bytes, std::string& out);

// `bytes` as valid UTF-8, with an incomplete sequence at the end also replaced by U+FFFD.
std::string to_valid_lossy(std::string_view bytes);

}  // namespace qspec::utf8
