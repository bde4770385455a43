// Python's arithmetic and unary operators on template values (int/float promotion, floor division and
// modulo signs, str/list concatenation and repetition), with overflow and size checks.
#pragma once

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace qspec::jinja {

// Strings and lists built by operators may not exceed this many bytes/items.
inline constexpr size_t kMaxBuiltSize = size_t{64} << 20;

// Arithmetic only: `and`/`or` short-circuit in the interpreter, `~` is str(a) + str(b).
Value binary_operation(BinaryOp op, const Value& left, const Value& right);
Value unary_operation(UnaryOp op, const Value& operand);
std::string_view operator_symbol(BinaryOp op);

}  // namespace qspec::jinja
