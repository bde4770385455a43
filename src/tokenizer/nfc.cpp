#include "tokenizer/nfc.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <memory>

#include "core/error.h"
#include "tokenizer/code_point_range.h"
#include "tokenizer/utf8.h"

namespace qspec {
namespace {

// Combining marks assigned after the Unicode version of HF tokenizers' normalizer: HF gives them class 0, so
// nothing is reordered across them and nothing composes through them. Made by
// tools/oracle/tokenizer_nfc_table.py.
constexpr CodePointRange kStartersInHf[] = {
    {0x07FD, 0x07FD},   {0x0898, 0x089F},   {0x08CA, 0x08D3},   {0x09FE, 0x09FE},   {0x0C3C, 0x0C3C},
    {0x0D3B, 0x0D3C},   {0x0EBA, 0x0EBA},   {0x1715, 0x1715},   {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},
    {0xA82C, 0xA82C},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
    {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42},
    {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E4EC, 0x1E4EF},
};

bool is_starter_in_hf(uint32_t code_point) {
  const auto* after =
      std::upper_bound(std::begin(kStartersInHf), std::end(kStartersInHf), code_point,
                       [](uint32_t cp, const CodePointRange& range) { return cp < range.first; });
  return after != std::begin(kStartersInHf) && code_point <= (after - 1)->last;
}

uint32_t decode_code_point(std::string_view sequence) {
  const auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(sequence[i])); };
  switch (sequence.size()) {
    case 1:
      return byte(0);
    case 2:
      return ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
    case 3:
      return ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    default:
      return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) | (byte(3) & 0x3F);
  }
}

// Every code point below U+0300 is its own NFC and composes with nothing before it, so text without a byte
// >= 0xCC (the lead byte of U+0300) is already NFC: most prose and code skips utf8proc entirely.
bool trivially_nfc(std::string_view text) {
  return std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; });
}

struct FreeDeleter {
  void operator()(utf8proc_uint8_t* p) const { std::free(p); }
};

void append_utf8proc_nfc(std::string_view text, std::string& out) {
  if (trivially_nfc(text)) {
    out.append(text);
    return;
  }
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t length = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
      &composed, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, FreeDeleter> owner(composed);
  if (length < 0) fail("NFC normalization failed: {}", utf8proc_errmsg(length));
  out.append(reinterpret_cast<const char*>(composed), static_cast<size_t>(length));
}

}  // namespace

std::string to_nfc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  if (trivially_nfc(text)) {
    out.append(text);
    return out;
  }
  // A starter ends what normalization can change, so the text between HF's extra starters normalizes on its
  // own.
  size_t segment_begin = 0;
  size_t offset = 0;
  while (offset < text.size()) {
    const size_t length = utf8::scan_sequence(text.substr(offset)).length;
    // All the extra starters are at or above U+07FD, whose UTF-8 lead byte is 0xDF.
    if (static_cast<unsigned char>(text[offset]) >= 0xDF &&
        is_starter_in_hf(decode_code_point(text.substr(offset, length)))) {
      append_utf8proc_nfc(text.substr(segment_begin, offset - segment_begin), out);
      out.append(text.substr(offset, length));
      segment_begin = offset + length;
    }
    offset += length;
  }
  append_utf8proc_nfc(text.substr(segment_begin), out);
  return out;
}

}  // namespace qspec
