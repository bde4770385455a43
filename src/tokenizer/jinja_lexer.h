// Splits a template into text and tag tokens exactly as jinja2's lexer does with HF's settings
// (trim_blocks, lstrip_blocks, keep_trailing_newline=False, `-`/`+` whitespace control, raw blocks).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qspec::jinja {

struct SourceLocation {
  int line = 1;
  int column = 1;
};

enum class TokenType {
  kText,
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // text holds the unescaped value
  kInteger,
  kFloat,
  kOperator,
  kEnd,
};

struct Token {
  TokenType type;
  std::string text;
  SourceLocation where;
  int64_t integer = 0;
  double number = 0.0;
};

// Throws qspec::Error naming `template_name`, line and column on malformed input (unclosed tags, comments,
// strings or brackets; unexpected characters).
std::vector<Token> tokenize(std::string_view source, std::string_view template_name);

}  // namespace qspec::jinja
