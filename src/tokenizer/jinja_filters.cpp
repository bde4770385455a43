// jinja2's built-in filters, with HF's tojson (json.dumps with ensure_ascii=False and key order kept).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_json.h"
#include "tokenizer/jinja_operators.h"
#include "tokenizer/jinja_strings.h"
#include "tokenizer/jinja_unicode.h"

namespace qspec::jinja {

namespace {

using Bound = std::vector<std::optional<Value>>;
using Filter = Value (*)(const Value& input, CallArguments& args);

Value value_or(const std::optional<Value>& value, Value fallback) {
  return value ? *value : std::move(fallback);
}

bool flag(const std::optional<Value>& value) {
  return value && value->truthy();
}

// jinja2's attribute getter for map/selectattr/sort: "a.b.0" looks up item by item.
Value lookup_path(const Value& item, const std::string& path) {
  Value current = item;
  for (const std::string& part : python_split(path, std::string("."), -1, false)) {
    bool numeric =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    current = numeric ? get_item(current, Value(static_cast<int64_t>(std::stoll(part))))
                      : get_item(current, Value(part));
  }
  return current;
}

std::string attribute_path(const std::optional<Value>& attribute) {
  if (attribute->is_int()) return std::to_string(attribute->as_int());
  if (!attribute->is_string()) throw ValueError("attribute must be a string");
  return attribute->as_string();
}

// Sort/unique key: strings are compared lower-cased unless case_sensitive.
Value sort_key(const Value& item, const std::optional<Value>& attribute, bool case_sensitive) {
  Value key = attribute && !attribute->is_none() ? lookup_path(item, attribute_path(attribute)) : item;
  if (!case_sensitive && key.is_string()) return Value(to_lower(key.as_string()));
  return key;
}

CallArguments rest_arguments(const CallArguments& args, size_t skip) {
  CallArguments rest;
  if (args.positional.size() > skip)
    rest.positional.assign(args.positional.begin() + static_cast<ptrdiff_t>(skip), args.positional.end());
  rest.keyword = args.keyword;
  return rest;
}

Value filter_default(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "default", {"default_value", "boolean"});
  bool use_default = input.is_undefined() || (flag(b[1]) && !input.truthy());
  return use_default ? value_or(b[0], Value("")) : input;
}

Value filter_tojson(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions options;
  options.ensure_ascii = flag(b[0]);
  if (b[1] && !b[1]->is_none()) {
    if (b[1]->is_string()) {
      options.indent = b[1]->as_string();
    } else {
      options.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, b[1]->to_integer())), ' ');
    }
    options.item_separator = ",";
  }
  if (b[2] && !b[2]->is_none()) {
    std::vector<Value> parts = iterate(*b[2]);
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string()) {
      throw ValueError("tojson separators must be a pair of strings");
    }
    options.item_separator = parts[0].as_string();
    options.key_separator = parts[1].as_string();
  }
  options.sort_keys = flag(b[3]);
  return Value(dump_json(input, options));
}

Value filter_trim(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "trim", {"chars"});
  std::optional<std::string> chars;
  if (b[0] && !b[0]->is_none()) chars = b[0]->str();
  return Value(python_strip(input.str(), chars, StripSide::kBoth));
}

Value filter_length(const Value& input, CallArguments& args) {
  bind_arguments(args, "length", {});
  return Value(static_cast<int64_t>(length(input)));
}

Value filter_string(const Value& input, CallArguments& args) {
  bind_arguments(args, "string", {});
  return Value(input.str());
}

Value filter_items(const Value& input, CallArguments& args) {
  bind_arguments(args, "items", {});
  if (input.is_undefined()) return Value::list({});
  if (!input.is_dict()) throw ValueError("Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [key, value] : input.as_dict().entries) pairs.push_back(Value::tuple({key, value}));
  return Value::list(std::move(pairs));
}

Value filter_list(const Value& input, CallArguments& args) {
  bind_arguments(args, "list", {});
  return Value::list(iterate(input));
}

Value filter_first(const Value& input, CallArguments& args) {
  bind_arguments(args, "first", {});
  std::vector<Value> items = iterate(input);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value filter_last(const Value& input, CallArguments& args) {
  bind_arguments(args, "last", {});
  std::vector<Value> items = iterate(input);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value filter_join(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "join", {"d", "attribute"});
  std::string separator = b[0] ? b[0]->str() : "";
  std::string out;
  bool first = true;
  for (const Value& item : iterate(input)) {
    if (!first) out += separator;
    first = false;
    out += (b[1] && !b[1]->is_none() ? lookup_path(item, attribute_path(b[1])) : item).str();
  }
  return Value(std::move(out));
}

Value filter_lower(const Value& input, CallArguments& args) {
  bind_arguments(args, "lower", {});
  return Value(to_lower(input.str()));
}

Value filter_upper(const Value& input, CallArguments& args) {
  bind_arguments(args, "upper", {});
  return Value(to_upper(input.str()));
}

Value filter_capitalize(const Value& input, CallArguments& args) {
  bind_arguments(args, "capitalize", {});
  return Value(python_capitalize(input.str()));
}

// jinja2's title: every piece after one of `-`, whitespace, `(`, `{`, `[`, `<` starts upper-case.
Value filter_title(const Value& input, CallArguments& args) {
  bind_arguments(args, "title", {});
  std::u32string code_points = decode_utf8(input.str());
  auto is_boundary = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_python_space(c);
  };
  for (size_t i = 0; i < code_points.size(); ++i) {
    bool starts_piece = i == 0 || is_boundary(code_points[i]) != is_boundary(code_points[i - 1]);
    code_points[i] = starts_piece ? to_upper(code_points[i]) : to_lower(code_points[i]);
  }
  return Value(encode_utf8(code_points));
}

Value filter_replace(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "replace", {"old", "new", "count"});
  if (!b[0] || !b[1]) throw ValueError("replace needs the old and the new string");
  int64_t count = b[2] && !b[2]->is_none() ? b[2]->to_integer() : -1;
  return Value(python_replace(input.str(), b[0]->str(), b[1]->str(), count));
}

