// Attribute and item access as jinja2's ImmutableSandboxedEnvironment does it, including the Python methods
// of str, dict and list that templates call (mutating methods are refused like the sandbox refuses them).
#include <fmt/format.h>

#include <algorithm>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_strings.h"
#include "tokenizer/jinja_unicode.h"

namespace qspec::jinja {

namespace {

using Parameters = std::vector<std::string_view>;

std::string object_type_repr(const Value& object) {
  if (object.is_none()) return "None";
  return object.type_name() + " object";
}

Value missing_attribute(const Value& object, std::string_view name) {
  if (object.is_none()) return Value::undefined(fmt::format("'None' has no attribute '{}'", name));
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", object_type_repr(object), name));
}

Value missing_element(const Value& object, const Value& key) {
  return Value::undefined(fmt::format("'{}' has no element {}", object_type_repr(object), key.repr()));
}

const std::string& string_argument(const std::optional<Value>& value, std::string_view method,
                                   std::string_view parameter) {
  if (!value || !value->is_string()) {
    throw ValueError(fmt::format("{}() argument '{}' must be str, not {}", method, parameter,
                                 value ? value->type_name() : "nothing"));
  }
  return value->as_string();
}

std::optional<std::string> optional_string(const std::optional<Value>& value, std::string_view method) {
  if (!value || value->is_none()) return std::nullopt;
  if (!value->is_string())
    throw ValueError(fmt::format("{}() argument must be str or None, not {}", method, value->type_name()));
  return value->as_string();
}

int64_t optional_integer(const std::optional<Value>& value, int64_t fallback) {
  if (!value) return fallback;
  return value->to_integer();
}

bool affix_matches(const std::string& text, const Value& affix, bool at_start, std::string_view method) {
  auto matches = [&](const Value& candidate) {
    if (!candidate.is_string()) {
      throw ValueError(
          fmt::format("{} first arg must be str or a tuple of str, not {}", method, candidate.type_name()));
    }
    const std::string& piece = candidate.as_string();
    if (piece.size() > text.size()) return false;
    return at_start ? text.compare(0, piece.size(), piece) == 0
                    : text.compare(text.size() - piece.size(), piece.size(), piece) == 0;
  };
  if (affix.is_list() && affix.as_list().is_tuple) {
    const auto& items = affix.as_list().items;
    return std::any_of(items.begin(), items.end(), matches);
  }
  return matches(affix);
}

Value string_list(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (std::string& part : parts) items.emplace_back(std::move(part));
  return Value::list(std::move(items));
}

template <typename Predicate>
bool all_code_points(const std::string& text, Predicate predicate) {
  std::u32string code_points = decode_utf8(text);
  return !code_points.empty() && std::all_of(code_points.begin(), code_points.end(), predicate);
}

bool has_cased_and_all(const std::string& text, bool upper) {
  bool any_cased = false;
  for (char32_t c : decode_utf8(text)) {
    if (upper ? is_lowercase(c) : is_uppercase(c)) return false;
    if (is_cased_letter(c)) any_cased = true;
  }
  return any_cased;
}

std::string join_strings(const std::string& separator, const Value& iterable) {
  std::string out;
  size_t index = 0;
  for (const Value& item : iterate(iterable)) {
    if (!item.is_string()) {
      throw ValueError(
          fmt::format("sequence item {}: expected str instance, {} found", index, item.type_name()));
    }
    if (index++ > 0) out += separator;
    out += item.as_string();
  }
  return out;
}

// str.format with `{}`, `{0}`, `{name}`, `!r`/`!s` and `{{`/`}}`; format specs are not supported.
std::string format_string(const std::string& pattern, const CallArguments& args) {
  std::string out;
  size_t next_auto = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '}') {
      if (i + 1 < pattern.size() && pattern[i + 1] == '}') ++i;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = pattern.find('}', i);
    if (close == std::string::npos) throw ValueError("Single '{' encountered in format string");
    std::string field = pattern.substr(i + 1, close - i - 1);
    i = close;
    bool use_repr = false;
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      use_repr = field.substr(bang + 1) == "r";
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos)
      throw ValueError("format specs in str.format() are not supported");
    const Value* value = nullptr;
    if (field.empty() ||
        std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      size_t index = field.empty() ? next_auto++ : std::stoul(field);
      if (index >= args.positional.size())
        throw ValueError(fmt::format("Replacement index {} out of range", index));
      value = &args.positional[index];
    } else {
      for (const auto& [name, keyword_value] : args.keyword) {
        if (name == field) value = &keyword_value;
      }
      if (value == nullptr) throw ValueError(fmt::format("KeyError: '{}'", field));
    }
    out += use_repr ? value->repr() : value->str();
  }
  return out;
}

