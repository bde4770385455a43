#include "tokenizer/jinja_unicode.h"

#include <utf8proc.h>

#include "tokenizer/jinja_value.h"

namespace qspec::jinja {

std::u32string decode_utf8(std::string_view text) {
  std::u32string code_points;
  code_points.reserve(text.size());
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  auto remaining = static_cast<utf8proc_ssize_t>(text.size());
  while (remaining > 0) {
    utf8proc_int32_t code_point = 0;
    utf8proc_ssize_t length = utf8proc_iterate(bytes, remaining, &code_point);
    if (length <= 0) throw ValueError("string is not valid UTF-8");
    code_points.push_back(static_cast<char32_t>(code_point));
    bytes += length;
    remaining -= length;
  }
  return code_points;
}

void append_utf8(std::string& out, char32_t code_point) {
  utf8proc_uint8_t buffer[4];
  utf8proc_ssize_t length = utf8proc_encode_char(static_cast<utf8proc_int32_t>(code_point), buffer);
  out.append(reinterpret_cast<const char*>(buffer), static_cast<size_t>(length));
}

std::string encode_utf8(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t code_point : code_points) append_utf8(out, code_point);
  return out;
}

namespace {

utf8proc_category_t category(char32_t code_point) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(code_point));
}

}  // namespace

bool is_python_space(char32_t c) {
  if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f) || c == 0x85) return true;
  if (c < 0xa0) return false;
  utf8proc_category_t cat = category(c);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool is_python_printable(char32_t c) {
  if (c == ' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool is_cased_letter(char32_t c) {
  utf8proc_category_t cat = category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

bool is_alphabetic(char32_t c) {
  utf8proc_category_t cat = category(c);
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}

bool is_decimal_digit(char32_t c) {
  return category(c) == UTF8PROC_CATEGORY_ND;
}

bool is_alphanumeric(char32_t c) {
  utf8proc_category_t cat = category(c);
  return is_alphabetic(c) || cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL ||
         cat == UTF8PROC_CATEGORY_NO;
}

bool is_uppercase(char32_t c) {
  return utf8proc_isupper(static_cast<utf8proc_int32_t>(c));
}
bool is_lowercase(char32_t c) {
  return utf8proc_islower(static_cast<utf8proc_int32_t>(c));
}

char32_t to_upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_title(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

std::string to_upper(std::string_view text) {
  std::u32string code_points = decode_utf8(text);
  for (char32_t& c : code_points) c = to_upper(c);
  return encode_utf8(code_points);
}

std::string to_lower(std::string_view text) {
  std::u32string code_points = decode_utf8(text);
  for (char32_t& c : code_points) c = to_lower(c);
  return encode_utf8(code_points);
}

}  // namespace qspec::jinja
