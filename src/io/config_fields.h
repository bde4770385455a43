// Typed reads of the fields of a JSON config object (config.json, quantization_config): every error names the
// source file and the full field path, e.g. "config.json: text_config.head_dim: expected a positive integer,
// got \"x\"". A field that is absent or null counts as absent, as in transformers.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace qspec {

// The text of DIR/config.json; `role` says whose it is in the error when it cannot be opened ("the model's").
// A read that fails part-way (or a directory named config.json) leaves text that parse_config_json rejects.
std::string read_config_text(const std::string& dir, std::string_view role);
// JSON text parsed, or an error "SOURCE: invalid JSON: ...".
nlohmann::json parse_config_json(const std::string& text, const std::string& source);

// Views a JSON object, which must outlive it (and every ConfigFields made from it by object()).
class ConfigFields {
 public:
  // `path` is the field path of `object` itself ("" at the top level); throws unless `object` is an object.
  ConfigFields(const nlohmann::json& object, std::string source, std::string path);

  const std::string& source() const { return source_; }
  std::string path_of(std::string_view key) const;  // "text_config.head_dim"

  bool has(std::string_view key) const;
  const nlohmann::json& at(std::string_view key) const;  // throws "missing" when absent
  // The value of a required field; when absent, throws "SOURCE: PATH: missing (expected EXPECTED)".
  const nlohmann::json& require(std::string_view key, std::string_view expected) const;
  ConfigFields object(std::string_view key) const;

  int positive_int(std::string_view key) const;
  std::optional<int> optional_positive_int(std::string_view key) const;
  double positive_number(std::string_view key, double fallback) const;
  bool boolean(std::string_view key, bool fallback) const;
  std::string string(std::string_view key) const;
  std::optional<std::string> optional_string(std::string_view key) const;

  // One error for field `key`: "SOURCE: PATH: expected EXPECTED, got VALUE".
  [[noreturn]] void fail_field(std::string_view key, std::string_view expected) const;

 private:
  const nlohmann::json& object_;
  std::string source_;
  std::string path_;
};

// A JSON value as it appears in the file, shortened for error messages.
std::string json_excerpt(const nlohmann::json& value);

}  // namespace qspec
