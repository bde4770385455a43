#include "tokenizer/jinja_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "tokenizer/jinja_unicode.h"

namespace qspec::jinja {

namespace {

int check_depth(int depth) {
  if (depth > kMaxValueDepth)
    throw ValueError(fmt::format("value nested deeper than {} levels", kMaxValueDepth));
  return depth;
}

int deepest(const std::vector<Value>& items) {
  int depth = 0;
  for (const Value& item : items) depth = std::max(depth, item.depth());
  return depth;
}

bool any_reference(const std::vector<Value>& items) {
  return std::any_of(items.begin(), items.end(), [](const Value& item) { return item.holds_reference(); });
}

}  // namespace

Value Value::list(std::vector<Value> items) {
  int depth = check_depth(deepest(items) + 1);
  bool holds_reference = any_reference(items);
  return Value(std::make_shared<const List>(List{std::move(items), false, depth, holds_reference}));
}

Value Value::tuple(std::vector<Value> items) {
  int depth = check_depth(deepest(items) + 1);
  bool holds_reference = any_reference(items);
  return Value(std::make_shared<const List>(List{std::move(items), true, depth, holds_reference}));
}

Value Value::dict(std::vector<std::pair<Value, Value>> entries) {
  int depth = 0;
  bool holds_reference = false;
  for (const auto& [key, value] : entries) {
    depth = std::max({depth, key.depth(), value.depth()});
    holds_reference = holds_reference || key.holds_reference() || value.holds_reference();
  }
  // Later duplicates replace earlier ones in place, as in a Python dict literal. A str never equals a
  // non-str in Python, so string keys are deduplicated by hash and the (rare) others by comparison.
  Dict dict{{}, check_depth(depth + 1), holds_reference, {}};
  dict.entries.reserve(entries.size());
  for (auto& entry : entries) {
    require_hashable(entry.first);
    if (entry.first.is_string()) {
      auto [position, inserted] = dict.string_keys.emplace(entry.first.as_string(), dict.entries.size());
      if (!inserted) {
        dict.entries[position->second].second = std::move(entry.second);
        continue;
      }
    } else {
      auto existing = std::find_if(dict.entries.begin(), dict.entries.end(),
                                   [&](const auto& kept) { return equals(kept.first, entry.first); });
      if (existing != dict.entries.end()) {
        existing->second = std::move(entry.second);
        continue;
      }
    }
    dict.entries.push_back(std::move(entry));
  }
  return Value(std::make_shared<const Dict>(std::move(dict)));
}

Value make_function(std::string name, std::function<Value(CallArguments&)> call) {
  return Value(std::make_shared<const Function>(Function{std::move(name), std::move(call)}));
}

int Value::depth() const {
  if (is_list()) return as_list().depth;
  if (is_dict()) return as_dict().depth;
  return 0;
}

bool Value::holds_reference() const {
  if (is_namespace() || is_function()) return true;
  if (is_list()) return as_list().holds_reference;
  if (is_dict()) return as_dict().holds_reference;
  return false;
}

const Value& Value::require_defined() const {
  if (is_undefined()) throw ValueError(undefined_reason());
  return *this;
}

int64_t Value::to_integer() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  if (is_int()) return as_int();
  require_defined();
  throw ValueError(fmt::format("expected an integer, got '{}'", type_name()));
}

double Value::to_double() const {
  if (is_float()) return as_float();
  if (is_bool() || is_int()) return static_cast<double>(to_integer());
  require_defined();
  throw ValueError(fmt::format("expected a number, got '{}'", type_name()));
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().items.empty();
    case Kind::kDict:
      return !as_dict().entries.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return as_list().is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "object";
}

std::string repr_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: fixed notation for 1e-4 <= |x| < 1e16.
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string scientific(buffer, end);
  size_t e = scientific.find('e');
  std::string mantissa = scientific.substr(0, e);
  int exponent = std::stoi(scientific.substr(e + 1));
  bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  int decimal_point = exponent + 1;  // value = 0.DIGITS * 10^decimal_point
  std::string out = negative ? "-" : "";
  if (decimal_point > 16 || decimal_point < -3) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  } else if (decimal_point <= 0) {
    out.append("0.").append(static_cast<size_t>(-decimal_point), '0').append(digits);
  } else if (static_cast<size_t>(decimal_point) >= digits.size()) {
    out.append(digits).append(static_cast<size_t>(decimal_point) - digits.size(), '0').append(".0");
  } else {
    out.append(digits, 0, static_cast<size_t>(decimal_point))
        .append(".")
        .append(digits, static_cast<size_t>(decimal_point));
  }
  return out;
}

std::string repr_string(std::string_view text) {
  bool has_single = text.find('\'') != std::string_view::npos;
  bool has_double = text.find('"') != std::string_view::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode_utf8(text)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (is_python_printable(c)) {
      append_utf8(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<uint32_t>(c));
    }
  }
  out += quote;
  return out;
}