Value filter_safe(const Value& input, CallArguments& args) {
  bind_arguments(args, "safe", {});
  return Value(input.str());
}

// Python int(text, base) for the int filter; nullopt where Python raises ValueError.
std::optional<int64_t> parse_python_int(const std::string& text, int64_t base) {
  std::string digits = python_strip(text, std::nullopt, StripSide::kBoth);
  bool negative = false;
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) {
    negative = digits[0] == '-';
    digits.erase(0, 1);
  }
  if (digits.size() > 2 && digits[0] == '0') {
    char prefix = static_cast<char>(digits[1] | 0x20);
    int64_t prefixed = prefix == 'x' ? 16 : (prefix == 'o' ? 8 : (prefix == 'b' ? 2 : 0));
    if (prefixed != 0 && (base == 0 || base == prefixed)) {
      base = prefixed;
      digits.erase(0, 2);
    }
  }
  if (base == 0) base = 10;
  digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
  if (digits.empty()) return std::nullopt;
  int64_t result = 0;
  auto [end, ec] =
      std::from_chars(digits.data(), digits.data() + digits.size(), result, static_cast<int>(base));
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return negative ? -result : result;
}

std::optional<double> parse_python_float(const std::string& text) {
  std::string trimmed = python_strip(text, std::nullopt, StripSide::kBoth);
  trimmed.erase(std::remove(trimmed.begin(), trimmed.end(), '_'), trimmed.end());
  if (trimmed.empty()) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(trimmed.c_str(), &end);
  if (end != trimmed.c_str() + trimmed.size()) return std::nullopt;
  return value;
}

std::optional<double> as_float(const Value& input) {
  if (input.is_number()) return input.to_double();
  if (input.is_string()) return parse_python_float(input.as_string());
  return std::nullopt;
}

Value filter_int(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "int", {"default", "base"});
  input.require_defined();
  if (input.is_string()) {
    if (auto parsed = parse_python_int(input.as_string(), b[1] ? b[1]->to_integer() : 10))
      return Value(*parsed);
  } else if (input.is_int() || input.is_bool()) {
    return Value(input.to_integer());
  }
  if (auto number = as_float(input)) {
    if (!std::isfinite(*number)) throw ValueError("cannot convert float infinity or NaN to integer");
    if (std::fabs(*number) >= 9.2e18)
      throw ValueError("integer overflow (values beyond 64 bits are not supported)");
    return Value(static_cast<int64_t>(std::trunc(*number)));
  }
  return value_or(b[0], Value(0));
}

Value filter_float(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "float", {"default"});
  input.require_defined();
  if (auto number = as_float(input)) return Value(*number);
  return value_or(b[0], Value(0.0));
}

Value filter_abs(const Value& input, CallArguments& args) {
  bind_arguments(args, "abs", {});
  if (input.is_float()) return Value(std::fabs(input.as_float()));
  int64_t value = input.to_integer();
  if (value == INT64_MIN) throw ValueError("integer overflow (values beyond 64 bits are not supported)");
  return Value(value < 0 ? -value : value);
}

// Python's round(x, n): the correctly rounded decimal (ties to even on the exact binary value).
double python_round(double value, int64_t digits) {
  if (!std::isfinite(value)) return value;
  if (digits >= 0) {
    std::string text = fmt::format("{:.{}f}", value, std::min<int64_t>(digits, 300));
    return std::strtod(text.c_str(), nullptr);
  }
  double scale = std::pow(10.0, static_cast<double>(-digits));
  return std::nearbyint(value / scale) * scale;
}

