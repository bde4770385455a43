// Python's str methods that templates call (split, strip, replace, title, ...), on UTF-8 strings with
// Python's Unicode whitespace and case rules.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qspec::jinja {

enum class StripSide { kLeft, kRight, kBoth };
// str.strip(chars): `chars` nullopt strips whitespace.
std::string python_strip(std::string_view text, const std::optional<std::string>& chars, StripSide side);
// str.split(sep, maxsplit) / str.rsplit: `sep` nullopt splits on whitespace runs; maxsplit < 0 is unlimited.
std::vector<std::string> python_split(std::string_view text, const std::optional<std::string>& separator,
                                      int64_t max_split, bool from_right);
std::vector<std::string> python_splitlines(std::string_view text, bool keep_ends);
// str.replace(old, new, count); count < 0 replaces all.
std::string python_replace(std::string_view text, std::string_view old_text, std::string_view new_text,
                           int64_t count);
std::string python_title(std::string_view text);
std::string python_capitalize(std::string_view text);
// str.find / str.rfind / str.count in code points.
int64_t python_find(std::string_view text, std::string_view needle, bool from_right);
int64_t python_count(std::string_view text, std::string_view needle);

}  // namespace qspec::jinja
