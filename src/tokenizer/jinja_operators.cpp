#include "tokenizer/jinja_operators.h"

#include <fmt/format.h>

#include <cmath>

namespace qspec::jinja {

namespace {

[[noreturn]] void unsupported(BinaryOp op, const Value& left, const Value& right) {
  throw ValueError(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", operator_symbol(op),
                               left.type_name(), right.type_name()));
}

[[noreturn]] void overflow() {
  throw ValueError("integer overflow (values beyond 64 bits are not supported)");
}

int64_t add(int64_t a, int64_t b) {
  int64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) overflow();
  return result;
}

int64_t subtract(int64_t a, int64_t b) {
  int64_t result = 0;
  if (__builtin_sub_overflow(a, b, &result)) overflow();
  return result;
}

int64_t multiply(int64_t a, int64_t b) {
  int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) overflow();
  return result;
}

int64_t floor_divide(int64_t a, int64_t b) {
  if (b == 0) throw ValueError("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1)
    throw ValueError("integer overflow (values beyond 64 bits are not supported)");
  int64_t quotient = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --quotient;
  return quotient;
}

int64_t python_modulo(int64_t a, int64_t b) {
  if (b == 0) throw ValueError("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t remainder = a % b;
  if (remainder != 0 && ((remainder < 0) != (b < 0))) remainder += b;
  return remainder;
}

double float_modulo(double a, double b) {
  if (b == 0.0) throw ValueError("float modulo");
  double remainder = std::fmod(a, b);
  if (remainder != 0.0 && ((remainder < 0) != (b < 0))) remainder += b;
  return remainder;
}

int64_t integer_power(int64_t base, int64_t exponent) {
  int64_t result = 1;
  while (exponent > 0) {
    if (exponent & 1) result = multiply(result, base);
    exponent >>= 1;
    if (exponent > 0) base = multiply(base, base);
  }
  return result;
}

Value repeat(const Value& sequence, int64_t times) {
  if (times <= 0) return sequence.is_string() ? Value("") : Value::list({});
  if (sequence.is_string()) {
    const std::string& text = sequence.as_string();
    if (text.empty()) return sequence;
    if (static_cast<uint64_t>(times) > kMaxBuiltSize / text.size()) {
      throw ValueError(fmt::format("string repetition would exceed {} bytes", kMaxBuiltSize));
    }
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += text;
    return Value(std::move(out));
  }
  const List& list = sequence.as_list();
  if (list.items.empty()) return sequence;
  if (static_cast<uint64_t>(times) > kMaxBuiltSize / list.items.size()) {
    throw ValueError(fmt::format("list repetition would exceed {} items", kMaxBuiltSize));
  }
  std::vector<Value> items;
  for (int64_t i = 0; i < times; ++i) items.insert(items.end(), list.items.begin(), list.items.end());
  return list.is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

bool is_integral(const Value& value) {
  return value.is_int() || value.is_bool();
}

Value numeric(BinaryOp op, const Value& left, const Value& right) {
  if (is_integral(left) && is_integral(right)) {
    int64_t a = left.to_integer();
    int64_t b = right.to_integer();
    switch (op) {
      case BinaryOp::kAdd:
        return Value(add(a, b));
      case BinaryOp::kSubtract:
        return Value(subtract(a, b));
      case BinaryOp::kMultiply:
        return Value(multiply(a, b));
      case BinaryOp::kDivide:
        if (b == 0) throw ValueError("division by zero");
        return Value(static_cast<double>(a) / static_cast<double>(b));
      case BinaryOp::kFloorDivide:
        return Value(floor_divide(a, b));
      case BinaryOp::kModulo:
        return Value(python_modulo(a, b));
      case BinaryOp::kPower:
        if (b < 0) return Value(std::pow(static_cast<double>(a), static_cast<double>(b)));
        return Value(integer_power(a, b));
      default:
        break;
    }
  }
  double a = left.to_double();
  double b = right.to_double();
  switch (op) {
    case BinaryOp::kAdd:
      return Value(a + b);
    case BinaryOp::kSubtract:
      return Value(a - b);
    case BinaryOp::kMultiply:
      return Value(a * b);
    case BinaryOp::kDivide:
      if (b == 0.0) throw ValueError("float division by zero");
      return Value(a / b);
    case BinaryOp::kFloorDivide:
      if (b == 0.0) throw ValueError("float floor division by zero");
      return Value(std::floor(a / b));
    case BinaryOp::kModulo:
      return Value(float_modulo(a, b));
    case BinaryOp::kPower:
      return Value(std::pow(a, b));
    default:
      unsupported(op, left, right);
  }
}

}  // namespace

std::string_view operator_symbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAnd:
      return "and";
    case BinaryOp::kOr:
      return "or";
    case BinaryOp::kAdd:
      return "+";
    case BinaryOp::kSubtract:
      return "-";
    case BinaryOp::kMultiply:
      return "*";
    case BinaryOp::kDivide:
      return "/";
    case BinaryOp::kFloorDivide:
      return "//";
    case BinaryOp::kModulo:
      return "%";
    case BinaryOp::kPower:
      return "**";
    case BinaryOp::kConcat:
      return "~";
  }
  return "?";
}

Value binary_operation(BinaryOp op, const Value& left, const Value& right) {
  left.require_defined();
  right.require_defined();
  if (left.is_number() && right.is_number()) return numeric(op, left, right);
  if (op == BinaryOp::kAdd && left.is_string() && right.is_string()) {
    if (left.as_string().size() + right.as_string().size() > kMaxBuiltSize) {
      throw ValueError(fmt::format("string concatenation would exceed {} bytes", kMaxBuiltSize));
    }
    return Value(left.as_string() + right.as_string());
  }
  if (op == BinaryOp::kAdd && left.is_list() && right.is_list() &&
      left.as_list().is_tuple == right.as_list().is_tuple) {
    std::vector<Value> items = left.as_list().items;
    items.insert(items.end(), right.as_list().items.begin(), right.as_list().items.end());
    if (items.size() > kMaxBuiltSize) throw ValueError("list concatenation is too long");
    return left.as_list().is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  if (op == BinaryOp::kMultiply) {
    if ((left.is_string() || left.is_list()) && is_integral(right)) return repeat(left, right.to_integer());
    if ((right.is_string() || right.is_list()) && is_integral(left)) return repeat(right, left.to_integer());
  }
  if (op == BinaryOp::kModulo && left.is_string()) {
    throw ValueError("printf-style string formatting ('%' on a string) is not supported");
  }
  unsupported(op, left, right);
}

Value unary_operation(UnaryOp op, const Value& operand) {
  if (op == UnaryOp::kNot) return Value(!operand.truthy());
  operand.require_defined();
  if (is_integral(operand)) {
    int64_t value = operand.to_integer();
    if (op == UnaryOp::kPlus) return Value(value);
    return Value(subtract(0, value));
  }
  if (operand.is_float()) return Value(op == UnaryOp::kPlus ? operand.as_float() : -operand.as_float());
  throw ValueError(fmt::format("bad operand type for unary {}: '{}'", op == UnaryOp::kPlus ? "+" : "-",
                               operand.type_name()));
}

}  // namespace qspec::jinja
