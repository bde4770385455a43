// jinja2's built-in tests (`x is defined`, `x is string`, `x is divisibleby 3`, ...).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_unicode.h"

namespace qspec::jinja {

namespace {

using Test = bool (*)(const Value& value, const std::vector<std::optional<Value>>& args);

const Value& required(const std::vector<std::optional<Value>>& args, size_t index, std::string_view test) {
  if (index >= args.size() || !args[index])
    throw ValueError(fmt::format("test '{}' needs an argument", test));
  return *args[index];
}

// Python's `a is b`: identity for containers, value identity for the interned scalars.
bool same_object(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kList:
      return &a.as_list() == &b.as_list();
    case Value::Kind::kDict:
      return &a.as_dict() == &b.as_dict();
    default:
      return equals(a, b);
  }
}

bool remainder_is_zero(const Value& value, const Value& divisor) {
  if (value.is_float() || divisor.is_float()) return std::fmod(value.to_double(), divisor.to_double()) == 0.0;
  int64_t d = divisor.to_integer();
  if (d == 0) throw ValueError("integer division or modulo by zero");
  return value.to_integer() % d == 0;
}

bool all_cased_as(const Value& value, bool upper) {
  bool any_cased = false;
  for (char32_t c : decode_utf8(value.str())) {
    if (upper ? is_lowercase(c) : is_uppercase(c)) return false;
    if (is_cased_letter(c)) any_cased = true;
  }
  return any_cased;
}

struct TestSpec {
  Test test;
  size_t arity;  // number of arguments after the value
};

const std::map<std::string_view, TestSpec>& tests() {
  using Args = const std::vector<std::optional<Value>>&;
  static const std::map<std::string_view, TestSpec> table = [] {
    std::map<std::string_view, TestSpec> t;
    t["defined"] = {[](const Value& v, Args) { return !v.is_undefined(); }, 0};
    t["undefined"] = {[](const Value& v, Args) { return v.is_undefined(); }, 0};
    t["none"] = {[](const Value& v, Args) { return v.is_none(); }, 0};
    t["boolean"] = {[](const Value& v, Args) { return v.is_bool(); }, 0};
    t["true"] = {[](const Value& v, Args) { return v.is_bool() && v.as_bool(); }, 0};
    t["false"] = {[](const Value& v, Args) { return v.is_bool() && !v.as_bool(); }, 0};
    t["integer"] = {[](const Value& v, Args) { return v.is_int(); }, 0};
    t["float"] = {[](const Value& v, Args) { return v.is_float(); }, 0};
    t["number"] = {[](const Value& v, Args) { return v.is_number(); }, 0};
    t["string"] = {[](const Value& v, Args) { return v.is_string(); }, 0};
    t["mapping"] = {[](const Value& v, Args) { return v.is_dict(); }, 0};
    // jinja2's Undefined iterates as empty and has a length, so it passes both.
    t["iterable"] = {
        [](const Value& v, Args) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); },
        0};
    t["sequence"] = t["iterable"];
    t["callable"] = {[](const Value& v, Args) { return v.is_function() || v.is_undefined(); }, 0};
    t["odd"] = {[](const Value& v, Args) { return !remainder_is_zero(v, Value(2)); }, 0};
    t["even"] = {[](const Value& v, Args) { return remainder_is_zero(v, Value(2)); }, 0};
    t["lower"] = {[](const Value& v, Args) { return all_cased_as(v, false); }, 0};
    t["upper"] = {[](const Value& v, Args) { return all_cased_as(v, true); }, 0};
    t["divisibleby"] = {
        [](const Value& v, Args a) { return remainder_is_zero(v, required(a, 0, "divisibleby")); }, 1};
    t["sameas"] = {[](const Value& v, Args a) { return same_object(v, required(a, 0, "sameas")); }, 1};
    t["in"] = {[](const Value& v, Args a) { return contains(required(a, 0, "in"), v); }, 1};
    Test eq = [](const Value& v, Args a) { return equals(v, required(a, 0, "eq")); };
    Test ne = [](const Value& v, Args a) { return !equals(v, required(a, 0, "ne")); };
    Test lt = [](const Value& v, Args a) { return compare(v, required(a, 0, "lt"), "<") < 0; };
    Test le = [](const Value& v, Args a) { return compare(v, required(a, 0, "le"), "<=") <= 0; };
    Test gt = [](const Value& v, Args a) { return compare(v, required(a, 0, "gt"), ">") > 0; };
    Test ge = [](const Value& v, Args a) { return compare(v, required(a, 0, "ge"), ">=") >= 0; };
    for (auto name : {"eq", "equalto", "=="}) t[name] = {eq, 1};
    for (auto name : {"ne", "!="}) t[name] = {ne, 1};
    for (auto name : {"lt", "lessthan", "<"}) t[name] = {lt, 1};
    for (auto name : {"le", "<="}) t[name] = {le, 1};
    for (auto name : {"gt", "greaterthan", ">"}) t[name] = {gt, 1};
    for (auto name : {"ge", ">="}) t[name] = {ge, 1};
    return t;
  }();
  return table;
}

}  // namespace

bool has_test(std::string_view name) {
  return tests().count(name) > 0;
}

bool apply_test(std::string_view name, const Value& input, CallArguments& args) {
  auto found = tests().find(name);
  if (found == tests().end()) throw ValueError(fmt::format("unknown test '{}'", name));
  std::vector<std::string_view> parameters(found->second.arity, "value");
  if (!args.keyword.empty()) throw ValueError(fmt::format("test '{}' takes no keyword arguments", name));
  return found->second.test(input, bind_arguments(args, name, parameters));
}

}  // namespace qspec::jinja
