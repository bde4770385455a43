// Helpers of the speculative-decoding tests: the fixture models, and reading backend tensors to the host.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/ops.h"

namespace qspec::speculative_testing {

// The Qwen3.5 fixture checkpoints of tools/oracle/make_qwen35_fixtures.py, sorted.
inline std::vector<std::filesystem::path> target_fixture_dirs() {
  std::vector<std::filesystem::path> dirs;
  const std::filesystem::path root = std::filesystem::path(QSPEC_FIXTURES_DIR) / "qwen35";
  if (std::filesystem::exists(root))
    for (const auto& entry : std::filesystem::directory_iterator(root))
      if (std::filesystem::exists(entry.path() / "config.json")) dirs.push_back(entry.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// A gtest parameter name from a fixture directory ("causal-tied-bf16" -> "causal_tied_bf16").
inline std::string fixture_test_name(const std::filesystem::path& dir) {
  std::string name = dir.filename().string();
  std::replace_if(
      name.begin(), name.end(), [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }, '_');
  return name;
}

// A contiguous F32 tensor's values.
inline std::vector<float> read_floats(Backend& backend, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  backend.read(out.data(), t);
  return out;
}

}  // namespace qspec::speculative_testing
