// `qspec generate` with --draft-model / --draft-oracle end to end: the tokens of plain generation, the
// "steps" of --json, and exit status 1 with a message naming the file or flag on bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "run_command.h"
#include "temp_dir.h"

namespace qspec {
namespace {

const std::string kTarget = std::string(QSPEC_FIXTURES_DIR) + "/qwen35/causal-tied-bf16";
const std::string kDrafter = std::string(QSPEC_FIXTURES_DIR) + "/dflash/tied-bf16-drafter";
const std::string kOtherDrafter = std::string(QSPEC_FIXTURES_DIR) + "/dflash/f32-tiny-windowed-drafter";

testing_support::CommandResult generate(const std::string& flags) {
  return testing_support::run_command(std::string(QSPEC_BINARY) + " generate --json --ignore-eos --model " +
                                      kTarget + " --prompt-ids 3,1,4,1,5,9,2,6 -n 24 " + flags);
}

std::vector<int32_t> tokens_of(const testing_support::CommandResult& run) {
  return nlohmann::json::parse(run.out).at("tokens").get<std::vector<int32_t>>();
}

TEST(SpeculativeCli, OracleAndDrafterGiveThePlainTokensAndRecordSteps) {
  const testing_support::CommandResult plain = generate("");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::vector<int32_t> expected = tokens_of(plain);
  EXPECT_FALSE(nlohmann::json::parse(plain.out).contains("steps"));

  // The plain output with token 10 wrong: the first step accepts 9 drafts.
  std::vector<int32_t> oracle = expected;
  oracle[10] = (oracle[10] + 1) % 256;
  testing_support::TempDir dir;
  dir.write("oracle.json", nlohmann::json(oracle).dump());
  const testing_support::CommandResult with_oracle =
      generate("--draft-oracle " + (dir.path() / "oracle.json").string() + " --spec-tokens 12");
  ASSERT_EQ(with_oracle.exit_code, 0) << with_oracle.err;
  const nlohmann::json out = nlohmann::json::parse(with_oracle.out);
  EXPECT_EQ(tokens_of(with_oracle), expected);
  ASSERT_GE(out.at("steps").size(), 2u);
  EXPECT_EQ(out["steps"][0]["accepted"], 9);
  EXPECT_EQ(out["steps"][0]["drafts"].size(), 12u);
  EXPECT_EQ(out["steps"][1]["accepted"], 12);
  double tokens_per_step = 0;
  for (const auto& step : out["steps"]) tokens_per_step += step["accepted"].get<double>() + 1;
  EXPECT_DOUBLE_EQ(out["mean_acceptance_length"].get<double>(),
                   tokens_per_step / double(out["steps"].size()));

  const testing_support::CommandResult with_drafter =
      generate("--draft-model " + kDrafter + " --draft-window 10");
  ASSERT_EQ(with_drafter.exit_code, 0) << with_drafter.err;
  EXPECT_EQ(tokens_of(with_drafter), expected);
  EXPECT_EQ(nlohmann::json::parse(with_drafter.out).at("steps")[0]["drafts"].size(), 15u);

  const testing_support::CommandResult quantized_head =
      generate("--draft-model " + kDrafter + " --draft-head w4a16");
  ASSERT_EQ(quantized_head.exit_code, 0) << quantized_head.err;
  EXPECT_EQ(tokens_of(quantized_head), expected);
}

TEST(SpeculativeCli, BadInputExitsWithOneAndNamesTheCause) {
  testing_support::TempDir dir;
  dir.write("not_json.json", "[1, 2");
  dir.write("negative.json", "[1, -2]");
  dir.write("too_large.json", "[1, 256]");
  dir.write("object.json", "{\"drafts\": [1]}");
  dir.write("oracle.json", "[1, 2, 3]");
  // The drafter with a block of 17 rows: more than a verify step takes.
  const std::filesystem::path wide_block = dir.path() / "wide-block-drafter";
  std::filesystem::copy(kDrafter, wide_block);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(wide_block / "config.json"));
  config["block_size"] = 17;
  std::filesystem::remove(wide_block / "config.json");
  std::ofstream(wide_block / "config.json") << config.dump();
  struct Case {
    std::string flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--draft-model " + kOtherDrafter, "hidden_size 32 differs from the target's 128"},
      {"--draft-model " + kDrafter + " --spec-tokens 16", "--spec-tokens: 16 drafts do not fit"},
      {"--draft-model " + wide_block.string(), "block_size 17 is above the 16 rows a verify step"},
      {"--draft-oracle " + (dir.path() / "oracle.json").string() + " --spec-tokens 16",
       "--spec-tokens: 16 drafts, expected at most 15"},
      {"--draft-model " + dir.str(), "config.json"},
      {"--draft-oracle " + (dir.path() / "not_json.json").string(), "invalid JSON"},
      {"--draft-oracle " + (dir.path() / "negative.json").string(), "element 1 is -2"},
      {"--draft-oracle " + (dir.path() / "too_large.json").string(), "element 1 is 256"},
      {"--draft-oracle " + (dir.path() / "object.json").string(), "expected a JSON array of token ids"},
      {"--draft-oracle " + (dir.path() / "missing.json").string(), "cannot open"},
      {"--spec-tokens 4", "need --draft-model or --draft-oracle"},
  };
  for (const Case& c : cases) {
    const testing_support::CommandResult run = generate(c.flags);
    EXPECT_EQ(run.exit_code, 1) << c.flags << "\n" << run.err;
    EXPECT_NE(run.err.find(c.message), std::string::npos) << c.flags << "\n" << run.err;
  }
  const testing_support::CommandResult no_drafter = generate("--draft-head w4a16");
  EXPECT_EQ(no_drafter.exit_code, 1);
  EXPECT_NE(no_drafter.err.find("--draft-head needs --draft-model"), std::string::npos) << no_drafter.err;
  // A value outside the option's choices is a usage error (CLI11's exit status), named with what it expects.
  const testing_support::CommandResult head = generate("--draft-model " + kDrafter + " --draft-head fp8");
  EXPECT_NE(head.exit_code, 0);
  EXPECT_NE(head.err.find("--draft-head: expected target or w4a16, got 'fp8'"), std::string::npos)
      << head.err;
}

// qspec bench with a drafter and the end-to-end protocol at tiny sizes: the draft and commit steps are
// recorded, every oracle acceptance length is the one measured (also with the drafter running every step),
// and the speculative cases carry a verify step timed alone (and the drafter's cases a draft step and a
// context pass).
TEST(SpeculativeCli, BenchRecordsDraftCommitAndEndToEndAcceptance) {
  testing_support::TempDir out;
  const testing_support::CommandResult run = testing_support::run_command(
      std::string(QSPEC_BINARY) + " bench --model " + kTarget + " --draft-model " + kDrafter +
      " --prefill 8 --repeats 1 --e2e --e2e-prompts 64 --acceptance 1,5,16 --warmups 0 --e2e-runs 3 --out " +
      out.str());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(out.path())) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const nlohmann::json record = nlohmann::json::parse(std::ifstream(files[0]));
  std::vector<std::string> steps;
  for (const auto& step : record.at("steps")) steps.push_back(step.at("name"));
  EXPECT_NE(std::find(steps.begin(), steps.end(), "draft"), steps.end());
  // The draft step's bytes: the drafter's layers and final norm, the target's tied BF16 head [256, 128], and
  // K and V (F32) of 2 layers x 2 heads x 32 over the default context of 64 tokens and the block of 16.
  double drafter_bytes = 0;
  const TensorStore drafter_store = TensorStore::open_dir(kDrafter);
  for (const TensorView* t : drafter_store.all())
    if (t->name.starts_with("layers.") || t->name == "norm.weight") drafter_bytes += double(t->nbytes);
  const double head_bytes = 256.0 * 128 * 2, kv_bytes = 2.0 * (64 + 16) * 2 * 2 * 32 * 4;
  for (const auto& step : record.at("steps"))
    if (step.at("name") == "draft") {
      EXPECT_DOUBLE_EQ(step.at("bytes").get<double>(), drafter_bytes + head_bytes + kv_bytes);
      EXPECT_GT(step.at("limit_ms").get<double>(), 0.0);
    }
  EXPECT_NE(std::find(steps.begin(), steps.end(), "commit 16"), steps.end());
  const nlohmann::json& e2e = record.at("end_to_end");
  ASSERT_EQ(e2e.size(), 7u);  // plain, then 1, 5, 16 tokens per step, each without and with the drafter
  EXPECT_EQ(e2e[0]["acceptance_length"], 0);
  for (size_t i = 1; i < e2e.size(); ++i) {
    EXPECT_EQ(e2e[i]["drafter"], i % 2 == 0) << i;
    if (i % 2 == 0) {
      EXPECT_EQ(e2e[i]["acceptance_length"], e2e[i - 1]["acceptance_length"]) << i;
    }
  }
  // Each timed request (3 a case): its prefill and its steps (the first token comes from the prefill, each
  // step emits the measured tokens) fit in the request's time, and take most of it.
  for (const nlohmann::json& r : e2e) {
    const auto ms = r["ms"].get<std::vector<double>>(), prefill = r["prefill_ms"].get<std::vector<double>>(),
               step = r["step_ms"].get<std::vector<double>>();
    ASSERT_EQ(ms.size(), 3u);
    ASSERT_EQ(prefill.size(), 3u);
    ASSERT_EQ(step.size(), 3u);
    const double step_count =
        (r["new_tokens"].get<double>() - 1) / r["measured_acceptance_length"].get<double>();
    for (size_t j = 0; j < ms.size(); ++j) {
      EXPECT_GT(prefill[j], 0.0);
      EXPECT_GT(step[j], 0.0);
      EXPECT_LE(prefill[j] + step[j] * step_count, ms[j] * 1.001);
      EXPECT_GE(prefill[j] + step[j] * step_count, 0.5 * ms[j]);
    }
  }
  // A verify step timed alone, for the speculative cases: part of each of their steps, so at most a step's
  // time (twice that: medians of three runs on a shared machine); the rest of a step is reported as the
  // difference.
  // With the drafter running, a draft step timed alone likewise, and the rest leaves out both.
  EXPECT_FALSE(e2e[0].contains("median_verify_ms"));
  for (size_t i = 1; i < e2e.size(); ++i) {
    const double verify = e2e[i]["median_verify_ms"].get<double>(),
                 step = e2e[i]["median_step_ms"].get<double>();
    EXPECT_GT(verify, 0.0);
    EXPECT_LE(verify, 2.0 * step);
    const bool drafter = e2e[i]["drafter"].get<bool>();
    EXPECT_EQ(e2e[i].contains("median_draft_ms"), drafter);
    const double draft = drafter ? e2e[i]["median_draft_ms"].get<double>() : 0.0;
    EXPECT_EQ(e2e[i].contains("median_context_ms"), drafter);
    if (drafter) {
      EXPECT_GT(draft, 0.0);
      EXPECT_LE(draft, 2.0 * step);
      // The context pass of as many rows as a step emits, timed alone once per timed request: part of the
      // rest, so at most a step's time (twice that, as above).
      EXPECT_EQ(e2e[i]["context_ms"].size(), 3u);
      const double context = e2e[i]["median_context_ms"].get<double>();
      EXPECT_GT(context, 0.0);
      EXPECT_LE(context, 2.0 * step);
      // The drafter ran: its context followed the target's over the prompt and every emitted token but the
      // last.
      EXPECT_EQ(e2e[i]["drafter_context"].get<int>(),
                e2e[i]["prompt_tokens"].get<int>() + e2e[i]["new_tokens"].get<int>() - 1);
    }
    EXPECT_DOUBLE_EQ(e2e[i]["median_rest_ms"].get<double>(), step - verify - draft);
  }
  for (size_t i = 1; i < e2e.size(); ++i) {
    const int requested = e2e[i]["acceptance_length"].get<int>();
    // The last step of a request may emit fewer tokens (max_tokens), so the mean is at most the requested.
    EXPECT_LE(e2e[i]["measured_acceptance_length"].get<double>(), requested);
    EXPECT_GT(e2e[i]["measured_acceptance_length"].get<double>(), requested - 1);
    EXPECT_EQ(e2e[i]["new_tokens"], 128);
  }
}

}  // namespace
}  // namespace qspec
