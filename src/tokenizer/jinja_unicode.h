// UTF-8 and the few Unicode properties that Python's str methods depend on (isspace, isprintable, case).
#pragma once

#include <string>
#include <string_view>

namespace qspec::jinja {

// Decodes UTF-8 into code points; throws jinja::ValueError on malformed input.
std::u32string decode_utf8(std::string_view text);
std::string encode_utf8(std::u32string_view code_points);
void append_utf8(std::string& out, char32_t code_point);

// Python's str.isspace() for one code point (also what `\s` matches in Python's re).
bool is_python_space(char32_t code_point);
// Python's str.isprintable() for one code point (repr() escapes the others).
bool is_python_printable(char32_t code_point);
bool is_cased_letter(char32_t code_point);
bool is_alphanumeric(char32_t code_point);
bool is_alphabetic(char32_t code_point);
bool is_decimal_digit(char32_t code_point);
bool is_uppercase(char32_t code_point);
bool is_lowercase(char32_t code_point);
char32_t to_upper(char32_t code_point);
char32_t to_lower(char32_t code_point);
char32_t to_title(char32_t code_point);

std::string to_upper(std::string_view text);
std::string to_lower(std::string_view text);

}  // namespace qspec::jinja
