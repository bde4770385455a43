// The speculative loop on every fixture target: greedy output equals plain greedy output token for token
// (with oracle drafts that force every acceptance length 0..15, and with a random drafter with and without
// its sliding window), stop ids / max_tokens / a stopping callback inside an accepted block end generation
// exactly where plain generation ends it, with the same state.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/speculative.h"
#include "error_message.h"
#include "io/safetensors.h"
#include "speculative_testing.h"
#include "temp_dir.h"

namespace qspec {
namespace {

using speculative_testing::state_contents;

std::vector<int32_t> random_prompt(int length, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (int32_t& t : prompt) t = id(rng);
  return prompt;
}

// The greedy loops' device argmax: the ids of up to max_rows rows, by the host rule; more rows are refused.
TEST(DeviceArgmax, IdsOfUpToItsRowsByTheHostRule) {
  auto backend = make_cpu_backend();
  const std::vector<float> logits = {0.5f, 3.0f, 3.0f, -1.0f,  // a tie: 1
                                     7.0f, 0.0f, 1.0f, 2.0f,   // 0
                                     0.0f, 0.0f, 0.0f, 9.0f};  // 3
  auto buffer = backend->alloc(DType::F32, 3, 4);
  backend->write(buffer->tensor(), logits.data());
  DeviceArgmax device_argmax(*backend, 3);
  const std::span<const int32_t> ids = device_argmax(buffer->tensor());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), (std::vector<int32_t>{1, 0, 3}));
  const std::span<const int32_t> last = device_argmax(buffer->tensor().rows_view(2, 1));
  EXPECT_EQ(std::vector<int32_t>(last.begin(), last.end()), std::vector<int32_t>{3});
  DeviceArgmax one_row(*backend, 1);
  EXPECT_EQ(testing_support::error_message([&] { one_row(buffer->tensor()); }, "no error"),
            "argmax of 3 rows; this DeviceArgmax holds 1");
}

class SpeculativeLossless : public testing::TestWithParam<std::filesystem::path> {
 protected:
  void SetUp() override {
    loaded_ = LoadedModel::open(GetParam().string(), "cpu");
    prompt_ = random_prompt(9, model().config().vocab_size, 3);
  }
  Qwen35Model& model() { return *loaded_.model; }

  GenerationOptions greedy(int max_tokens) const {
    GenerationOptions options;
    options.max_tokens = max_tokens;
    options.ignore_eos = true;
    return options;
  }

  std::vector<int32_t> plain(const GenerationOptions& options) {
    auto state = model().new_state(int(prompt_.size()) + options.max_tokens);
    return generate(model(), *state, prompt_, options).tokens;
  }

  LoadedModel loaded_;
  std::vector<int32_t> prompt_;
};

// Oracle drafts = the plain output with one wrong token placed so that step k accepts exactly k drafts
// (k = 0..15), then a few steps of full acceptance at the end.
TEST_P(SpeculativeLossless, OracleDraftsForcingEveryAcceptanceLength) {
  const int vocab = model().config().vocab_size;
  std::vector<int> lengths(16);
  for (int k = 0; k < 16; ++k) lengths[size_t(k)] = k;
  int total = 1;  // the prefill's token
  for (int a : lengths) total += a + 1;
  const GenerationOptions options = greedy(total);
  const std::vector<int32_t> expected = plain(options);
  std::vector<int32_t> oracle = expected;
  for (int emitted = 1, step = 0; step < 16; ++step) {
    const int a = lengths[size_t(step)];
    if (a < 15) oracle[size_t(emitted + a)] = (expected[size_t(emitted + a)] + 1) % vocab;
    emitted += a + 1;
  }
  SpeculativeOptions spec;
  spec.oracle_drafts = oracle;
  auto state = model().new_state(int(prompt_.size()) + options.max_tokens);
  const GenerationResult result = generate_speculative(model(), *state, nullptr, prompt_, options, spec);
  EXPECT_EQ(result.tokens, expected);
  std::vector<int> accepted;
  for (const SpeculativeStep& step : result.steps) accepted.push_back(step.accepted);
  EXPECT_EQ(accepted, lengths);
  EXPECT_EQ(result.accepted_tokens, 15 * 16 / 2);
}

// A random drafter (it rarely guesses right; every step still verifies 15 drafts), with and without a window
// smaller than the context.
TEST_P(SpeculativeLossless, RandomDrafter) {
  testing_support::TempDir dir;
  write_synthetic_drafter(dir.str(), speculative_testing::drafter_config_for(model().config()), 5);
  TensorStore store = TensorStore::open_dir(dir.str());
  DFlashModel drafter(DFlashConfig::load(dir.str()), store, model(), GetParam().string());
  const GenerationOptions options = greedy(40);
  const std::vector<int32_t> expected = plain(options);
  for (int window : {0, 12}) {
    SCOPED_TRACE(testing::Message() << "window " << window);
    auto state = model().new_state(int(prompt_.size()) + options.max_tokens);
    auto draft_state = drafter.new_state(state->max_context);
    const Drafter pair{drafter, *draft_state};
    SpeculativeOptions spec;
    spec.draft_window = window;
    const GenerationResult result = generate_speculative(model(), *state, &pair, prompt_, options, spec);
    EXPECT_EQ(result.tokens, expected);
    EXPECT_EQ(draft_state->n_context, state->n_past);
    for (const SpeculativeStep& step : result.steps) EXPECT_LE(step.drafts.size(), 15u);
    EXPECT_EQ(result.steps.front().drafts.size(), 15u);
  }
}

