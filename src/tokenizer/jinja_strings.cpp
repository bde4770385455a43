#include "tokenizer/jinja_strings.h"

#include <algorithm>

#include "tokenizer/jinja_unicode.h"
#include "tokenizer/jinja_value.h"

namespace qspec::jinja {

namespace {

int64_t code_points_before(std::string_view text, size_t byte_offset) {
  int64_t count = 0;
  for (size_t i = 0; i < byte_offset; ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xc0) != 0x80) ++count;
  }
  return count;
}

}  // namespace

std::string python_strip(std::string_view text, const std::optional<std::string>& chars, StripSide side) {
  std::u32string strip_set = chars ? decode_utf8(*chars) : std::u32string();
  auto strippable = [&](char32_t c) {
    return chars ? strip_set.find(c) != std::u32string::npos : is_python_space(c);
  };
  // Only the code points at the two ends are decoded: contents are usually long and stripped of little.
  auto code_point_at = [&](size_t begin, size_t end) {
    return decode_utf8(text.substr(begin, end - begin)).front();
  };
  auto is_continuation = [&](size_t at) { return (static_cast<unsigned char>(text[at]) & 0xc0) == 0x80; };
  size_t begin = 0;
  size_t end = text.size();
  if (side != StripSide::kRight) {
    while (begin < end) {
      size_t next = begin + 1;
      while (next < end && is_continuation(next)) ++next;
      if (!strippable(code_point_at(begin, next))) break;
      begin = next;
    }
  }
  if (side != StripSide::kLeft) {
    while (end > begin) {
      size_t previous = end - 1;
      while (previous > begin && is_continuation(previous)) --previous;
      if (!strippable(code_point_at(previous, end))) break;
      end = previous;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

std::vector<std::string> python_split(std::string_view text, const std::optional<std::string>& separator,
                                      int64_t max_split, bool from_right) {
  std::vector<std::string> parts;
  if (separator) {
    if (separator->empty()) throw ValueError("empty separator");
    if (!from_right) {
      size_t start = 0;
      while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
        size_t found = text.find(*separator, start);
        if (found == std::string_view::npos) break;
        parts.emplace_back(text.substr(start, found - start));
        start = found + separator->size();
      }
      parts.emplace_back(text.substr(start));
      return parts;
    }
    size_t end = text.size();
    while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
      if (end < separator->size()) break;
      size_t found = text.rfind(*separator, end - separator->size());
      if (found == std::string_view::npos) break;
      parts.emplace_back(text.substr(found + separator->size(), end - found - separator->size()));
      end = found;
    }
    parts.emplace_back(text.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  // Whitespace splitting: runs of whitespace separate, empty strings never appear.
  std::u32string code_points = decode_utf8(text);
  if (from_right) std::reverse(code_points.begin(), code_points.end());
  size_t i = 0;
  size_t n = code_points.size();
  while (true) {
    while (i < n && is_python_space(code_points[i])) ++i;
    if (i == n) break;
    if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
      // The unsplit remainder keeps its trailing whitespace, as in Python.
      std::u32string rest = code_points.substr(i);
      if (from_right) std::reverse(rest.begin(), rest.end());
      parts.push_back(encode_utf8(rest));
      break;
    }
    size_t start = i;
    while (i < n && !is_python_space(code_points[i])) ++i;
    std::u32string word = code_points.substr(start, i - start);
    if (from_right) std::reverse(word.begin(), word.end());
    parts.push_back(encode_utf8(word));
  }
  if (from_right) std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> python_splitlines(std::string_view text, bool keep_ends) {
  std::u32string code_points = decode_utf8(text);
  std::vector<std::string> lines;
  size_t start = 0;
  size_t i = 0;
  while (i < code_points.size()) {
    char32_t c = code_points[i];
    bool is_break = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                    c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) {
      ++i;
      continue;
    }
    size_t break_end = i + 1;
    if (c == '\r' && break_end < code_points.size() && code_points[break_end] == '\n') ++break_end;
    size_t line_end = keep_ends ? break_end : i;
    lines.push_back(encode_utf8(std::u32string_view(code_points).substr(start, line_end - start)));
    start = i = break_end;
  }
  if (start < code_points.size())
    lines.push_back(encode_utf8(std::u32string_view(code_points).substr(start)));
  return lines;
}

std::string python_replace(std::string_view text, std::string_view old_text, std::string_view new_text,
                           int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts `new` before every code point and at the end.
    std::u32string code_points = decode_utf8(text);
    int64_t inserted = 0;
    for (char32_t c : code_points) {
      if (count < 0 || inserted < count) {
        out += new_text;
        ++inserted;
      }
      append_utf8(out, c);
    }
    if (count < 0 || inserted < count) out += new_text;
    return out;
  }
  size_t start = 0;
  int64_t replaced = 0;
  while (count < 0 || replaced < count) {
    size_t found = text.find(old_text, start);
    if (found == std::string_view::npos) break;
    out += text.substr(start, found - start);
    out += new_text;
    start = found + old_text.size();
    ++replaced;
  }
  out += text.substr(start);
  return out;
}

std::string python_title(std::string_view text) {
  std::u32string code_points = decode_utf8(text);
  bool previous_cased = false;
  for (char32_t& c : code_points) {
    c = previous_cased ? to_lower(c) : to_title(c);
    previous_cased = is_cased_letter(c);
  }
  return encode_utf8(code_points);
}

std::string python_capitalize(std::string_view text) {
  std::u32string code_points = decode_utf8(text);
  for (size_t i = 0; i < code_points.size(); ++i)
    code_points[i] = i == 0 ? to_title(code_points[i]) : to_lower(code_points[i]);
  return encode_utf8(code_points);
}

int64_t python_find(std::string_view text, std::string_view needle, bool from_right) {
  size_t found = from_right ? text.rfind(needle) : text.find(needle);
  if (found == std::string_view::npos) return -1;
  return code_points_before(text, found);
}

int64_t python_count(std::string_view text, std::string_view needle) {
  if (needle.empty()) return static_cast<int64_t>(decode_utf8(text).size()) + 1;
  int64_t count = 0;
  for (size_t found = text.find(needle); found != std::string_view::npos;
       found = text.find(needle, found + needle.size())) {
    ++count;
  }
  return count;
}

}  // namespace qspec::jinja