std::string Value::str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return as_string();
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return repr_float(as_float());
    case Kind::kString:
      return repr_string(as_string());
    case Kind::kList: {
      const List& list = as_list();
      std::string out = list.is_tuple ? "(" : "[";
      for (size_t i = 0; i < list.items.size(); ++i) {
        if (i > 0) out += ", ";
        out += list.items[i].repr();
      }
      if (list.is_tuple && list.items.size() == 1) out += ",";
      return out + (list.is_tuple ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : as_dict().entries) {
        if (!first) out += ", ";
        first = false;
        out += key.repr() + ": " + value.repr();
      }
      return out + "}";
    }
    case Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [name, value] : as_namespace().attributes) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(name) + ": " + value.repr();
      }
      return out + "}>";
    }
    case Kind::kFunction:
      return fmt::format("<function {}>", as_function().name);
  }
  return "";
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) {
    auto found = string_keys.find(key.as_string());
    return found == string_keys.end() ? nullptr : &entries[found->second].second;
  }
  for (const auto& [entry_key, entry_value] : entries) {
    if (equals(entry_key, key)) return &entry_value;
  }
  return nullptr;
}

const Value* Namespace::find(std::string_view name) const {
  for (const auto& [attribute, value] : attributes) {
    if (attribute == name) return &value;
  }
  return nullptr;
}

void Namespace::set(const std::string& name, Value value) {
  for (auto& [attribute, existing] : attributes) {
    if (attribute == name) {
      existing = std::move(value);
      return;
    }
  }
  attributes.emplace_back(name, std::move(value));
}

void require_hashable(const Value& value) {
  bool hashable = value.is_list() ? value.as_list().is_tuple : !value.is_dict();
  if (!hashable) throw ValueError(fmt::format("unhashable type: '{}'", value.type_name()));
  if (value.is_list()) {
    for (const Value& item : value.as_list().items) require_hashable(item);
  }
}

bool equals(const Value& a, const Value& b) {
  using Kind = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    return a.to_integer() == b.to_integer();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.as_string() == b.as_string();
    case Kind::kList: {
      const List& x = a.as_list();
      const List& y = b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equals(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [key, value] : x.entries) {
        const Value* other = y.find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace:
      return &a.as_namespace() == &b.as_namespace();
    case Kind::kFunction:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

int compare(const Value& a, const Value& b, std::string_view op) {
  a.require_defined();
  b.require_defined();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.to_double();
      double y = b.to_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.to_integer();
    int64_t y = b.to_integer();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order, which is Python's string order.
    int order = a.as_string().compare(b.as_string());
    return order < 0 ? -1 : (order > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw ValueError(
      fmt::format("'{}' not supported between instances of '{}' and '{}'", op, a.type_name(), b.type_name()));
}

size_t length(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return decode_utf8(value.as_string()).size();
    case Value::Kind::kList:
      return value.as_list().items.size();
    case Value::Kind::kDict:
      return value.as_dict().entries.size();
    default:
      throw ValueError(fmt::format("object of type '{}' has no len()", value.type_name()));
  }
}

std::vector<Value> iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kString: {
      std::vector<Value> characters;
      for (char32_t c : decode_utf8(value.as_string()))
        characters.emplace_back(encode_utf8(std::u32string(1, c)));
      return characters;
    }
    case Value::Kind::kList:
      return value.as_list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& entry : value.as_dict().entries) keys.push_back(entry.first);
      return keys;
    }
    default:
      throw ValueError(fmt::format("'{}' object is not iterable", value.type_name()));
  }
}

bool contains(const Value& haystack, const Value& needle) {
  switch (haystack.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!needle.is_string()) {
        throw ValueError(
            fmt::format("'in <string>' requires string as left operand, not {}", needle.type_name()));
      }
      return haystack.as_string().find(needle.as_string()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(haystack.as_list().items.begin(), haystack.as_list().items.end(),
                         [&](const Value& item) { return equals(item, needle); });
    case Value::Kind::kDict:
      require_hashable(needle);
      return haystack.as_dict().find(needle) != nullptr;
    case Value::Kind::kNamespace:
      return needle.is_string() && haystack.as_namespace().find(needle.as_string()) != nullptr;
    default:
      throw ValueError(fmt::format("argument of type '{}' is not iterable", haystack.type_name()));
  }
}

std::vector<std::optional<Value>> bind_arguments(const CallArguments& args, std::string_view callee,
                                                 const std::vector<std::string_view>& parameters) {
  if (args.positional.size() > parameters.size()) {
    throw ValueError(fmt::format("{}() takes at most {} argument(s), {} given", callee, parameters.size(),
                                 args.positional.size()));
  }
  std::vector<std::optional<Value>> bound(parameters.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [name, value] : args.keyword) {
    auto it = std::find(parameters.begin(), parameters.end(), name);
    if (it == parameters.end()) {
      throw ValueError(fmt::format("{}() got an unexpected keyword argument '{}'", callee, name));
    }
    auto index = static_cast<size_t>(it - parameters.begin());
    if (bound[index])
      throw ValueError(fmt::format("{}() got multiple values for argument '{}'", callee, name));
    bound[index] = value;
  }
  return bound;
}

}  // namespace qspec::jinja