Value string_method(const std::string& text, std::string_view name, CallArguments& args) {
  auto bind = [&](const Parameters& parameters) { return bind_arguments(args, name, parameters); };
  if (name == "startswith" || name == "endswith") {
    auto bound = bind({"prefix"});
    if (!bound[0]) throw ValueError(fmt::format("{}() takes at least 1 argument (0 given)", name));
    return Value(affix_matches(text, *bound[0], name == "startswith", name));
  }
  if (name == "split" || name == "rsplit") {
    auto bound = bind({"sep", "maxsplit"});
    return string_list(python_split(text, optional_string(bound[0], name), optional_integer(bound[1], -1),
                                    name == "rsplit"));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto bound = bind({"chars"});
    StripSide side =
        name == "strip" ? StripSide::kBoth : (name == "lstrip" ? StripSide::kLeft : StripSide::kRight);
    return Value(python_strip(text, optional_string(bound[0], name), side));
  }
  if (name == "splitlines") {
    auto bound = bind({"keepends"});
    return string_list(python_splitlines(text, bound[0] && bound[0]->truthy()));
  }
  if (name == "replace") {
    auto bound = bind({"old", "new", "count"});
    return Value(python_replace(text, string_argument(bound[0], name, "old"),
                                string_argument(bound[1], name, "new"), optional_integer(bound[2], -1)));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index" || name == "rindex") {
    auto bound = bind({"sub"});
    const std::string& needle = string_argument(bound[0], name, "sub");
    if (name == "count") return Value(python_count(text, needle));
    int64_t found = python_find(text, needle, name[0] == 'r');
    if (found < 0 && name.find("index") != std::string_view::npos) throw ValueError("substring not found");
    return Value(found);
  }
  if (name == "join") {
    auto bound = bind({"iterable"});
    if (!bound[0]) throw ValueError("join() takes exactly one argument (0 given)");
    return Value(join_strings(text, *bound[0]));
  }
  if (name == "format") return Value(format_string(text, args));
  bind({});
  if (name == "upper") return Value(to_upper(text));
  if (name == "lower" || name == "casefold") return Value(to_lower(text));
  if (name == "title") return Value(python_title(text));
  if (name == "capitalize") return Value(python_capitalize(text));
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") {
    return Value(all_code_points(text, is_decimal_digit));
  }
  if (name == "isalpha") return Value(all_code_points(text, is_alphabetic));
  if (name == "isalnum") return Value(all_code_points(text, is_alphanumeric));
  if (name == "isspace") return Value(all_code_points(text, is_python_space));
  if (name == "isupper") return Value(has_cased_and_all(text, true));
  if (name == "islower") return Value(has_cased_and_all(text, false));
  throw ValueError(fmt::format("'str' object has no method '{}'", name));
}

constexpr std::string_view kStringMethods[] = {
    "startswith", "endswith", "split",    "rsplit",  "strip",      "lstrip",  "rstrip",    "splitlines",
    "replace",    "find",     "rfind",    "count",   "index",      "rindex",  "join",      "format",
    "upper",      "lower",    "casefold", "title",   "capitalize", "isdigit", "isdecimal", "isnumeric",
    "isalpha",    "isalnum",  "isspace",  "isupper", "islower"};
constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get"};
constexpr std::string_view kUnsafeDictMethods[] = {"pop", "popitem", "setdefault", "update", "clear"};
constexpr std::string_view kListMethods[] = {"count", "index"};
constexpr std::string_view kUnsafeListMethods[] = {"append", "extend",  "insert", "pop",
                                                   "remove", "reverse", "sort",   "clear"};

template <size_t N>
bool listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

Value dict_method(const Dict& dict, std::string_view name, CallArguments& args) {
  if (name == "get") {
    auto bound = bind_arguments(args, name, {"key", "default"});
    if (!bound[0]) throw ValueError("get expected at least 1 argument, got 0");
    require_hashable(*bound[0]);
    const Value* found = dict.find(*bound[0]);
    if (found != nullptr) return *found;
    return bound[1] ? *bound[1] : Value(None{});
  }
  bind_arguments(args, name, {});
  std::vector<Value> items;
  for (const auto& [key, value] : dict.entries) {
    if (name == "items") {
      items.push_back(Value::tuple({key, value}));
    } else {
      items.push_back(name == "keys" ? key : value);
    }
  }
  return Value::list(std::move(items));
}

