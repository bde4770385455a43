#include "tokenizer/onig_pattern.h"

#include <cstdint>
#include <span>

#include "fmt/format.h"
#include "tokenizer/code_point_range.h"

namespace qspec {
namespace {

constexpr CodePointRange kNewerLetters[] = {
    {0x1C89, 0x1C8A},   {0xA7CB, 0xA7CD},   {0xA7DA, 0xA7DC},   {0x105C0, 0x105F3}, {0x10D4A, 0x10D65},
    {0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4}, {0x1123F, 0x11240}, {0x11380, 0x11389}, {0x1138B, 0x1138B},
    {0x1138E, 0x1138E}, {0x11390, 0x113B5}, {0x113B7, 0x113B7}, {0x113D1, 0x113D1}, {0x113D3, 0x113D3},
    {0x11BC0, 0x11BE0}, {0x11F02, 0x11F02}, {0x11F04, 0x11F10}, {0x11F12, 0x11F33}, {0x1342F, 0x1342F},
    {0x13441, 0x13446}, {0x13460, 0x143FA}, {0x16100, 0x1611D}, {0x16D40, 0x16D6C}, {0x18CFF, 0x18CFF},
    {0x1B132, 0x1B132}, {0x1B155, 0x1B155}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D}, {0x1E4D0, 0x1E4EB},
    {0x1E5D0, 0x1E5ED}, {0x1E5F0, 0x1E5F0}, {0x2B739, 0x2B739}, {0x2EBF0, 0x2EE5D}, {0x31350, 0x323AF},
};
constexpr CodePointRange kNewerMarks[] = {
    {0x0897, 0x0897},   {0x0CF3, 0x0CF3},   {0x0ECE, 0x0ECE},   {0x10D69, 0x10D6D}, {0x10EFC, 0x10EFF},
    {0x11241, 0x11241}, {0x113B8, 0x113C0}, {0x113C2, 0x113C2}, {0x113C5, 0x113C5}, {0x113C7, 0x113CA},
    {0x113CC, 0x113D0}, {0x113D2, 0x113D2}, {0x113E1, 0x113E2}, {0x11F00, 0x11F01}, {0x11F03, 0x11F03},
    {0x11F34, 0x11F3A}, {0x11F3E, 0x11F42}, {0x11F5A, 0x11F5A}, {0x13440, 0x13440}, {0x13447, 0x13455},
    {0x1611E, 0x1612F}, {0x1E08F, 0x1E08F}, {0x1E4EC, 0x1E4EF}, {0x1E5EE, 0x1E5EF},
};
constexpr CodePointRange kNewerNumbers[] = {
    {0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9}, {0x11F50, 0x11F59}, {0x16130, 0x16139},
    {0x16D70, 0x16D79}, {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3}, {0x1E4F0, 0x1E4F9}, {0x1E5F1, 0x1E5FA},
};

// The class items for the newer code points, to go inside [...].
std::string class_items(std::span<const CodePointRange> ranges) {
  std::string items;
  for (const CodePointRange& range : ranges) {
    items += fmt::format("\\x{{{:X}}}", range.first);
    if (range.last != range.first) items += fmt::format("-\\x{{{:X}}}", range.last);
  }
  return items;
}

std::span<const CodePointRange> newer_code_points(char property) {
  switch (property) {
    case 'L':
      return kNewerLetters;
    case 'M':
      return kNewerMarks;
    default:
      return kNewerNumbers;
  }
}

}  // namespace

std::string onig_to_pcre2(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() * 4);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != '\\' || i + 1 == pattern.size()) {
      if (c == '[' && !in_class) in_class = true;
      // A ']' right after '[' or '[^' is a literal in both engines.
      else if (c == ']' && in_class && pattern[i - 1] != '[' &&
               !(pattern[i - 1] == '^' && pattern[i - 2] == '['))
        in_class = false;
      out += c;
      continue;
    }
    const char escaped = pattern[++i];
    const std::string_view rest = std::string_view(pattern).substr(i);
    if (escaped == 's') {
      out += "\\p{White_Space}";
    } else if (escaped == 'S') {
      out += "\\P{White_Space}";
    } else if (rest.starts_with("p{L}") || rest.starts_with("p{M}") || rest.starts_with("p{N}")) {
      const std::string items = fmt::format("\\p{{{}}}{}", rest[2], class_items(newer_code_points(rest[2])));
      out += in_class ? items : "[" + items + "]";
      i += 3;
    } else {
      out += '\\';
      out += escaped;
    }
  }
  return out;
}

}  // namespace qspec
