// Runs the qspec binary: `qspec inspect --model DIR [--json]` on good, broken and fixture checkpoints.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "run_command.h"
#include "tiny_checkpoint.h"

namespace qspec {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_support::CommandResult;
using testing_support::run_command;
using tiny::TempDir;

CommandResult run_inspect(const std::string& model_dir, const std::string& flags) {
  return run_command(fmt::format("'{}' inspect --model '{}' {}", QSPEC_BINARY, model_dir, flags));
}

json parse_or_null(const std::string& text) {
  return json::parse(text, nullptr, false);
}

json tiny_quantized_config() {
  json config = tiny::tiny_wrapper_config(true);
  config["quantization_config"] = tiny::w4a16_quantization_config(32);
  return config;
}

// A W4A16 checkpoint with an MTP tensor, as a published one has; `break_it` mutates its tensors.
void write_tiny(const TempDir& dir, const std::function<void(std::vector<TensorData>&)>& break_it = {}) {
  const json config = tiny_quantized_config();
  std::vector<TensorData> tensors = tiny::schema_tensors(Qwen35Config::parse(config.dump(), "config.json"));
  tensors.push_back(tiny::zero_tensor("mtp.fc.weight", DType::BF16, {64, 128}));
  if (break_it) break_it(tensors);
  tiny::write_checkpoint(dir.path(), config, tensors);
}

const std::string kLayer0 = "model.language_model.layers.0.";

TEST(CliInspect, GoodCheckpointPrintsJsonAndExitsZero) {
  TempDir dir;
  write_tiny(dir);
  CommandResult r = run_inspect(dir.str(), "--json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  json report = parse_or_null(r.out);
  ASSERT_TRUE(report.is_object()) << r.out;
  EXPECT_EQ(report["ok"], true);
  EXPECT_EQ(report["model"], dir.str());
  EXPECT_EQ(report["architecture"], "Qwen3_5ForConditionalGeneration");
  EXPECT_EQ(report["layer_pattern"], "linear linear linear full");
  EXPECT_EQ(report["text_params"], 200392);
  EXPECT_EQ(report["quantization"]["groups"][0]["group_size"], 32);
  EXPECT_EQ(report["skipped"]["mtp."]["count"], 1);
  EXPECT_TRUE(report["bytes_by_format"].contains("W4A16 g32"));
  EXPECT_EQ(report["missing"], json::array());
}

TEST(CliInspect, GoodCheckpointText) {
  TempDir dir;
  write_tiny(dir);
  CommandResult r = run_inspect(dir.str(), "");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("status        ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("group_0: W4A16 g32"), std::string::npos) << r.out;
}

TEST(CliInspect, BrokenCheckpointNamesEveryBadTensorAndExitsNonZero) {
  TempDir dir;
  write_tiny(dir, [](std::vector<TensorData>& tensors) {
    std::erase_if(tensors, [](const TensorData& t) { return t.name == kLayer0 + "linear_attn.dt_bias"; });
    *tiny::find_tensor(tensors, kLayer0 + "mlp.up_proj.weight_packed") =
        tiny::zero_tensor(kLayer0 + "mlp.up_proj.weight_packed", DType::I32, {128, 16});
    tensors.push_back(tiny::zero_tensor(kLayer0 + "mlp.up_proj.weight_zero_point", DType::I32, {16, 2}));
  });
  CommandResult r = run_inspect(dir.str(), "--json");
  EXPECT_EQ(r.exit_code, 1);
  json report = parse_or_null(r.out);
  ASSERT_TRUE(report.is_object()) << r.out;
  EXPECT_EQ(report["ok"], false);
  EXPECT_EQ(report["missing"], json::array({kLayer0 + "linear_attn.dt_bias"}));
  ASSERT_EQ(report["mismatched"].size(), 2u);
  EXPECT_EQ(report["mismatched"][0]["name"], kLayer0 + "mlp.up_proj.weight_packed");
  EXPECT_EQ(report["mismatched"][0]["expected"], "I32 [128, 8]");
  EXPECT_EQ(report["mismatched"][1]["name"], kLayer0 + "mlp.up_proj.weight_zero_point");
  EXPECT_EQ(r.err,
            "error: " + dir.str() +
                ": checkpoint does not match its config (1 missing, 0 unexpected, 2 mis-shaped tensors)\n");

  CommandResult text = run_inspect(dir.str(), "");
  EXPECT_EQ(text.exit_code, 1);
  EXPECT_NE(text.out.find("missing " + kLayer0 + "linear_attn.dt_bias\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(kLayer0 + "mlp.up_proj.weight_packed: expected I32 [128, 8], got I32 [128, 16]"),
            std::string::npos)
      << text.out;
}

TEST(CliInspect, BadConfigOrDirectoryIsAnErrorNamingIt) {
  TempDir dir;
  write_tiny(dir);
  tiny::write_config(dir.path(), json{{"architectures", {"MistralForCausalLM"}}});
  CommandResult r = run_inspect(dir.str(), "--json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "error: unsupported architecture MistralForCausalLM in " + dir.str() +
                       "/config.json (expected Qwen3_5ForCausalLM or Qwen3_5ForConditionalGeneration)\n");

  CommandResult missing = run_inspect((dir.path() / "nowhere").string(), "--json");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("nowhere"), std::string::npos) << missing.err;
}

// The real 4B layout (738 tensors, 8.4 GB of payload, here a sparse file) and its W4A16 g32 version: inspect
// reads the headers only, so it is instant where touching the payload would take seconds.
TEST(CliInspect, Qwen35_4BLayoutIsInstant) {
  for (bool w4a16 : {false, true}) {
    TempDir dir;
    json config = tiny::tiny_wrapper_config(true);
    config["text_config"] = tiny::qwen35_4b_text_config();
    if (w4a16) config["quantization_config"] = tiny::w4a16_quantization_config(32);
    std::vector<TensorSpec> specs = text_model_schema(Qwen35Config::parse(config.dump(), "config.json"));
    for (TensorSpec& spec : tiny::qwen35_4b_skipped_tensors()) specs.push_back(std::move(spec));
    tiny::write_config(dir.path(), config);
    tiny::write_header_only_safetensors(dir.path() / "model.safetensors", specs);

    const auto start = std::chrono::steady_clock::now();
    CommandResult r = run_inspect(dir.str(), "--json");
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_LT(elapsed.count(), 2.0) << "w4a16 " << w4a16;
    json report = parse_or_null(r.out);
    ASSERT_TRUE(report.is_object()) << r.out;
    // 200 quantized linears (MLP 3x32, GDN qkv/z/out 3x24, attention q/k/v/o 4x8) are 3 tensors instead of 1.
    EXPECT_EQ(report["expected_tensors"], w4a16 ? 426 + 2 * 200 : 426);
    EXPECT_EQ(report["skipped"]["model.visual."]["count"], 297);
    EXPECT_EQ(report["skipped"]["mtp."]["count"], 15);
    EXPECT_EQ(report["text_params"], 4'205'751'296);
    if (!w4a16) {
      EXPECT_EQ(specs.size(), 738u);
      EXPECT_EQ(report["bytes_by_dtype"]["BF16"], 2 * 4'205'751'296);
    }
  }
}

bool is_qwen35_config(const fs::path& config_json) {
  const json config = parse_or_null((std::stringstream() << std::ifstream(config_json).rdbuf()).str());
  return config.is_object() && config.contains("architectures") && config["architectures"].is_array() &&
         !config["architectures"].empty() && config["architectures"][0].is_string() &&
         config["architectures"][0].get<std::string>().starts_with("Qwen3_5For");
}

// Every Qwen3.5 checkpoint under tests/fixtures (made from HF by tools/oracle) must pass inspect.
TEST(CliInspect, EveryFixtureCheckpointPasses) {
  std::vector<fs::path> checkpoints;
  if (fs::is_directory(QSPEC_FIXTURES_DIR))
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(QSPEC_FIXTURES_DIR))
      if (entry.is_regular_file() && entry.path().filename() == "config.json" &&
          is_qwen35_config(entry.path()))
        checkpoints.push_back(entry.path().parent_path());
  if (checkpoints.empty()) GTEST_SKIP() << "no checkpoint (config.json) under " << QSPEC_FIXTURES_DIR;
  for (const fs::path& checkpoint : checkpoints) {
    CommandResult r = run_inspect(checkpoint.string(), "--json");
    EXPECT_EQ(r.exit_code, 0) << checkpoint << "\n" << r.out << r.err;
  }
}

}  // namespace
}  // namespace qspec
