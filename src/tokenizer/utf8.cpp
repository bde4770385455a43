#include "tokenizer/utf8.h"

#include "core/error.h"

namespace qspec::utf8 {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

struct LeadRule {
  size_t length;            // bytes in the sequence; 0: not a lead byte
  unsigned char low, high;  // the allowed range of the second byte (it excludes overlongs and surrogates)
};

LeadRule lead_rule(unsigned char lead) {
  if (lead < 0x80) return {1, 0, 0};
  if (lead >= 0xC2 && lead <= 0xDF) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};
  if (lead == 0xED) return {3, 0x80, 0x9F};
  if (lead >= 0xE1 && lead <= 0xEF) return {3, 0x80, 0xBF};
  if (lead == 0xF0) return {4, 0x90, 0xBF};
  if (lead >= 0xF1 && lead <= 0xF3) return {4, 0x80, 0xBF};
  if (lead == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

Sequence scan_sequence(std::string_view bytes) {
  const auto lead = static_cast<unsigned char>(bytes[0]);
  const LeadRule rule = lead_rule(lead);
  if (rule.length == 0) return {Scan::kInvalid, 1};
  for (size_t i = 1; i < rule.length; ++i) {
    if (i == bytes.size()) return {Scan::kIncomplete, i};
    const auto byte = static_cast<unsigned char>(bytes[i]);
    const bool fits = i == 1 ? (byte >= rule.low && byte <= rule.high) : (byte >= 0x80 && byte <= 0xBF);
    if (!fits) return {Scan::kInvalid, i};
  }
  return {Scan::kComplete, rule.length};
}

void require_valid(std::string_view text, std::string_view what) {
  size_t offset = 0;
  while (offset < text.size()) {
    // ASCII needs no scan; it is most of most inputs.
    if (static_cast<unsigned char>(text[offset]) < 0x80) {
      ++offset;
      continue;
    }
    const Sequence sequence = scan_sequence(text.substr(offset));
    if (sequence.scan != Scan::kComplete) {
      fail("{} is not valid UTF-8: {} sequence at byte offset {} (byte 0x{:02X})", what,
           sequence.scan == Scan::kInvalid ? "invalid" : "truncated", offset,
           static_cast<unsigned char>(text[offset]));
    }
    offset += sequence.length;
  }
}

size_t append_decided(std::string_view bytes, std::string& out) {
  size_t offset = 0;
  while (offset < bytes.size()) {
    const Sequence sequence = scan_sequence(bytes.substr(offset));
    if (sequence.scan == Scan::kIncomplete) break;
    if (sequence.scan == Scan::kComplete) {
      out.append(bytes.substr(offset, sequence.length));
    } else {
      out.append(kReplacement);
    }
    offset += sequence.length;
  }
  return offset;
}

std::string to_valid_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  if (append_decided(bytes, out) < bytes.size()) out.append(kReplacement);
  return out;
}

}  // namespace qspec::utf8
