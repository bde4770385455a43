#include "tokenizer/nfc.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace qspec {
namespace {

// Every code point below U+0300 is its own NFC and composes with nothing before it, so text without a byte
// >= 0xCC (the lead byte of U+0300) is already NFC: most prose and code skips utf8proc entirely.
bool trivially_nfc(std::string_view text) {
  return std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; });
}

struct FreeDeleter {
  void operator()(utf8proc_uint8_t* p) const { std::free(p); }
};

}  // namespace

std::string to_nfc(std::string_view text) {
  if (trivially_nfc(text)) return std::string(text);
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t length = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
      &composed, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, FreeDeleter> owner(composed);
  if (length < 0) fail("NFC normalization failed: {}", utf8proc_errmsg(length));
  return std::string(reinterpret_cast<const char*>(composed), static_cast<size_t>(length));
}

}  // namespace qspec
