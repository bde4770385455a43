// An error answered to an HTTP client in OpenAI's shape {"error": {"message", "type", "param", "code"}},
// with the HTTP status the official SDKs map to their exception types (400 BadRequestError, 401
// AuthenticationError, 404 NotFoundError, 413, 429 RateLimitError, 503 InternalServerError).
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace qspec::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {})
      : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)) {}

  int status() const { return status_; }
  // The request field the error is about; empty when none.
  const std::string& param() const { return param_; }
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_;
};

// The OpenAI error body for `status` and `message` (param null when empty).
nlohmann::json error_body(int status, const std::string& message, const std::string& param = {});

// A 400 about request field `param`; the message starts with the field's name.
template <typename... Args>
[[noreturn]] void bad_field(const std::string& param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, param + ": " + fmt::format(format, std::forward<Args>(args)...), param);
}

}  // namespace qspec::server
