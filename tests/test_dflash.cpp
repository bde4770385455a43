// The DFlash drafter against tools/oracle/make_dflash_fixtures.py (the published DFlash math in float32
// PyTorch, the target by HF transformers): every step's draft logits, and a whole greedy speculative run's
// drafts and accepted counts. Then the drafter's config checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "backend/argmax.h"
#include "engine/loaded_model.h"
#include "engine/speculative.h"
#include "error_message.h"
#include "fixture_files.h"
#include "io/safetensors.h"
#include "speculative_testing.h"
#include "temp_dir.h"

namespace qspec {
namespace {

namespace fs = std::filesystem;
using fixture_files::fixture_dirs;
using fixture_files::stored_values;
using speculative_testing::read_floats;

// Both sides compute in fp32 from the same weights; the target's features already differ by ~1e-5 of their
// scale (test_qwen35_oracle), and the drafter adds its own summation-order differences.
constexpr double kDraftLogitTolerance = 1e-4;  // max |qspec - oracle| / max |oracle| over a step's logits
constexpr float kDraftMargin = 1e-2f;  // a draft may differ only where the oracle's top1 - top2 is below this

double relative_error(const std::vector<float>& a, const float* b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

class DFlashOracle : public testing::TestWithParam<fs::path> {
 protected:
  void SetUp() override {
    const fs::path dir = GetParam();
    meta_ = nlohmann::json::parse(std::ifstream(dir / "oracle.json"));
    target_dir_ =
        (fs::path(QSPEC_FIXTURES_DIR) / "qwen35" / fs::path(meta_.at("target").get<std::string>()).filename())
            .string();
    oracle_ = std::make_unique<TensorStore>(TensorStore::open_file((dir / "oracle.safetensors").string()));
    target_ = LoadedModel::open(target_dir_, "cpu");
    store_ = std::make_unique<TensorStore>(TensorStore::open_dir(dir.string()));
    drafter_ =
        std::make_unique<DFlashModel>(DFlashConfig::load(dir.string()), *store_, *target_.model, target_dir_);
    prompt_ = stored_values<int32_t>(*oracle_, "prompt");
    tokens_ = stored_values<int32_t>(*oracle_, "tokens");
    window_ = meta_.at("draft_window").get<int>();
  }

  nlohmann::json meta_;
  std::string target_dir_;
  std::unique_ptr<TensorStore> oracle_, store_;
  LoadedModel target_;
  std::unique_ptr<DFlashModel> drafter_;
  std::vector<int32_t> prompt_, tokens_;
  int window_ = 0;
};

// Each recorded step from the oracle's own context (prompt + tokens before the step): prefill the target with
// the drafter's feature layers, hand the features to the drafter, draft the oracle's bonus.
TEST_P(DFlashOracle, EveryStepsDraftLogitsMatch) {
  Qwen35Model& target = *target_.model;
  const std::vector<int32_t> starts = stored_values<int32_t>(*oracle_, "starts");
  const std::vector<float> logits = stored_values<float>(*oracle_, "draft_logits");
  const size_t step_size = logits.size() / starts.size();
  std::vector<int32_t> sequence = prompt_;
  sequence.insert(sequence.end(), tokens_.begin(), tokens_.end());
  double worst = 0;
  for (size_t s = 0; s < starts.size(); ++s) {
    const auto start = size_t(starts[s]);
    auto state = target.new_state(int(start));
    auto draft_state = drafter_->new_state(int(start));
    ForwardOptions options;
    options.logits = false;
    options.hidden_layers = drafter_->config().target_layer_ids;
    const ForwardOutput out =
        target.forward(*state, std::span<const int32_t>(sequence.data(), start), options);
    // Every other step hands the features over in tensors of their own (the drafter concatenates them),
    // the others as the target's adjacent columns (read in place).
    std::vector<std::unique_ptr<Buffer>> apart;
    std::vector<Tensor> features = out.hidden;
    if (s % 2 == 1) {
      for (Tensor& f : features) {
        apart.push_back(target_.backend->alloc(DType::F32, f.rows, f.cols));
        target_.backend->copy(apart.back()->tensor(), f);
        f = apart.back()->tensor();
      }
      ASSERT_TRUE(concatenated_columns(features).empty()) << "step " << s;
    } else {
      ASSERT_FALSE(concatenated_columns(features).empty()) << "step " << s;
    }
    drafter_->add_context(*draft_state, features);
    const DraftOutput draft = drafter_->draft(*draft_state, sequence[start], window_);
    const std::vector<float> got = read_floats(*target_.backend, draft.logits);
    ASSERT_EQ(got.size(), step_size);
    const double e = relative_error(got, logits.data() + s * step_size, step_size);
    EXPECT_LE(e, kDraftLogitTolerance) << "step " << s;
    worst = std::max(worst, e);
    // The ids drafted in the same step are the argmax of each slot's logits row.
    std::vector<int32_t> ids(size_t(draft.ids.rows));
    target_.backend->read(ids.data(), draft.ids);
    const auto vocab = size_t(draft.logits.cols);
    for (size_t j = 0; j < ids.size(); ++j)
      EXPECT_EQ(ids[j], argmax(std::span<const float>(got.data() + j * vocab, vocab))) << "step " << s;
  }
  RecordProperty("max_draft_logit_error", std::to_string(worst));
  std::printf("[ oracle   ] %s: %zu steps, max relative draft logit error %.3g\n",
              GetParam().filename().c_str(), starts.size(), worst);
}

// The whole greedy speculative run: qspec's drafts and accepted counts are the oracle's (a draft may differ
// only at an oracle margin below kDraftMargin, after which the runs are not compared), and the output is the
// oracle's.
TEST_P(DFlashOracle, SpeculativeRunMatches) {
  Qwen35Model& target = *target_.model;
  const std::vector<int32_t> drafts = stored_values<int32_t>(*oracle_, "drafts");
  const std::vector<int32_t> accepted = stored_values<int32_t>(*oracle_, "accepted");
  const std::vector<float> margins = stored_values<float>(*oracle_, "draft_margins");
  GenerationOptions options;
  options.max_tokens = int(tokens_.size());
  options.ignore_eos = true;
  auto state = target.new_state(int(prompt_.size() + tokens_.size()));
  auto draft_state = drafter_->new_state(state->max_context);
  const Drafter drafter{*drafter_, *draft_state};
  SpeculativeOptions spec;
  spec.draft_window = window_;
  const GenerationResult result = generate_speculative(target, *state, &drafter, prompt_, options, spec);
  EXPECT_EQ(result.tokens, tokens_);
  const size_t per_step = drafts.size() / accepted.size();
  for (size_t s = 0; s < std::min(result.steps.size(), accepted.size()); ++s) {
    const SpeculativeStep& step = result.steps[s];
    for (size_t j = 0; j < step.drafts.size(); ++j) {
      if (step.drafts[j] == drafts[s * per_step + j]) continue;
      EXPECT_LT(margins[s * per_step + j], kDraftMargin) << "step " << s << " draft " << j;
      return;
    }
    EXPECT_EQ(step.accepted, accepted[s]) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DFlashOracle,
                         testing::ValuesIn(fixture_dirs("dflash", "oracle.safetensors")),
                         [](const testing::TestParamInfo<fs::path>& param) {
                           return speculative_testing::fixture_test_name(param.param);
                         });

TEST(DFlashOracleFixtures, TwoDraftersPresent) {
  EXPECT_GE(fixture_dirs("dflash", "oracle.safetensors").size(), 2u);
}

// ---- bad input: each a clear Error naming the file and the field

class DFlashErrors : public testing::Test {
 protected:
  void SetUp() override {
    target_dir_ = (fs::path(QSPEC_FIXTURES_DIR) / "qwen35" / "causal-f32-tiny").string();
    target_ = LoadedModel::open(target_dir_, "cpu");
  }
  const Qwen35Config& target_config() { return target_.model->config(); }

  // The error of loading a random drafter with `config` for the fixture target ("" when it loads).
  std::string load_error(const nlohmann::json& config) {
    testing_support::TempDir dir;
    return testing_support::error_message(
        [&] {
          write_synthetic_drafter(dir.str(), config, 1);
          TensorStore store = TensorStore::open_dir(dir.str());
          DFlashModel(DFlashConfig::load(dir.str()), store, *target_.model, target_dir_);
        },
        "");
  }

  std::string target_dir_;
  LoadedModel target_;
};

TEST_F(DFlashErrors, DrafterOfAnotherTarget) {
  nlohmann::json config = speculative_testing::drafter_config_for(target_config());
  EXPECT_EQ(load_error(config), "");
  auto expect = [&](nlohmann::json changed, std::vector<std::string> parts) {
    const std::string message = load_error(changed);
    ASSERT_NE(message, "") << changed.dump();
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  };
  nlohmann::json c = config;
  c["hidden_size"] = target_config().hidden_size * 2;
  c["intermediate_size"] = 64;
  expect(c, {"config.json", "hidden_size", "differs from the target's 32"});
  c = config;
  c["vocab_size"] = 512;
  expect(c, {"config.json", "vocab_size 512", "256"});
  c = config;
  c["dflash_config"]["target_layer_ids"] = {0, 2};
  expect(c, {"config.json", "target_layer_ids", "layer 2", "2 layers"});
  c = config;
  c["num_target_layers"] = 36;
  expect(c, {"config.json", "num_target_layers 36"});
  c = config;
  c["dflash_config"]["mask_token_id"] = 256;
  expect(c, {"config.json", "mask_token_id 256", "outside"});
}

TEST(DFlashConfigErrors, ConfigFieldsNameTheFieldAndTheExpectation) {
  const nlohmann::json base = {{"architectures", {"DFlashDraftModel"}},
                               {"block_size", 16},
                               {"dflash_config", {{"mask_token_id", 5}, {"target_layer_ids", {0}}}},
                               {"num_hidden_layers", 1},
                               {"hidden_size", 32},
                               {"intermediate_size", 64},
                               {"num_attention_heads", 2},
                               {"num_key_value_heads", 1},
                               {"vocab_size", 256}};
  EXPECT_NO_THROW(DFlashConfig::parse(base.dump(), "d/config.json"));
  auto error_of = [](const nlohmann::json& config) {
    return testing_support::error_message([&] { DFlashConfig::parse(config.dump(), "d/config.json"); }, "");
  };
  auto changed = [&](const char* key, nlohmann::json value) {
    nlohmann::json c = base;
    c[key] = std::move(value);
    return error_of(c);
  };
  EXPECT_NE(changed("architectures", {"Qwen3ForCausalLM"}).find("DFlashDraftModel"), std::string::npos);
  EXPECT_NE(changed("block_size", 1).find("block_size: expected at least 2"), std::string::npos);
  EXPECT_NE(changed("block_size", "16").find("block_size"), std::string::npos);
  EXPECT_NE(changed("layer_types", {"sliding_attention"}).find("layer_types"), std::string::npos);
  EXPECT_NE(changed("use_sliding_window", true).find("use_sliding_window"), std::string::npos);
  EXPECT_NE(changed("num_key_value_heads", 3)
                .find("num_attention_heads: expected a multiple of num_key_value_heads"),
            std::string::npos);
  EXPECT_NE(changed("dflash_config", {{"mask_token_id", -1}, {"target_layer_ids", {0}}})
                .find("dflash_config.mask_token_id"),
            std::string::npos);
  EXPECT_NE(changed("dflash_config", {{"mask_token_id", 5}, {"target_layer_ids", nlohmann::json::array()}})
                .find("dflash_config.target_layer_ids"),
            std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::array()).find("d/config.json"), std::string::npos);
  EXPECT_NE(testing_support::error_message([] { DFlashConfig::parse("{", "d/config.json"); }, "")
                .find("invalid JSON"),
            std::string::npos);
}

TEST(DFlashSpeculativeErrors, SpecTokensBeyondTheBlockAndMalformedOracles) {
  const std::string target_dir = (fs::path(QSPEC_FIXTURES_DIR) / "qwen35" / "causal-f32-tiny").string();
  LoadedModel loaded = LoadedModel::open(target_dir, "cpu");
  testing_support::TempDir dir;
  nlohmann::json config = speculative_testing::drafter_config_for(loaded.model->config());
  config["block_size"] = 8;  // another block size is served as it is
  write_synthetic_drafter(dir.str(), config, 1);
  TensorStore store = TensorStore::open_dir(dir.str());
  DFlashModel drafter(DFlashConfig::load(dir.str()), store, *loaded.model, target_dir);
  auto state = loaded.model->new_state(64);
  auto draft_state = drafter.new_state(64);
  const Drafter pair{drafter, *draft_state};
  GenerationOptions options;
  options.max_tokens = 20;
  const std::vector<int32_t> prompt = {1, 2, 3};
  SpeculativeOptions spec;
  spec.spec_tokens = 8;
  const std::string too_many = testing_support::error_message(
      [&] { generate_speculative(*loaded.model, *state, &pair, prompt, options, spec); }, "");
  EXPECT_NE(too_many.find("--spec-tokens: 8 drafts do not fit the drafter's block of 8"), std::string::npos)
      << too_many;
  spec.spec_tokens = 7;
  const GenerationResult result = generate_speculative(*loaded.model, *state, &pair, prompt, options, spec);
  EXPECT_EQ(result.steps.front().drafts.size(), 7u);

  const int vocab = loaded.model->config().vocab_size;
  auto oracle_error = [&](const std::string& text) {
    dir.write("oracle.json", text);
    return testing_support::error_message(
        [&] { read_draft_oracle((dir.path() / "oracle.json").string(), vocab); }, "");
  };
  EXPECT_EQ(oracle_error("[1, 2, 255]"), "");
  EXPECT_NE(oracle_error("[1, 2").find("invalid JSON"), std::string::npos);
  EXPECT_NE(oracle_error("{\"ids\": [1]}").find("expected a JSON array of token ids"), std::string::npos);
  EXPECT_NE(oracle_error("[1, \"2\"]").find("element 1"), std::string::npos);
  EXPECT_NE(oracle_error("[1, -3]").find("element 1 is -3"), std::string::npos);
  EXPECT_NE(oracle_error("[256]").find("element 0 is 256, expected a token id in [0, 256)"),
            std::string::npos);
  EXPECT_NE(oracle_error("[1.5]").find("element 0"), std::string::npos);
  const std::string missing = testing_support::error_message(
      [&] { read_draft_oracle((dir.path() / "none.json").string(), vocab); }, "");
  EXPECT_NE(missing.find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace qspec
