#include "tokenizer/jinja_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tokenizer/jinja_unicode.h"

namespace qspec::jinja {

namespace {

Value from_json_at(const nlohmann::ordered_json& json, int depth) {
  if (depth > kMaxValueDepth)
    throw ValueError(fmt::format("JSON nested deeper than {} levels", kMaxValueDepth));
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value(None{});
    case nlohmann::ordered_json::value_t::boolean:
      return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto number = json.get<uint64_t>();
      if (number > static_cast<uint64_t>(INT64_MAX))
        throw ValueError(fmt::format("integer {} is too large", number));
      return Value(static_cast<int64_t>(number));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json_at(item, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<Value, Value>> entries;
      entries.reserve(json.size());
      for (const auto& [key, item] : json.items())
        entries.emplace_back(Value(key), from_json_at(item, depth + 1));
      return Value::dict(std::move(entries));
    }
    default:
      throw ValueError(fmt::format("JSON value of type '{}' cannot be used in a template", json.type_name()));
  }
}

void dump_string(std::string& out, std::string_view text, bool ensure_ascii) {
  out += '"';
  for (char32_t c : decode_utf8(text)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c > 0x7f)) {
          if (c >= 0x10000) {
            char32_t offset = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (static_cast<uint32_t>(offset) >> 10),
                               0xdc00 + (static_cast<uint32_t>(offset) & 0x3ff));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
          }
        } else {
          append_utf8(out, c);
        }
    }
  }
  out += '"';
}

std::string dump_float(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return repr_float(value);
}

// json.dumps turns keys of these types into strings; anything else is a TypeError.
std::string key_string(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString:
      return key.as_string();
    case Value::Kind::kInt:
      return std::to_string(key.as_int());
    case Value::Kind::kFloat:
      return dump_float(key.as_float());
    case Value::Kind::kBool:
      return key.as_bool() ? "true" : "false";
    case Value::Kind::kNone:
      return "null";
    default:
      throw ValueError(fmt::format("keys must be str, int, float, bool or None, not {}", key.type_name()));
  }
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpOptions& options) : options_(options) {}

  void write(const Value& value, int level) {
    switch (value.kind()) {
      case Value::Kind::kNone:
        out_ += "null";
        return;
      case Value::Kind::kBool:
        out_ += value.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out_ += std::to_string(value.as_int());
        return;
      case Value::Kind::kFloat:
        out_ += dump_float(value.as_float());
        return;
      case Value::Kind::kString:
        dump_string(out_, value.as_string(), options_.ensure_ascii);
        return;
      case Value::Kind::kList:
        write_list(value.as_list(), level);
        return;
      case Value::Kind::kDict:
        write_dict(value.as_dict(), level);
        return;
      default:
        throw ValueError(fmt::format("Object of type {} is not JSON serializable", value.type_name()));
    }
  }

  std::string take() { return std::move(out_); }

 private:
  void newline(int level) {
    if (!options_.indent) return;
    out_ += '\n';
    for (int i = 0; i < level; ++i) out_ += *options_.indent;
  }

  void write_list(const List& list, int level) {
    if (list.items.empty()) {
      out_ += "[]";
      return;
    }
    out_ += '[';
    for (size_t i = 0; i < list.items.size(); ++i) {
      if (i > 0) out_ += options_.item_separator;
      newline(level + 1);
      write(list.items[i], level + 1);
    }
    newline(level);
    out_ += ']';
  }

  void write_dict(const Dict& dict, int level) {
    if (dict.entries.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<std::pair<std::string, const Value*>> entries;
    for (const auto& [key, value] : dict.entries) entries.emplace_back(key_string(key), &value);
    if (options_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out_ += '{';
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) out_ += options_.item_separator;
      newline(level + 1);
      dump_string(out_, entries[i].first, options_.ensure_ascii);
      out_ += options_.key_separator;
      write(*entries[i].second, level + 1);
    }
    newline(level);
    out_ += '}';
  }

  const JsonDumpOptions& options_;
  std::string out_;
};

}  // namespace

Value from_json(const nlohmann::ordered_json& json) {
  return from_json_at(json, 1);
}

std::string dump_json(const Value& value, const JsonDumpOptions& options) {
  JsonWriter writer(options);
  writer.write(value, 0);
  return writer.take();
}

}  // namespace qspec::jinja