// A drafter whose head is a W4A16 g32 copy of the target's (DraftHead::W4A16): the output stays plain
// greedy's, and a draft step's logits are the target head's up to the copy's rounding, not equal to them.
// The bound is loose (up to ~15% of the logits' range on these random weights, whose groups are flat); the
// rounding itself is Int4Quantize's test.
TEST_P(SpeculativeLossless, RandomDrafterWithAQuantizedHead) {
  testing_support::TempDir dir;
  write_synthetic_drafter(dir.str(), speculative_testing::drafter_config_for(model().config()), 5);
  TensorStore store = TensorStore::open_dir(dir.str());
  DFlashModel exact(DFlashConfig::load(dir.str()), store, model(), GetParam().string());
  DFlashModel quantized(DFlashConfig::load(dir.str()), store, model(), GetParam().string(), DraftHead::W4A16);
  const GenerationOptions options = greedy(40);
  auto state = model().new_state(int(prompt_.size()) + options.max_tokens);
  auto draft_state = quantized.new_state(state->max_context);
  const Drafter pair{quantized, *draft_state};
  EXPECT_EQ(generate_speculative(model(), *state, &pair, prompt_, options, SpeculativeOptions{}).tokens,
            plain(options));

  Backend& backend = *loaded_.backend;
  auto logits_of = [&](DFlashModel& drafter) {
    auto target_state = model().new_state(int(prompt_.size()) + 16);
    auto context = drafter.new_state(target_state->max_context);
    ForwardOptions features;
    features.hidden_layers = drafter.config().target_layer_ids;
    drafter.add_context(*context, model().forward(*target_state, prompt_, features).hidden);
    const Tensor logits = drafter.draft(*context, prompt_.back(), 0).logits;
    std::vector<float> values(size_t(logits.numel()));
    backend.read(values.data(), logits);
    return values;
  };
  const std::vector<float> want = logits_of(exact), got = logits_of(quantized);
  float range = 0.0f, error = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) {
    range = std::max(range, std::fabs(want[i]));
    error = std::max(error, std::fabs(got[i] - want[i]));
  }
  EXPECT_GT(error, 0.0f);
  EXPECT_LT(error, 0.25f * range);
}

// Oracle drafts with a drafter too: the drafter runs every step (for timing) but the oracle's drafts are
// verified, so the output, drafts and accepted counts are those of the oracle alone, and the drafter's
// context follows the target's.
TEST_P(SpeculativeLossless, OracleDraftsWithTheDrafterRunning) {
  testing_support::TempDir dir;
  write_synthetic_drafter(dir.str(), speculative_testing::drafter_config_for(model().config()), 6);
  TensorStore store = TensorStore::open_dir(dir.str());
  DFlashModel drafter(DFlashConfig::load(dir.str()), store, model(), GetParam().string());
  const GenerationOptions options = greedy(40);
  std::vector<int32_t> oracle = plain(options);
  for (size_t i = 5; i < oracle.size(); i += 7) oracle[i] = (oracle[i] + 1) % model().config().vocab_size;
  SpeculativeOptions spec;
  spec.oracle_drafts = oracle;
  auto alone_state = model().new_state(int(prompt_.size()) + options.max_tokens);
  const GenerationResult alone = generate_speculative(model(), *alone_state, nullptr, prompt_, options, spec);
  auto state = model().new_state(int(prompt_.size()) + options.max_tokens);
  auto draft_state = drafter.new_state(state->max_context);
  const Drafter pair{drafter, *draft_state};
  const GenerationResult with_drafter = generate_speculative(model(), *state, &pair, prompt_, options, spec);
  EXPECT_EQ(with_drafter.tokens, alone.tokens);
  ASSERT_EQ(with_drafter.steps.size(), alone.steps.size());
  for (size_t i = 0; i < alone.steps.size(); ++i) {
    EXPECT_EQ(with_drafter.steps[i].drafts, alone.steps[i].drafts) << "step " << i;
    EXPECT_EQ(with_drafter.steps[i].accepted, alone.steps[i].accepted) << "step " << i;
  }
  EXPECT_EQ(draft_state->n_context, state->n_past);
  EXPECT_GT(draft_state->n_context, int(prompt_.size()));
}

// Stop ids, max_tokens and a callback that stops, each inside a fully accepted block: the output and the
// state (n_past, every buffer) equal plain generation's.
TEST_P(SpeculativeLossless, EndsInsideAnAcceptedBlockWhereGenerateEnds) {
  const std::vector<int32_t> full = plain(greedy(40));
  SpeculativeOptions spec;
  spec.oracle_drafts = full;
  struct Case {
    const char* name;
    GenerationOptions options;
    int stop_after = 0;  // the callback returns false at this token (0: never)
  };
  GenerationOptions with_stop = greedy(40);
  with_stop.stop_ids = {full[21]};
  std::vector<Case> cases = {{"stop id", with_stop}, {"max_tokens", greedy(23)}, {"callback", greedy(40), 7}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    int seen = 0;
    const TokenCallback callback = [&](int32_t) { return ++seen != c.stop_after; };
    auto plain_state = model().new_state(int(prompt_.size()) + 40);
    const GenerationResult want = generate(model(), *plain_state, prompt_, c.options, callback);
    seen = 0;
    auto state = model().new_state(int(prompt_.size()) + 40);
    const GenerationResult got =
        generate_speculative(model(), *state, nullptr, prompt_, c.options, spec, callback);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.finish_reason, want.finish_reason);
    EXPECT_EQ(state->n_past, plain_state->n_past);
    EXPECT_EQ(state_contents(*loaded_.backend, *state), state_contents(*loaded_.backend, *plain_state));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpeculativeLossless,
                         testing::ValuesIn(speculative_testing::target_fixture_dirs()),
                         [](const testing::TestParamInfo<std::filesystem::path>& param) {
                           return speculative_testing::fixture_test_name(param.param);
                         });

}  // namespace
}  // namespace qspec
