// The CPU reference against HF transformers (float32) on the fixtures made by
// tools/oracle/make_qwen35_fixtures.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/sampler.h"
#include "fixture_files.h"
#include "run_command.h"

namespace qspec {
namespace {

namespace fs = std::filesystem;
using fixture_files::fixture_dirs;
using fixture_files::stored_values;

// Both sides compute in fp32 from the same weights; only summation order differs, which after a few layers
// gives relative differences of 2e-6..1e-5 of the logit scale on these fixtures (HF itself is ~3e-6 from
// float64).
constexpr double kLogitTolerance = 5e-5;   // max |qspec - HF| / max |HF| over the compared rows
constexpr double kHiddenTolerance = 5e-5;  // same measure on the residual stream
constexpr float kGreedyMargin =
    1e-3f;  // a divergence is allowed only after an HF top1-top2 margin below this

std::vector<float> read_all(Backend& backend, const Tensor& t) {
  std::vector<float> out(size_t(t.numel()));
  backend.read(out.data(), t);
  return out;
}

// max |a - b| / max |b|
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

class Qwen35Oracle : public testing::TestWithParam<fs::path> {
 protected:
  void SetUp() override {
    dir_ = GetParam();
    oracle_ = std::make_unique<TensorStore>(TensorStore::open_file((dir_ / "oracle.safetensors").string()));
    std::ifstream f(dir_ / "oracle.json");
    meta_ = nlohmann::json::parse(f);
    loaded_ = LoadedModel::open(dir_.string(), "cpu");
  }

  Qwen35Model& model() { return *loaded_.model; }
  Backend& backend() { return *loaded_.backend; }

