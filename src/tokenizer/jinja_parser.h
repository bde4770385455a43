// Parses lexer tokens into a syntax tree with jinja2's grammar and operator precedence.
#pragma once

#include <string_view>
#include <vector>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace qspec::jinja {

// Blocks, parentheses and brackets may nest this deep; deeper input is refused (no unbounded recursion).
inline constexpr int kMaxParseDepth = 128;

// Throws qspec::Error naming `template_name`, line, column and the construct on a syntax error, an unknown
// tag, filter or test, or an unclosed block.
Body parse(const std::vector<Token>& tokens, std::string_view template_name);

}  // namespace qspec::jinja
