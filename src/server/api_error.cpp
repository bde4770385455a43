#include "server/api_error.h"

namespace qspec::server {

namespace {

// OpenAI's error types; the SDKs pick the exception from the status, clients log the type.
const char* error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    default:
      return status >= 500 ? "internal_server_error" : "invalid_request_error";
  }
}

}  // namespace

nlohmann::json ApiError::body() const {
  return error_body(status_, what(), param_);
}

nlohmann::json error_body(int status, const std::string& message, const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", error_type(status)},
            {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
            {"code", status}}}};
}

}  // namespace qspec::server
