#include "io/config_fields.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace qspec {

namespace {

constexpr size_t kExcerptLength = 60;

}  // namespace

std::string json_excerpt(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kExcerptLength) text = text.substr(0, kExcerptLength) + "...";
  return text;
}

std::string read_config_text(const std::string& dir, std::string_view role) {
  const std::string path = dir + "/config.json";
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("cannot open {}: expected {} config.json there", path, role);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

nlohmann::json parse_config_json(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: invalid JSON: {}", source, e.what());
  }
}

ConfigFields::ConfigFields(const nlohmann::json& object, std::string source, std::string path)
    : object_(object), source_(std::move(source)), path_(std::move(path)) {
  if (!object_.is_object()) {
    if (path_.empty())
      fail("{}: expected a JSON object at the top level, got {}", source_, json_excerpt(object_));
    fail("{}: {}: expected an object, got {}", source_, path_, json_excerpt(object_));
  }
}

std::string ConfigFields::path_of(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

bool ConfigFields::has(std::string_view key) const {
  auto it = object_.find(key);
  return it != object_.end() && !it->is_null();
}

const nlohmann::json& ConfigFields::at(std::string_view key) const {
  auto it = object_.find(key);
  if (it == object_.end()) fail("{}: {}: missing", source_, path_of(key));
  return *it;
}

ConfigFields ConfigFields::object(std::string_view key) const {
  return ConfigFields(require(key, "an object"), source_, path_of(key));
}

const nlohmann::json& ConfigFields::require(std::string_view key, std::string_view expected) const {
  auto it = object_.find(key);
  if (it == object_.end()) fail_field(key, expected);
  return *it;
}

int ConfigFields::positive_int(std::string_view key) const {
  const nlohmann::json& value = require(key, "a positive integer");
  if (!value.is_number_integer() || value.get<int64_t>() <= 0 ||
      value.get<int64_t>() > std::numeric_limits<int>::max())
    fail_field(key, "a positive integer");
  return value.get<int>();
}

std::optional<int> ConfigFields::optional_positive_int(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return positive_int(key);
}

double ConfigFields::positive_number(std::string_view key, double fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& value = at(key);
  if (!value.is_number() || !(value.get<double>() > 0)) fail_field(key, "a positive number");
  return value.get<double>();
}

bool ConfigFields::boolean(std::string_view key, bool fallback) const {
  if (!has(key)) return fallback;
  const nlohmann::json& value = at(key);
  if (!value.is_boolean()) fail_field(key, "true or false");
  return value.get<bool>();
}

std::string ConfigFields::string(std::string_view key) const {
  const nlohmann::json& value = require(key, "a string");
  if (!value.is_string()) fail_field(key, "a string");
  return value.get<std::string>();
}

std::optional<std::string> ConfigFields::optional_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return string(key);
}

void ConfigFields::fail_field(std::string_view key, std::string_view expected) const {
  auto it = object_.find(key);
  if (it == object_.end()) fail("{}: {}: missing (expected {})", source_, path_of(key), expected);
  fail("{}: {}: expected {}, got {}", source_, path_of(key), expected, json_excerpt(*it));
}

}  // namespace qspec