Value filter_round(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "round", {"precision", "method"});
  int64_t precision = b[0] ? b[0]->to_integer() : 0;
  std::string method = b[1] ? b[1]->str() : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    throw ValueError("method must be common, ceil or floor");
  }
  if (method == "common") {
    if (input.is_int() || input.is_bool()) {
      if (precision >= 0) return Value(input.to_integer());
      return Value(static_cast<int64_t>(python_round(input.to_double(), precision)));
    }
    return Value(python_round(input.to_double(), precision));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double scaled = input.to_double() * scale;
  return Value((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

Value filter_map(const Value& input, CallArguments& args) {
  std::optional<Value> attribute;
  std::optional<Value> fallback;
  for (const auto& [name, value] : args.keyword) {
    if (name == "attribute") {
      attribute = value;
    } else if (name == "default") {
      fallback = value;
    } else if (!args.positional.empty()) {
      continue;  // keyword arguments of the mapped filter
    } else {
      throw ValueError(fmt::format("map() got an unexpected keyword argument '{}'", name));
    }
  }
  std::vector<Value> out;
  if (attribute) {
    std::string path = attribute_path(attribute);
    for (const Value& item : iterate(input)) {
      Value mapped = lookup_path(item, path);
      out.push_back(mapped.is_undefined() && fallback ? *fallback : mapped);
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string())
    throw ValueError("map() needs a filter name or attribute=");
  std::string filter = args.positional[0].as_string();
  if (!has_filter(filter)) throw ValueError(fmt::format("No filter named '{}'.", filter));
  for (const Value& item : iterate(input)) {
    CallArguments rest = rest_arguments(args, 1);
    out.push_back(apply_filter(filter, item, rest));
  }
  return Value::list(std::move(out));
}

// select/reject/selectattr/rejectattr: keep items whose (attribute's) test result equals `keep`.
Value select_items(const Value& input, CallArguments& args, bool by_attribute, bool keep) {
  size_t next = 0;
  std::string path;
  if (by_attribute) {
    if (args.positional.empty()) throw ValueError("selectattr/rejectattr need an attribute name");
    path = attribute_path(args.positional[0]);
    next = 1;
  }
  std::optional<std::string> test;
  if (args.positional.size() > next) {
    if (!args.positional[next].is_string()) throw ValueError("the test name must be a string");
    test = args.positional[next].as_string();
    if (!has_test(*test)) throw ValueError(fmt::format("No test named '{}'.", *test));
  }
  std::vector<Value> out;
  for (const Value& item : iterate(input)) {
    Value subject = by_attribute ? lookup_path(item, path) : item;
    bool passed = subject.truthy();
    if (test) {
      CallArguments rest = rest_arguments(args, next + 1);
      passed = apply_test(*test, subject, rest);
    }
    if (passed == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_select(const Value& input, CallArguments& args) {
  return select_items(input, args, false, true);
}
Value filter_reject(const Value& input, CallArguments& args) {
  return select_items(input, args, false, false);
}
Value filter_selectattr(const Value& input, CallArguments& args) {
  return select_items(input, args, true, true);
}
Value filter_rejectattr(const Value& input, CallArguments& args) {
  return select_items(input, args, true, false);
}

Value filter_unique(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "unique", {"case_sensitive", "attribute"});
  std::vector<Value> seen;
  std::vector<Value> out;
  for (const Value& item : iterate(input)) {
    Value key = sort_key(item, b[1], flag(b[0]));
    require_hashable(key);  // jinja2 collects the keys in a set
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value filter_sort(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "sort", {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = iterate(input);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) keyed.emplace_back(sort_key(item, b[2], flag(b[1])), item);
  bool reverse = flag(b[0]);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first, "<") < 0 : compare(x.first, y.first, "<") < 0;
  });
  std::vector<Value> out;
  for (auto& entry : keyed) out.push_back(std::move(entry.second));
  return Value::list(std::move(out));
}

Value filter_dictsort(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "dictsort", {"case_sensitive", "by", "reverse"});
  if (!input.is_dict()) throw ValueError("dictsort needs a mapping");
  bool by_value = b[1] && b[1]->str() == "value";
  auto entries = input.as_dict().entries;
  bool case_sensitive = flag(b[0]);
  bool reverse = flag(b[2]);
  auto key = [&](const std::pair<Value, Value>& entry) {
    return sort_key(by_value ? entry.second : entry.first, std::nullopt, case_sensitive);
  };
  std::stable_sort(entries.begin(), entries.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(key(y), key(x), "<") < 0 : compare(key(x), key(y), "<") < 0;
  });
  std::vector<Value> out;
  for (auto& [k, v] : entries) out.push_back(Value::tuple({k, v}));
  return Value::list(std::move(out));
}

Value extreme(const Value& input, CallArguments& args, bool want_max) {
  Bound b = bind_arguments(args, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  std::optional<std::pair<Value, Value>> best;
  for (const Value& item : iterate(input)) {
    Value key = sort_key(item, b[1], flag(b[0]));
    if (!best || (want_max ? compare(key, best->first, ">") > 0 : compare(key, best->first, "<") < 0)) {
      best = std::make_pair(key, item);
    }
  }
  if (!best) return Value::undefined("No aggregated item, sequence was empty.");
  return best->second;
}

Value filter_max(const Value& input, CallArguments& args) {
  return extreme(input, args, true);
}
Value filter_min(const Value& input, CallArguments& args) {
  return extreme(input, args, false);
}

Value filter_sum(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "sum", {"attribute", "start"});
  Value total = value_or(b[1], Value(0));
  for (const Value& item : iterate(input)) {
    total = binary_operation(BinaryOp::kAdd, total,
                             b[0] && !b[0]->is_none() ? lookup_path(item, attribute_path(b[0])) : item);
  }
  return total;
}

Value filter_reverse(const Value& input, CallArguments& args) {
  bind_arguments(args, "reverse", {});
  if (input.is_string()) {
    std::u32string code_points = decode_utf8(input.as_string());
    std::reverse(code_points.begin(), code_points.end());
    return Value(encode_utf8(code_points));
  }
  std::vector<Value> items = iterate(input);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value filter_indent(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "indent", {"width", "first", "blank"});
  if (!input.require_defined().is_string())
    throw ValueError(fmt::format("indent expects a string, not {}", input.type_name()));
  std::string indentation = "    ";
  if (b[0])
    indentation = b[0]->is_string()
                      ? b[0]->as_string()
                      : std::string(static_cast<size_t>(std::max<int64_t>(0, b[0]->to_integer())), ' ');
  std::vector<std::string> lines = python_splitlines(input.as_string() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    bool indent_line = i > 0 && (flag(b[2]) || !lines[i].empty());
    out += (indent_line ? indentation : "") + lines[i];
  }
  if (flag(b[1])) out = indentation + out;
  return Value(std::move(out));
}

Value filter_center(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "center", {"width"});
  std::string text = input.str();
  auto size = static_cast<int64_t>(decode_utf8(text).size());
  int64_t width = b[0] ? b[0]->to_integer() : 80;
  if (width <= size) return Value(text);
  int64_t padding = width - size;
  int64_t left = padding / 2 + (padding & width & 1);
  return Value(std::string(static_cast<size_t>(left), ' ') + text +
               std::string(static_cast<size_t>(padding - left), ' '));
}

Value filter_wordcount(const Value& input, CallArguments& args) {
  bind_arguments(args, "wordcount", {});
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : decode_utf8(input.str())) {
    bool word_char = is_alphanumeric(c) || c == '_';
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value(words);
}

Value filter_attr(const Value& input, CallArguments& args) {
  Bound b = bind_arguments(args, "attr", {"name"});
  if (!b[0] || !b[0]->is_string()) throw ValueError("attr needs an attribute name");
  return get_attribute(input, b[0]->as_string());
}

const std::map<std::string_view, Filter>& filters() {
  static const std::map<std::string_view, Filter> table = {
      {"abs", filter_abs},
      {"attr", filter_attr},
      {"capitalize", filter_capitalize},
      {"center", filter_center},
      {"count", filter_length},
      {"d", filter_default},
      {"default", filter_default},
      {"dictsort", filter_dictsort},
      {"first", filter_first},
      {"float", filter_float},
      {"indent", filter_indent},
      {"int", filter_int},
      {"items", filter_items},
      {"join", filter_join},
      {"last", filter_last},
      {"length", filter_length},
      {"list", filter_list},
      {"lower", filter_lower},
      {"map", filter_map},
      {"max", filter_max},
      {"min", filter_min},
      {"reject", filter_reject},
      {"rejectattr", filter_rejectattr},
      {"replace", filter_replace},
      {"reverse", filter_reverse},
      {"round", filter_round},
      {"safe", filter_safe},
      {"select", filter_select},
      {"selectattr", filter_selectattr},
      {"sort", filter_sort},
      {"string", filter_string},
      {"sum", filter_sum},
      {"title", filter_title},
      {"tojson", filter_tojson},
      {"trim", filter_trim},
      {"unique", filter_unique},
      {"upper", filter_upper},
      {"wordcount", filter_wordcount},
  };
  return table;
}

}  // namespace

bool has_filter(std::string_view name) {
  return filters().count(name) > 0;
}

Value apply_filter(std::string_view name, const Value& input, CallArguments& args) {
  auto found = filters().find(name);
  if (found == filters().end()) throw ValueError(fmt::format("unknown filter '{}'", name));
  return found->second(input, args);
}

}  // namespace qspec::jinja
