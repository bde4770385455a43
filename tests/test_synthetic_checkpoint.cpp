// The synthetic Qwen3.5-4B layout: its config parses and its schema is the published model's (the full 4 GB
// checkpoint is written and inspected on the GPU machine by scripts/gpu.sh, not here).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "engine/loaded_model.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "io/synthetic_checkpoint.h"
#include "tiny_checkpoint.h"

namespace qspec {
namespace {

TEST(SyntheticCheckpoint, Qwen35_4bConfigHasThePublishedShape) {
  for (const std::string& format : synth_formats()) {
    SynthOptions options;
    options.format = format;
    Qwen35Config c = Qwen35Config::parse(synthetic_config(options).dump(), "synthetic");
    EXPECT_EQ(c.architecture, "Qwen3_5ForConditionalGeneration");
    EXPECT_EQ(c.num_layers, 32);
    EXPECT_EQ(c.rotary_dim, 64);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_EQ(c.quantization.has_value(), format != "bf16") << format;
    // 4,205,751,296 text parameters: the count that pins the 4B's dimensions (qwen35-model.md §1.1).
    int64_t params = 0;
    size_t dense_tensors = 0;
    for (const TensorSpec& spec : text_model_schema(c)) {
      params += spec.params;
      dense_tensors += spec.format == "dense";
    }
    EXPECT_EQ(params, 4205751296) << format;
    if (format == "bf16") {
      EXPECT_EQ(dense_tensors, 426u);
    }
  }
}

// The tiny model is written whole: it validates, loads, carries the tokenizer files, and runs a step with
// finite logits over the real vocabulary.
TEST(SyntheticCheckpoint, TinyModelWithTheRealVocabularyRuns) {
  tiny::TempDir dir;
  SynthOptions options;
  options.arch = "qwen3.5-tiny";
  options.tokenizer_dir = std::string(QSPEC_FIXTURES_DIR) + "/../../models/qwen3.5-tokenizer";
  write_synthetic_checkpoint(dir.str(), options);
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "tokenizer.json"));
  LoadedModel loaded = LoadedModel::open(dir.str(), "cpu");
  EXPECT_EQ(loaded.model->config().vocab_size, 248320);
  auto state = loaded.model->new_state(8);
  std::vector<int32_t> prompt = {248045, 846, 198};
  ForwardOutput out = loaded.model->forward(*state, prompt, ForwardOptions{});
  std::vector<float> logits(size_t(out.logits.numel()));
  loaded.backend->read(logits.data(), out.logits);
  ASSERT_EQ(logits.size(), 248320u);
  float spread =
      *std::max_element(logits.begin(), logits.end()) - *std::min_element(logits.begin(), logits.end());
  EXPECT_TRUE(std::isfinite(spread));
  EXPECT_GT(spread, 0.1f);  // not a constant: the random weights reach the head
}

TEST(SyntheticCheckpoint, UnknownArchOrFormatIsAClearError) {
  SynthOptions bad_arch;
  bad_arch.arch = "llama-7b";
  EXPECT_THROW(
      {
        try {
          synthetic_config(bad_arch);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("--arch"), std::string::npos);
          throw;
        }
      },
      Error);
  SynthOptions bad_format;
  bad_format.format = "int3";
  EXPECT_THROW(synthetic_config(bad_format), Error);
}

}  // namespace
}  // namespace qspec