  fs::path dir_;
  std::unique_ptr<TensorStore> oracle_;
  nlohmann::json meta_;
  LoadedModel loaded_;
};

TEST_P(Qwen35Oracle, PrefillLogitsAndHiddenStatesMatchHF) {
  std::vector<int> layers = meta_.at("hidden_layers").get<std::vector<int>>();
  double worst_logits = 0, worst_hidden = 0;
  for (int length : meta_.at("prompt_lengths").get<std::vector<int>>()) {
    std::string p = "p" + std::to_string(length);
    std::vector<int32_t> ids = stored_values<int32_t>(*oracle_, p + ".ids");
    auto state = model().new_state(length);
    ForwardOptions options;
    options.all_logits = true;
    options.hidden_layers = layers;
    ForwardOutput out = model().forward(*state, ids, options);
    double e = relative_error(read_all(backend(), out.logits), stored_values<float>(*oracle_, p + ".logits"));
    EXPECT_LE(e, kLogitTolerance) << dir_.filename() << " " << p;
    worst_logits = std::max(worst_logits, e);
    for (size_t i = 0; i < layers.size(); ++i) {
      std::string name = p + ".hidden." + std::to_string(layers[i]);
      double h = relative_error(read_all(backend(), out.hidden[i]), stored_values<float>(*oracle_, name));
      EXPECT_LE(h, kHiddenTolerance) << dir_.filename() << " " << name;
      worst_hidden = std::max(worst_hidden, h);
    }
  }
  RecordProperty("max_logit_error", std::to_string(worst_logits));
  std::printf("[ oracle   ] %s: max relative logit error %.3g, hidden %.3g\n", dir_.filename().c_str(),
              worst_logits, worst_hidden);
}

// Token-by-token decode (recurrent GDN rule, growing KV cache) equals the chunked full-sequence prefill.
TEST_P(Qwen35Oracle, DecodeEqualsChunkedPrefill) {
  const int length = 65;
  std::vector<int32_t> ids = stored_values<int32_t>(*oracle_, "p65.ids");
  std::vector<float> ref = stored_values<float>(*oracle_, "p65.logits");
  const size_t V = size_t(model().config().vocab_size);
  auto state = model().new_state(length);
  std::vector<float> decoded;
  for (int t = 0; t < length; ++t) {
    ForwardOutput out =
        model().forward(*state, std::span<const int32_t>(&ids[size_t(t)], 1), ForwardOptions{});
    std::vector<float> row = read_all(backend(), out.logits);
    decoded.insert(decoded.end(), row.begin(), row.end());
  }
  ASSERT_EQ(decoded.size(), size_t(length) * V);
  EXPECT_LE(relative_error(decoded, ref), kLogitTolerance);

  // Prefill split at a chunk boundary and off it (63 + 2, then 64 + 1) gives the same last-row logits.
  for (int split : {63, 64, 1}) {
    auto s = model().new_state(length);
    model().forward(*s, std::span<const int32_t>(ids.data(), size_t(split)), ForwardOptions{});
    ForwardOutput out = model().forward(
        *s, std::span<const int32_t>(ids.data() + split, size_t(length - split)), ForwardOptions{});
    std::vector<float> last(ref.end() - ptrdiff_t(V), ref.end());
    EXPECT_LE(relative_error(read_all(backend(), out.logits), last), kLogitTolerance) << "split " << split;
  }
}

// A 16-token verify step from a non-empty cache (chunked GDN from a saved state, causal attention inside the
// block) gives every row the logits of 16 single decode steps: the equivalence speculative decoding rests on.
TEST_P(Qwen35Oracle, VerifyBlockEqualsSingleDecodeSteps) {
  std::vector<int32_t> ids = stored_values<int32_t>(*oracle_, "p65.ids");
  const int context = 40, block = 16;
  const std::span<const int32_t> prefix(ids.data(), size_t(context)),
      rows(ids.data() + context, size_t(block));
  auto verify_state = model().new_state(context + block);
  model().forward(*verify_state, prefix, ForwardOptions{});
  ForwardOptions all_rows;
  all_rows.all_logits = true;
  std::vector<float> verify = read_all(backend(), model().forward(*verify_state, rows, all_rows).logits);

  auto decode_state = model().new_state(context + block);
  model().forward(*decode_state, prefix, ForwardOptions{});
  std::vector<float> decoded;
  for (int32_t token : rows) {
    std::vector<float> row = read_all(
        backend(),
        model().forward(*decode_state, std::span<const int32_t>(&token, 1), ForwardOptions{}).logits);
    decoded.insert(decoded.end(), row.begin(), row.end());
  }
  ASSERT_EQ(verify.size(), decoded.size());
  EXPECT_LE(relative_error(verify, decoded), kLogitTolerance) << dir_.filename();
  // And both equal HF's rows 40..55 of the full-sequence forward.
  std::vector<float> ref = stored_values<float>(*oracle_, "p65.logits");
  const size_t V = size_t(model().config().vocab_size);
  std::vector<float> ref_rows(ref.begin() + ptrdiff_t(context * V),
                              ref.begin() + ptrdiff_t((context + block) * V));
  EXPECT_LE(relative_error(verify, ref_rows), kLogitTolerance) << dir_.filename();
}

// Greedy decoding through the cached path (prefill, then the recurrent rule one token at a time) against HF's
// cached greedy decode: every step's logits, and the chosen tokens.
TEST_P(Qwen35Oracle, GreedyDecodeMatchesHF) {
  std::vector<int32_t> prompt = stored_values<int32_t>(*oracle_, "greedy.prompt");
  std::vector<int32_t> expected = stored_values<int32_t>(*oracle_, "greedy.tokens");
  std::vector<float> margins = stored_values<float>(*oracle_, "greedy.margins");
  std::vector<float> step_logits = stored_values<float>(*oracle_, "greedy.decode_logits");
  const size_t V = size_t(model().config().vocab_size);
  auto state = model().new_state(int(prompt.size() + expected.size()));
  ForwardOutput out = model().forward(*state, prompt, ForwardOptions{});
  for (size_t i = 0; i < expected.size(); ++i) {
    std::vector<float> logits = read_all(backend(), out.logits);
    std::vector<float> ref(step_logits.begin() + ptrdiff_t(i * V),
                           step_logits.begin() + ptrdiff_t((i + 1) * V));
    EXPECT_LE(relative_error(logits, ref), kLogitTolerance) << dir_.filename() << " step " << i;
    int32_t token = argmax(logits);
    if (token != expected[i]) {
      // A divergence is legitimate only where HF's own choice was a near-tie; the rest cannot be compared.
      EXPECT_LT(margins[i], kGreedyMargin)
          << dir_.filename() << ": step " << i << " chose " << token << ", HF chose " << expected[i];
      return;
    }
    out = model().forward(*state, std::span<const int32_t>(&token, 1), ForwardOptions{});
  }
}

// The command line end to end: `qspec generate --json` prints HF's greedy tokens.
TEST_P(Qwen35Oracle, GenerateCommandPrintsHFGreedyTokens) {
  std::vector<int32_t> prompt = stored_values<int32_t>(*oracle_, "greedy.prompt");
  std::vector<int32_t> expected = stored_values<int32_t>(*oracle_, "greedy.tokens");
  std::vector<float> margins = stored_values<float>(*oracle_, "greedy.margins");
  std::string ids;
  for (int32_t id : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  std::string command = std::string(QSPEC_BINARY) + " generate --json --ignore-eos --model " + dir_.string() +
                        " --prompt-ids " + ids + " --max-tokens " + std::to_string(expected.size());
  const testing_support::CommandResult run = testing_support::run_command(command);
  ASSERT_EQ(run.exit_code, 0) << command << "\n" << run.err;
  std::vector<int32_t> tokens = nlohmann::json::parse(run.out).at("tokens").get<std::vector<int32_t>>();
  ASSERT_EQ(tokens.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    if (tokens[i] != expected[i]) {
      EXPECT_LT(margins[i], kGreedyMargin) << "step " << i;
      break;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Qwen35Oracle,
                         testing::ValuesIn(fixture_dirs("qwen35", "oracle.safetensors")),
                         [](const testing::TestParamInfo<fs::path>& param) {
                           std::string name = param.param.filename().string();
                           std::replace_if(
                               name.begin(), name.end(), [](char ch) { return !std::isalnum(ch); }, '_');
                           return name;
                         });

TEST(Qwen35OracleFixtures, AtLeastFourModelsPresent) {
  EXPECT_GE(fixture_dirs("qwen35", "oracle.safetensors").size(), 4u);
}

}  // namespace
}  // namespace qspec
