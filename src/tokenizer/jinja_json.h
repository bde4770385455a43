// Conversions between JSON documents and template values, and Python's json.dumps (the `tojson` filter).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "tokenizer/jinja_value.h"

namespace qspec::jinja {

// Key order of objects is kept (ordered_json), as Python's json.loads keeps it.
Value from_json(const nlohmann::ordered_json& json);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  // Python's indent: nullopt for one line; otherwise the string repeated per level ("  " for indent=2).
  std::optional<std::string> indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// Python json.dumps(value, ...) byte for byte.
std::string dump_json(const Value& value, const JsonDumpOptions& options);

}  // namespace qspec::jinja
