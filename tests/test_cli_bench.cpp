// qspec bench on a fixture model: the table and a JSON record with every step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "run_command.h"
#include "tiny_checkpoint.h"

namespace qspec {
namespace {

TEST(CliBench, RecordsEveryStepAsJson) {
  tiny::TempDir out;
  const std::string model = std::string(QSPEC_FIXTURES_DIR) + "/qwen35/causal-tied-bf16";
  testing_support::CommandResult r =
      testing_support::run_command(std::string(QSPEC_BINARY) + " bench --model " + model +
                                   " --prefill 8,33 --repeats 2 --commit abc123 --out " + out.str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("prefill 33"), std::string::npos) << r.out;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(out.path())) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  nlohmann::json record = nlohmann::json::parse(std::ifstream(files[0]));
  EXPECT_EQ(record["commit"], "abc123");
  EXPECT_EQ(record["backend"], "cpu");
  EXPECT_GT(record["weight_bytes"].get<double>(), 1e6);
  ASSERT_EQ(record["steps"].size(), 4u);
  for (const auto& step : record["steps"]) {
    EXPECT_EQ(step["ms"].size(), 2u);
    EXPECT_GT(step["median_ms"].get<double>(), 0.0);
    EXPECT_GT(step["bytes"].get<double>(), record["weight_bytes"].get<double>());
  }
  EXPECT_EQ(record["steps"][1]["tokens"], 16);
}

TEST(CliBench, BadArgumentsFailClearly) {
  const std::string model = std::string(QSPEC_FIXTURES_DIR) + "/qwen35/causal-tied-bf16";
  testing_support::CommandResult r =
      testing_support::run_command(std::string(QSPEC_BINARY) + " bench --model " + model + " --repeats 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_FALSE(r.signaled);
  EXPECT_NE(r.err.find("--repeats"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace qspec
