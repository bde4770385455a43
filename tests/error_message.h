// The message of the qspec::Error that a test expects an action to throw.
#pragma once

#include <functional>
#include <string>

#include "core/error.h"

namespace qspec::testing_support {

// What `action` throws as qspec::Error; `if_none` when it returns normally (each test file states its own).
inline std::string error_message(const std::function<void()>& action, const std::string& if_none) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return if_none;
}

}  // namespace qspec::testing_support