Value list_method(const List& list, std::string_view name, CallArguments& args) {
  auto bound = bind_arguments(args, name, {"value"});
  if (!bound[0]) throw ValueError(fmt::format("{}() takes exactly one argument (0 given)", name));
  auto matches = [&](const Value& item) { return equals(item, *bound[0]); };
  if (name == "count")
    return Value(static_cast<int64_t>(std::count_if(list.items.begin(), list.items.end(), matches)));
  auto found = std::find_if(list.items.begin(), list.items.end(), matches);
  if (found == list.items.end()) throw ValueError(fmt::format("{} is not in list", bound[0]->repr()));
  return Value(static_cast<int64_t>(found - list.items.begin()));
}

Value unsafe(const Value& object, std::string_view name) {
  return Value::undefined(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, object.type_name()));
}

// Python slice index normalisation (PySlice_AdjustIndices).
std::vector<size_t> slice_indices(size_t size, const Value& start_value, const Value& stop_value,
                                  const Value& step_value) {
  auto integer_or_none = [](const Value& value) -> std::optional<int64_t> {
    if (value.is_none() || value.is_undefined()) return std::nullopt;
    if (!value.is_int() && !value.is_bool()) throw ValueError("slice indices must be integers or None");
    return value.to_integer();
  };
  int64_t length = static_cast<int64_t>(size);
  int64_t step = integer_or_none(step_value).value_or(1);
  if (step == 0) throw ValueError("slice step cannot be zero");
  int64_t lower = step > 0 ? 0 : -1;
  int64_t upper = step > 0 ? length : length - 1;
  auto adjust = [&](std::optional<int64_t> bound, int64_t fallback) {
    if (!bound) return fallback;
    if (*bound < 0) return std::max(*bound + length, lower);
    return std::min(*bound, upper);
  };
  int64_t start = adjust(integer_or_none(start_value), step > 0 ? lower : upper);
  int64_t stop = adjust(integer_or_none(stop_value), step > 0 ? upper : lower);
  std::vector<size_t> indices;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    indices.push_back(static_cast<size_t>(i));
  return indices;
}

}  // namespace

Value get_attribute(const Value& object, std::string_view name) {
  object.require_defined();
  auto bound_method = [&](auto call) {
    return make_function(std::string(name), [object, method = std::string(name), call](CallArguments& args) {
      return call(object, method, args);
    });
  };
  switch (object.kind()) {
    case Value::Kind::kString:
      if (listed(kStringMethods, name)) {
        return bound_method([](const Value& self, const std::string& method, CallArguments& args) {
          return string_method(self.as_string(), method, args);
        });
      }
      break;
    case Value::Kind::kDict:
      if (listed(kDictMethods, name)) {
        return bound_method([](const Value& self, const std::string& method, CallArguments& args) {
          return dict_method(self.as_dict(), method, args);
        });
      }
      if (listed(kUnsafeDictMethods, name)) return unsafe(object, name);
      if (const Value* found = object.as_dict().find(Value(name))) return *found;
      break;
    case Value::Kind::kList:
      if (listed(kListMethods, name)) {
        return bound_method([](const Value& self, const std::string& method, CallArguments& args) {
          return list_method(self.as_list(), method, args);
        });
      }
      if (listed(kUnsafeListMethods, name)) return unsafe(object, name);
      break;
    case Value::Kind::kNamespace:
      if (const Value* found = object.as_namespace().find(name)) return *found;
      break;
    default:
      break;
  }
  return missing_attribute(object, name);
}

Value get_item(const Value& object, const Value& key) {
  object.require_defined();
  if (object.is_dict()) {
    if (const Value* found = object.as_dict().find(key)) return *found;
  } else if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    std::u32string code_points = object.is_string() ? decode_utf8(object.as_string()) : std::u32string();
    auto size = static_cast<int64_t>(object.is_string() ? code_points.size() : object.as_list().items.size());
    int64_t index = key.to_integer();
    if (index < 0) index += size;
    if (index < 0 || index >= size) return missing_element(object, key);
    if (object.is_list()) return object.as_list().items[static_cast<size_t>(index)];
    return Value(encode_utf8(std::u32string(1, code_points[static_cast<size_t>(index)])));
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return missing_element(object, key);
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  object.require_defined();
  if (object.is_string()) {
    std::u32string code_points = decode_utf8(object.as_string());
    std::u32string out;
    for (size_t i : slice_indices(code_points.size(), start, stop, step)) out += code_points[i];
    return Value(encode_utf8(out));
  }
  if (object.is_list()) {
    const List& list = object.as_list();
    std::vector<Value> items;
    for (size_t i : slice_indices(list.items.size(), start, stop, step)) items.push_back(list.items[i]);
    return list.is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  return Value::undefined(fmt::format("'{}' cannot be sliced", object_type_repr(object)));
}

}  // namespace qspec::jinja
