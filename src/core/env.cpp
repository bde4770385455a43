#include "core/env.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <string_view>

#include <fmt/ranges.h>

#include "core/error.h"

namespace qspec {

namespace {

// The variable's value; nullopt when unset or empty.
std::optional<std::string_view> env_text(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string_view(value);
}

// Parses the whole of `text` as T (std::from_chars: no sign prefix '+', no spaces).
template <typename T>
std::optional<T> parse_whole(std::string_view text) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

template <typename T>
std::optional<T> env_value(const char* name, T lowest, T highest, const char* kind) {
  const std::optional<std::string_view> text = env_text(name);
  if (!text) return std::nullopt;
  const std::optional<T> value = parse_whole<T>(*text);
  if (!value || !(*value >= lowest && *value <= highest))
    fail("environment variable {}: expected {} in [{}, {}], got '{}'", name, kind, lowest, highest, *text);
  return value;
}

}  // namespace

std::optional<int64_t> env_integer(const char* name, int64_t lowest, int64_t highest) {
  return env_value<int64_t>(name, lowest, highest, "an integer");
}

std::optional<double> env_number(const char* name, double lowest, double highest) {
  return env_value<double>(name, lowest, highest, "a number");
}

std::optional<std::string> env_choice(const char* name, std::initializer_list<std::string_view> choices) {
  const std::optional<std::string_view> text = env_text(name);
  if (!text) return std::nullopt;
  if (std::find(choices.begin(), choices.end(), *text) == choices.end())
    fail("environment variable {}: expected one of {}, got '{}'", name, fmt::join(choices, ", "), *text);
  return std::string(*text);
}

}  // namespace qspec
