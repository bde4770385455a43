// Runs the CUDA tests, then writes every recorded comparison as JSON to $QSPEC_CUDA_CHECKS_JSON (when set).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "op_check.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int status = RUN_ALL_TESTS();
  if (const char* path = std::getenv("QSPEC_CUDA_CHECKS_JSON")) {
    nlohmann::json checks = nlohmann::json::array();
    for (const auto& check : qspec::cuda_test::recorded_checks())
      checks.push_back(
          {{"op", check.op},
           {"case", check.name},
           {"error", std::isfinite(check.error) ? nlohmann::json(check.error) : nlohmann::json("inf")},
           {"tolerance", check.tolerance},
           {"passed", check.passed()}});
    std::ofstream out(path);
    out << nlohmann::json{{"gtest_status", status}, {"checks", checks}}.dump(1) << "\n";
    if (!out) {
      std::cerr << "could not write " << path << "\n";
      return 1;
    }
  }
  return status;
}
