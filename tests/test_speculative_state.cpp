// Rollback of a verify step without per-position snapshots: a verify forward leaves the state where it was
// (update_state = false in the GDN ops), and Qwen35Model::commit replays the accepted prefix. The state after
// any accepted length must be bitwise the state of a run that never saw the rejected tokens.
#include <gtest/gtest.h>

#include <random>
#include <span>
#include <vector>

#include "backend/cpu/gated_delta_rule.h"
#include "cpu_op_testing.h"
#include "engine/loaded_model.h"
#include "speculative_testing.h"

namespace qspec {
namespace {

using cpu_test::TestTensor;
using speculative_testing::read_floats;
using speculative_testing::state_contents;

std::vector<float> values_of(const TestTensor& t) {
  std::vector<float> out;
  for (int64_t r = 0; r < t.rows(); ++r)
    out.insert(out.end(), t.view().row<float>(r), t.view().row<float>(r) + t.cols());
  return out;
}

// Without update_state the ops read the state and leave it bit for bit; their outputs are those of the
// updating call.
TEST(SpeculativeState, OpsWithoutStateUpdateOnlyReadTheState) {
  std::mt19937 rng(51);
  auto backend = make_cpu_backend();
  const int64_t tokens = 16, channels = 24, kernel = 4;
  TestTensor x = cpu_test::random_tensor(rng, DType::F32, tokens, channels, -2, 2);
  TestTensor w = cpu_test::random_tensor(rng, DType::F32, channels, kernel);
  TestTensor conv_state = cpu_test::random_tensor(rng, DType::F32, channels, kernel - 1);
  TestTensor conv_updated(DType::F32, channels, kernel - 1);
  backend->copy(conv_updated.view(), conv_state.view());
  const std::vector<float> conv_before = values_of(conv_state);
  TestTensor read_only_out(DType::F32, tokens, channels), updating_out(DType::F32, tokens, channels);
  backend->conv1d_silu(read_only_out.view(), x.view(), conv_state.view(), w.view(), false);
  backend->conv1d_silu(updating_out.view(), x.view(), conv_updated.view(), w.view(), true);
  EXPECT_EQ(values_of(conv_state), conv_before);
  EXPECT_NE(values_of(conv_updated), conv_before);
  EXPECT_EQ(values_of(read_only_out), values_of(updating_out));

  const GdnShape shape{2, 4, 16, 8};
  const int64_t qkv_cols = 2 * 2 * 16 + 4 * 8;
  TestTensor qkv = cpu_test::random_tensor(rng, DType::F32, tokens, qkv_cols, -1, 1);
  TestTensor beta = cpu_test::random_tensor(rng, DType::F32, tokens, 4, 0.1, 0.9);
  TestTensor g = cpu_test::random_tensor(rng, DType::F32, tokens, 4, -1, -0.01);
  TestTensor state = cpu_test::random_tensor(rng, DType::F32, 4 * 16, 8, -0.5, 0.5);
  TestTensor updated(DType::F32, 4 * 16, 8);
  backend->copy(updated.view(), state.view());
  const std::vector<float> before = values_of(state);
  TestTensor out_read_only(DType::F32, tokens, 32), out_updating(DType::F32, tokens, 32);
  backend->gated_delta_rule(out_read_only.view(), qkv.view(), beta.view(), g.view(), state.view(), shape,
                            false);
  backend->gated_delta_rule(out_updating.view(), qkv.view(), beta.view(), g.view(), updated.view(), shape,
                            true);
  EXPECT_EQ(values_of(state), before);
  EXPECT_NE(values_of(updated), before);
  EXPECT_EQ(values_of(out_read_only), values_of(out_updating));

  // A block of up to 16 tokens takes the per-token recurrence: the state equals 16 single-token calls.
  TestTensor stepped(DType::F32, 4 * 16, 8);
  backend->copy(stepped.view(), state.view());
  TestTensor step_out(DType::F32, 1, 32);
  for (int64_t t = 0; t < tokens; ++t)
    backend->gated_delta_rule(step_out.view(), qkv.view().rows_view(t, 1), beta.view().rows_view(t, 1),
                              g.view().rows_view(t, 1), stepped.view(), shape, true);
  EXPECT_EQ(values_of(stepped), values_of(updated));
  static_assert(cpu::kGdnRecurrentMaxTokens >= 16);
}

class SpeculativeRollback : public testing::TestWithParam<std::filesystem::path> {};

// One state runs 16-token verify steps and commits 1..16 of their rows (every accepted length 0..15 plus
// the bonus row); another feeds only the committed tokens, one at a time. After every step both hold the
// same bits, and the next token's logits are equal.
TEST_P(SpeculativeRollback, CommitEqualsARunWithoutTheRejectedTokens) {
  LoadedModel loaded = LoadedModel::open(GetParam().string(), "cpu");
  Qwen35Model& model = *loaded.model;
  Backend& backend = *loaded.backend;
  const int vocab = model.config().vocab_size;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  auto random_tokens = [&](size_t n) {
    std::vector<int32_t> ids(n);
    for (int32_t& id : ids) id = token(rng);
    return ids;
  };
  const int block = 16, context = 10 + 16 * block + 1;
  auto verified = model.new_state(context);
  auto plain = model.new_state(context);
  const std::vector<int32_t> prompt = random_tokens(10);
  model.forward(*verified, prompt, ForwardOptions{});
  model.forward(*plain, prompt, ForwardOptions{});
  ForwardOptions verify;
  verify.all_logits = true;
  verify.advance = false;
  for (int accepted = 0; accepted < block; ++accepted) {
    SCOPED_TRACE(testing::Message() << "accepted " << accepted);
    const std::vector<int32_t> rows = random_tokens(block);
    const std::vector<std::vector<float>> before = state_contents(backend, *verified);
    const int n_past = verified->n_past;
    model.forward(*verified, rows, verify);
    EXPECT_EQ(verified->n_past, n_past);
    EXPECT_EQ(state_contents(backend, *verified), before) << "the verify step changed the state";
    model.commit(*verified, accepted + 1);
    for (int t = 0; t <= accepted; ++t)
      model.forward(*plain, std::span<const int32_t>(&rows[size_t(t)], 1), ForwardOptions{});
    ASSERT_EQ(verified->n_past, plain->n_past);
    ASSERT_EQ(state_contents(backend, *verified), state_contents(backend, *plain));
  }
  const int32_t next = token(rng);
  const std::vector<float> verified_logits = read_floats(
      backend, model.forward(*verified, std::span<const int32_t>(&next, 1), ForwardOptions{}).logits);
  const std::vector<float> plain_logits = read_floats(
      backend, model.forward(*plain, std::span<const int32_t>(&next, 1), ForwardOptions{}).logits);
  EXPECT_EQ(verified_logits, plain_logits);
}

TEST_P(SpeculativeRollback, CommitRefusesMoreRowsThanPending) {
  LoadedModel loaded = LoadedModel::open(GetParam().string(), "cpu");
  Qwen35Model& model = *loaded.model;
  auto state = model.new_state(8);
  const std::vector<int32_t> rows = {1, 2, 3};
  ForwardOptions verify;
  verify.advance = false;
  model.forward(*state, rows, verify);
  EXPECT_THROW(model.commit(*state, 4), Error);
  model.commit(*state, 3);
  EXPECT_EQ(state->n_past, 3);
  EXPECT_THROW(model.commit(*state, 1), Error);  // nothing pending any more
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpeculativeRollback,
                         testing::ValuesIn(speculative_testing::target_fixture_dirs()),
                         [](const testing::TestParamInfo<std::filesystem::path>& param) {
                           return speculative_testing::fixture_test_name(param.param);
                         });

}  // namespace
}  // namespace qspec
