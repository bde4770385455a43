// The one exception type of qspec: a message that names the file, field or parameter and what was expected.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace qspec {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace qspec
