// The oracle fixtures of tools/oracle (tests/fixtures/KIND/NAME/), shared by the CPU test files.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace qspec::fixture_files {

// The directories under tests/fixtures/KIND that hold `marker`, sorted.
inline std::vector<std::filesystem::path> fixture_dirs(const std::string& kind, const std::string& marker) {
  std::vector<std::filesystem::path> dirs;
  const std::filesystem::path root = std::filesystem::path(QSPEC_FIXTURES_DIR) / kind;
  if (std::filesystem::exists(root))
    for (const auto& entry : std::filesystem::directory_iterator(root))
      if (std::filesystem::exists(entry.path() / marker)) dirs.push_back(entry.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// The elements of a stored tensor as T (a test failure when the bytes do not fit T).
template <typename T>
std::vector<T> stored_values(const TensorStore& store, const std::string& name) {
  const TensorView& v = store.get(name);
  std::vector<T> out(size_t(v.numel()));
  if (v.nbytes != out.size() * sizeof(T)) ADD_FAILURE() << name << ": unexpected dtype";
  std::memcpy(out.data(), v.data, std::min(v.nbytes, out.size() * sizeof(T)));
  return out;
}

}  // namespace qspec::fixture_files
