#include "tokenizer/byte_level.h"

#include <array>
#include <cstdint>

#include "tokenizer/utf8.h"

namespace qspec::byte_level {
namespace {

bool shows_as_itself(unsigned byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
}

std::string code_point_to_utf8(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else {
    // The alphabet ends at U+0143, so two bytes suffice.
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return out;
}

struct Alphabet {
  std::array<std::string, 256> byte_to_text;
  std::array<int, 0x144> code_point_to_byte;  // -1: not in the alphabet

  Alphabet() {
    code_point_to_byte.fill(-1);
    uint32_t next_extra = 0x100;
    for (unsigned byte = 0; byte < 256; ++byte) {
      const uint32_t code_point = shows_as_itself(byte) ? byte : next_extra++;
      byte_to_text[byte] = code_point_to_utf8(code_point);
      code_point_to_byte[code_point] = static_cast<int>(byte);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

}  // namespace

const std::string& encode_byte(unsigned char byte) {
  return alphabet().byte_to_text[byte];
}

std::optional<std::string> decode(std::string_view text) {
  const Alphabet& table = alphabet();
  std::string bytes;
  bytes.reserve(text.size());
  size_t offset = 0;
  while (offset < text.size()) {
    const auto lead = static_cast<unsigned char>(text[offset]);
    uint32_t code_point = lead;
    size_t length = 1;
    if (lead >= 0x80) {
      length = utf8::scan_sequence(text.substr(offset)).length;
      if (length != 2) return std::nullopt;  // every code point of the alphabet is below U+0800
      code_point = ((lead & 0x1Fu) << 6) | (static_cast<unsigned char>(text[offset + 1]) & 0x3Fu);
    }
    if (code_point >= table.code_point_to_byte.size() || table.code_point_to_byte[code_point] < 0) {
      return std::nullopt;
    }
    bytes += static_cast<char>(table.code_point_to_byte[code_point]);
    offset += length;
  }
  return bytes;
}

}  // namespace qspec::byte_level
