// CPU ops of the Gated DeltaNet layer: conv1d_silu with its rolling state, gdn_gates (and gdn_gates_linear),
// and the gated delta rule in both forms (recurrent vs a naive double transcription; chunked vs recurrent;
// split prefills).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "backend/cpu/gated_delta_rule.h"
#include "cpu_op_testing.h"

namespace qspec {
namespace {

using cpu_test::Reference;
using cpu_test::silu;
using cpu_test::TestTensor;

// ---- conv1d_silu

// Channel c's input sequence is state[c] (K-1 older inputs) followed by x[:, c].
Reference reference_conv(const TestTensor& x, const TestTensor& state, const TestTensor& w,
                         Reference& new_state) {
  const int64_t kernel = w.cols(), history = kernel - 1;
  Reference out(x.rows(), x.cols());
  for (int64_t c = 0; c < x.cols(); ++c) {
    std::vector<double> in;
    for (int64_t j = 0; j < history; ++j) in.push_back(state.get(c, j));
    for (int64_t t = 0; t < x.rows(); ++t) in.push_back(x.get(t, c));
    for (int64_t t = 0; t < x.rows(); ++t) {
      double sum = 0;
      for (int64_t j = 0; j < kernel; ++j) sum += w.get(c, j) * in[t + j];
      out.at(t, c) = silu(sum);
    }
    for (int64_t j = 0; j < history; ++j) new_state.at(c, j) = in[in.size() - history + j];
  }
  return out;
}

// Error measure: max |got - want| / max |want| <= 1e-5 for outputs; the new state is a copy, so exact.
TEST(CpuConv1d, MatchesReferenceAndUpdatesState) {
  std::mt19937 rng(21);
  auto backend = make_cpu_backend();
  const int64_t channels = 10;
  for (int64_t kernel : {2, 4})
    for (int64_t tokens : {1, 2, 3, 63, 64, 65}) {
      SCOPED_TRACE(::testing::Message() << "K " << kernel << " T " << tokens);
      TestTensor x = cpu_test::random_tensor(rng, DType::F32, tokens, channels, -2, 2, channels + 3);
      TestTensor state = cpu_test::random_tensor(rng, DType::F32, channels, kernel - 1, -2, 2);
      TestTensor w = cpu_test::random_tensor(rng, DType::BF16, channels, kernel);
      TestTensor out(DType::F32, tokens, channels);
      Reference want_state(channels, kernel - 1);
      Reference want = reference_conv(x, state, w, want_state);
      backend->conv1d_silu(out.view(), x.view(), state.view(), w.view(), true);
      EXPECT_LE(cpu_test::relative_max_error(out, want), 1e-5);
      EXPECT_EQ(cpu_test::relative_max_error(state, want_state), 0.0);
    }
}

TEST(CpuConv1d, TokensAtOnceEqualOneByOneAndInPlace) {
  std::mt19937 rng(22);
  auto backend = make_cpu_backend();
  const int64_t tokens = 9, channels = 7, kernel = 4;
  TestTensor x = cpu_test::random_tensor(rng, DType::F32, tokens, channels, -2, 2);
  TestTensor w = cpu_test::random_tensor(rng, DType::F32, channels, kernel);
  TestTensor state_all = cpu_test::random_tensor(rng, DType::F32, channels, kernel - 1);
  TestTensor state_steps(DType::F32, channels, kernel - 1);
  backend->copy(state_steps.view(), state_all.view());
  TestTensor all(DType::F32, tokens, channels), steps(DType::F32, tokens, channels);
  backend->conv1d_silu(all.view(), x.view(), state_all.view(), w.view(), true);
  for (int64_t t = 0; t < tokens; ++t)
    backend->conv1d_silu(steps.view().rows_view(t, 1), x.view().rows_view(t, 1), state_steps.view(), w.view(),
                         true);
  EXPECT_EQ(cpu_test::relative_max_error(steps, cpu_test::reference_of(all)), 0.0);
  EXPECT_EQ(cpu_test::relative_max_error(state_steps, cpu_test::reference_of(state_all)), 0.0);
  // out aliasing x: same values as the out-of-place run from the same starting state.
  TestTensor state_in_place(DType::F32, channels, kernel - 1);
  backend->copy(state_in_place.view(), state_all.view());
  backend->copy(state_all.view(), state_steps.view());  // state after the sequence, for the next comparison
  TestTensor next = cpu_test::random_tensor(rng, DType::F32, 3, channels, -2, 2);
  TestTensor next_out(DType::F32, 3, channels);
  backend->conv1d_silu(next_out.view(), next.view(), state_all.view(), w.view(), true);
  backend->conv1d_silu(next.view(), next.view(), state_in_place.view(), w.view(), true);
  EXPECT_EQ(cpu_test::relative_max_error(next, cpu_test::reference_of(next_out)), 0.0);
}

// ---- gdn_gates

double softplus(double x) {
  return x > 20 ? x : std::log1p(std::exp(x));
}

// Error measure: per element |got - want| <= 1e-5 |want| + 1e-7. a + dt_bias spans both sides of the softplus
// threshold (20), including values whose exp overflows fp32 (100, 1000).
TEST(CpuGdnGates, SigmoidAndSoftplusDecay) {
  std::mt19937 rng(23);
  auto backend = make_cpu_backend();
  const int64_t heads = 6;
  const std::vector<double> a_values = {-30, -2, 0.3, 19.5, 25, 100, 1000};
  const auto tokens = static_cast<int64_t>(a_values.size());
  // b and a as column views of one fused projection output [T, 2 * heads + 1] (strided inputs).
  TestTensor ba = cpu_test::random_tensor(rng, DType::F32, tokens, 2 * heads + 1, -5, 5);
  const Tensor b = ba.view().cols_view(0, heads), a = ba.view().cols_view(heads, heads);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h)
      a.row<float>(t)[h] = static_cast<float>(a_values[t] + 0.1 * static_cast<double>(h));
  TestTensor a_log = cpu_test::random_tensor(rng, DType::F32, 1, heads, -3, 1);
  TestTensor dt_bias = cpu_test::random_tensor(rng, DType::BF16, 1, heads, -1, 1);
  TestTensor beta(DType::F32, tokens, heads), g(DType::F32, tokens, heads);
  backend->gdn_gates(beta.view(), g.view(), b, a, a_log.view(), dt_bias.view());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const double b_value = b.row<float>(t)[h], a_value = a.row<float>(t)[h];
      const double want_beta = 1 / (1 + std::exp(-b_value));
      const double want_g = -std::exp(a_log.get(0, h)) * softplus(a_value + dt_bias.get(0, h));
      EXPECT_NEAR(beta.get(t, h), want_beta, 1e-5 * std::abs(want_beta) + 1e-7) << "t " << t << " h " << h;
      EXPECT_NEAR(g.get(t, h), want_g, 1e-5 * std::abs(want_g) + 1e-7) << "t " << t << " h " << h;
    }
}

// gdn_gates_linear is the projections then the gates, bit for bit; gdn_gates in place (beta = b, g = a) gives
// what it gives out of place. Error measure: exact.
TEST(CpuGdnGates, LinearFormIsProjectionsThenGates) {
  std::mt19937 rng(29);
  auto backend = make_cpu_backend();
  const int64_t heads = 5, hidden = 72, tokens = 3;
  TestTensor x = cpu_test::random_tensor(rng, DType::F32, tokens, hidden, -1, 1);
  TestTensor w_b = cpu_test::random_tensor(rng, DType::BF16, heads, hidden, -0.3, 0.3);
  TestTensor w_a = cpu_test::random_tensor(rng, DType::BF16, heads, hidden, -0.3, 0.3);
  const LinearWeight b_weight{heads, hidden, w_b.view(), {}, {}, 0, {}};
  const LinearWeight a_weight{heads, hidden, w_a.view(), {}, {}, 0, {}};
  TestTensor a_log = cpu_test::random_tensor(rng, DType::F32, 1, heads, -3, 1);
  TestTensor dt_bias = cpu_test::random_tensor(rng, DType::BF16, 1, heads, -1, 1);

  TestTensor b(DType::F32, tokens, heads), a(DType::F32, tokens, heads);
  backend->linear(b.view(), x.view(), b_weight);
  backend->linear(a.view(), x.view(), a_weight);
  TestTensor want_beta(DType::F32, tokens, heads), want_g(DType::F32, tokens, heads);
  backend->gdn_gates(want_beta.view(), want_g.view(), b.view(), a.view(), a_log.view(), dt_bias.view());

  TestTensor beta(DType::F32, tokens, heads), g(DType::F32, tokens, heads);
  backend->gdn_gates_linear(beta.view(), g.view(), x.view(), b_weight, a_weight, a_log.view(),
                            dt_bias.view());
  backend->gdn_gates(b.view(), a.view(), b.view(), a.view(), a_log.view(), dt_bias.view());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      EXPECT_EQ(beta.get(t, h), want_beta.get(t, h)) << "t " << t << " h " << h;
      EXPECT_EQ(g.get(t, h), want_g.get(t, h)) << "t " << t << " h " << h;
      EXPECT_EQ(b.get(t, h), want_beta.get(t, h)) << "in place, t " << t << " h " << h;
      EXPECT_EQ(a.get(t, h), want_g.get(t, h)) << "in place, t " << t << " h " << h;
    }
}

// ---- gated delta rule

struct GdnProblem {
  GdnShape shape;
  TestTensor qkv, beta, g, state;

  GdnProblem(std::mt19937& rng, const GdnShape& s, int64_t tokens, int64_t qkv_stride = 0)
      : shape(s),
        qkv(cpu_test::random_tensor(
            rng, DType::F32, tokens,
            2 * int64_t{s.num_key_heads} * s.key_head_dim + int64_t{s.num_value_heads} * s.value_head_dim, -1,
            1, qkv_stride)),
        beta(cpu_test::random_tensor(rng, DType::F32, tokens, s.num_value_heads, 0.01, 0.99)),
        g(cpu_test::random_tensor(rng, DType::F32, tokens, s.num_value_heads, -1.5, 0)),
        state(cpu_test::random_tensor(rng, DType::F32, int64_t{s.num_value_heads} * s.key_head_dim,
                                      s.value_head_dim, -0.5, 0.5)) {}

  int64_t tokens() const { return qkv.rows(); }
  int64_t out_cols() const { return int64_t{shape.num_value_heads} * shape.value_head_dim; }
  // A fresh copy of the initial state.
  TestTensor state_copy() const {
    TestTensor copy(DType::F32, state.rows(), state.cols());
    make_cpu_backend()->copy(copy.view(), state.view());
    return copy;
  }
  // Rows [first, first + count) of the per-token inputs.
  Tensor qkv_rows(int64_t first, int64_t count) const { return qkv.view().rows_view(first, count); }
  Tensor beta_rows(int64_t first, int64_t count) const { return beta.view().rows_view(first, count); }
  Tensor g_rows(int64_t first, int64_t count) const { return g.view().rows_view(first, count); }
};

// The per-token formula in double, written from the model description: for value head h (key head
// h / (nv / nk)), q and k L2-normalised with eps 1e-6 and q scaled by dk^-0.5,
//   S *= exp(g) ; delta = beta (v - S^T k) ; S += k delta^T ; o = S^T q.
Reference naive_gated_delta_rule(const GdnProblem& p, Reference& state) {
  const auto& [nk, nv, dk, dv] = p.shape;
  Reference out(p.tokens(), p.out_cols());
  for (int h = 0; h < nv; ++h) {
    const int kh = h / (nv / nk);
    for (int64_t t = 0; t < p.tokens(); ++t) {
      std::vector<double> q(dk), k(dk), v(dv);
      double q_norm = 0, k_norm = 0;
      for (int i = 0; i < dk; ++i) {
        q[i] = p.qkv.get(t, kh * dk + i);
        k[i] = p.qkv.get(t, int64_t{nk} * dk + kh * dk + i);
        q_norm += q[i] * q[i];
        k_norm += k[i] * k[i];
      }
      for (int i = 0; i < dk; ++i) {
        q[i] = q[i] / std::sqrt(q_norm + 1e-6) / std::sqrt(double(dk));
        k[i] = k[i] / std::sqrt(k_norm + 1e-6);
      }
      for (int j = 0; j < dv; ++j) v[j] = p.qkv.get(t, 2 * int64_t{nk} * dk + h * dv + j);
      const double decay = std::exp(p.g.get(t, h)), beta = p.beta.get(t, h);
      auto s = [&](int i, int j) -> double& { return state.at(int64_t{h} * dk + i, j); };
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) s(i, j) *= decay;
      for (int j = 0; j < dv; ++j) {
        double prediction = 0;
        for (int i = 0; i < dk; ++i) prediction += s(i, j) * k[i];
        const double delta = beta * (v[j] - prediction);
        for (int i = 0; i < dk; ++i) s(i, j) += k[i] * delta;
      }
      for (int j = 0; j < dv; ++j) {
        double o = 0;
        for (int i = 0; i < dk; ++i) o += s(i, j) * q[i];
        out.at(t, h * dv + j) = o;
      }
    }
  }
  return out;
}

const GdnShape kGroupedShape{2, 4, 32, 16};  // two value heads per key head: grouped != tiled mapping

// Error measure: max |got - want| / max |want| <= 1e-5, for the outputs and for the final state.
TEST(CpuGatedDeltaRule, RecurrentMatchesNaiveDoubleFormula) {
  std::mt19937 rng(31);
  for (int64_t tokens : {1, 3, 63, 64, 65, 130}) {
    SCOPED_TRACE(::testing::Message() << "T " << tokens);
    GdnProblem p(rng, kGroupedShape, tokens, 200);
    Reference want_state = cpu_test::reference_of(p.state);
    Reference want = naive_gated_delta_rule(p, want_state);
    TestTensor out(DType::F32, tokens, p.out_cols());
    TestTensor state = p.state_copy();
    cpu::gated_delta_rule_recurrent(out.view(), p.qkv.view(), p.beta.view(), p.g.view(), state.view(),
                                    p.shape);
    EXPECT_LE(cpu_test::relative_max_error(out, want), 1e-5);
    EXPECT_LE(cpu_test::relative_max_error(state, want_state), 1e-5);
  }
}

// Error measure: max |chunked - recurrent| / max |recurrent| <= 1e-5 for outputs and final state, every T in
// 1..200 (one, several and partial chunks of 64), from a random non-zero initial state.
TEST(CpuGatedDeltaRule, ChunkedMatchesRecurrentForEveryLength) {
  std::mt19937 rng(32);
  const GdnShape shape{2, 4, 32, 16};
  for (int64_t tokens = 1; tokens <= 200; ++tokens) {
    SCOPED_TRACE(::testing::Message() << "T " << tokens);
    GdnProblem p(rng, shape, tokens);
    TestTensor out_recurrent(DType::F32, tokens, p.out_cols()), out_chunked(DType::F32, tokens, p.out_cols());
    TestTensor state_recurrent = p.state_copy(), state_chunked = p.state_copy();
    cpu::gated_delta_rule_recurrent(out_recurrent.view(), p.qkv.view(), p.beta.view(), p.g.view(),
                                    state_recurrent.view(), shape);
    cpu::gated_delta_rule_chunked(out_chunked.view(), p.qkv.view(), p.beta.view(), p.g.view(),
                                  state_chunked.view(), shape);
    ASSERT_LE(cpu_test::relative_max_error(out_chunked, cpu_test::reference_of(out_recurrent)), 1e-5);
    ASSERT_LE(cpu_test::relative_max_error(state_chunked, cpu_test::reference_of(state_recurrent)), 1e-5);
  }
}

// The backend op over a sequence split across calls (prefill 100, then 65 more at once; or prefill 100, then
// one token at a time) equals one call over all 165 tokens. Error measure as above, <= 1e-5.
TEST(CpuGatedDeltaRule, SplitAcrossCallsEqualsAllAtOnce) {
  std::mt19937 rng(33);
  auto backend = make_cpu_backend();
  GdnProblem p(rng, kGroupedShape, 165);
  TestTensor out_all(DType::F32, 165, p.out_cols());
  TestTensor state_all = p.state_copy();
  backend->gated_delta_rule(out_all.view(), p.qkv.view(), p.beta.view(), p.g.view(), state_all.view(),
                            p.shape, true);
  for (bool token_by_token : {false, true}) {
    SCOPED_TRACE(token_by_token ? "prefill 100 then 65 single tokens" : "prefill 100 then 65 at once");
    TestTensor out(DType::F32, 165, p.out_cols());
    TestTensor state = p.state_copy();
    auto run = [&](int64_t first, int64_t count) {
      backend->gated_delta_rule(out.view().rows_view(first, count), p.qkv_rows(first, count),
                                p.beta_rows(first, count), p.g_rows(first, count), state.view(), p.shape,
                                true);
    };
    run(0, 100);
    if (token_by_token)
      for (int64_t t = 100; t < 165; ++t) run(t, 1);
    else
      run(100, 65);
    EXPECT_LE(cpu_test::relative_max_error(out, cpu_test::reference_of(out_all)), 1e-5);
    EXPECT_LE(cpu_test::relative_max_error(state, cpu_test::reference_of(state_all)), 1e-5);
  }
}

// A verify step's record of a problem's rows (GdnReplayRows), NaN until written; `pad` columns past each
// row make strided views.
struct GdnRecord {
  TestTensor keys, decays, deltas;

  GdnRecord(const GdnShape& s, int64_t tokens, int64_t pad = 0)
      : keys(DType::F32, tokens, int64_t{s.num_key_heads} * s.key_head_dim,
             pad ? int64_t{s.num_key_heads} * s.key_head_dim + pad : 0),
        decays(DType::F32, tokens, s.num_value_heads, pad ? s.num_value_heads + pad : 0),
        deltas(DType::F32, tokens, int64_t{s.num_value_heads} * s.value_head_dim,
               pad ? int64_t{s.num_value_heads} * s.value_head_dim + pad : 0) {}

  GdnReplayRows rows(int64_t count) const {
    return GdnReplayRows{keys.view(), decays.view(), deltas.view()}.rows_view(0, count);
  }
};

// The record gated_delta_rule keeps of p's rows without advancing p's state (checked unchanged).
GdnRecord verify_record(Backend& backend, const GdnProblem& p, int64_t pad = 0) {
  GdnRecord record(p.shape, p.tokens(), pad);
  TestTensor out(DType::F32, p.tokens(), p.out_cols()), state = p.state_copy();
  backend.gated_delta_rule(out.view(), p.qkv.view(), p.beta.view(), p.g.view(), state.view(), p.shape,
                           GdnStateUpdate(record.rows(p.tokens())));
  EXPECT_EQ(cpu_test::relative_max_error(state, cpu_test::reference_of(p.state)), 0.0);
  return record;
}

// The record holds what the recurrence used: the L2-normalised keys (against the double formula), the
// decays exp(g) and deltas that replay (S = decay S; S += k delta^T, in double) to the state of the
// recurrence that advances.
TEST(CpuGdnReplay, RecordHoldsKeysDecaysAndDeltas) {
  std::mt19937 rng(33);
  auto backend = make_cpu_backend();
  const GdnProblem p(rng, kGroupedShape, 7);
  const GdnRecord record = verify_record(*backend, p);
  const auto& [nk, nv, dk, dv] = p.shape;
  TestTensor advanced = p.state_copy(), out(DType::F32, p.tokens(), p.out_cols());
  backend->gated_delta_rule(out.view(), p.qkv.view(), p.beta.view(), p.g.view(), advanced.view(), p.shape,
                            true);
  Reference replayed = cpu_test::reference_of(p.state);
  double worst_key = 0, worst_decay = 0;
  const auto worse = [](double worst, double error) {  // NaN (an entry never written) counts as infinite
    return std::isnan(error) ? std::numeric_limits<double>::infinity() : std::max(worst, error);
  };
  for (int64_t t = 0; t < p.tokens(); ++t) {
    for (int kh = 0; kh < nk; ++kh) {
      double norm = 0;
      for (int i = 0; i < dk; ++i) norm += std::pow(p.qkv.get(t, int64_t{nk} * dk + kh * dk + i), 2);
      for (int i = 0; i < dk; ++i) {
        const double expected = p.qkv.get(t, int64_t{nk} * dk + kh * dk + i) / std::sqrt(norm + 1e-6);
        worst_key = worse(worst_key, std::abs(record.keys.get(t, kh * dk + i) - expected));
      }
    }
    for (int h = 0; h < nv; ++h) {
      const double decay = record.decays.get(t, h);
      worst_decay = worse(worst_decay, std::abs(decay - std::exp(p.g.get(t, h))));
      for (int i = 0; i < dk; ++i)
        for (int j = 0; j < dv; ++j) {
          double& s = replayed.at(h * dk + i, j);
          s = s * decay + record.keys.get(t, (h / (nv / nk)) * dk + i) * record.deltas.get(t, h * dv + j);
        }
    }
  }
  EXPECT_LE(worst_key, 1e-6);
  EXPECT_LE(worst_decay, 1e-6);
  EXPECT_LE(cpu_test::relative_max_error(advanced, replayed), 1e-5);
}

// gdn_commit over two layers (strided conv inputs, as the model's pending rows are; one layer's record
// strided too) equals, per layer,
// conv1d_silu and gated_delta_rule with update_state, bit for bit: the replay of the verify record makes the
// recurrence's state. A record past a verify block (16 rows) is refused.
TEST(CpuGdnCommit, EqualsConvAndRecurrenceWithStateUpdate) {
  std::mt19937 rng(34);
  auto backend = make_cpu_backend();
  constexpr int64_t kKernel = 4, kLayers = 2;
  for (int64_t tokens : {1, 2, 3, 16}) {
    SCOPED_TRACE(::testing::Message() << "T " << tokens);
    std::vector<GdnProblem> problems;
    std::vector<GdnRecord> records;
    std::vector<TestTensor> conv_inputs, conv_weights, conv_states, commit_conv_states, commit_states;
    std::vector<GdnCommitLayer> layers;
    for (int64_t i = 0; i < kLayers; ++i) {
      const GdnProblem& p = problems.emplace_back(rng, kGroupedShape, tokens);
      records.push_back(verify_record(*backend, p, i % 2 == 1 ? 3 : 0));  // layer 1: strided record rows
      const int64_t channels = p.qkv.cols();
      conv_inputs.push_back(cpu_test::random_tensor(rng, DType::F32, tokens, channels, -1, 1, channels + 5));
      conv_weights.push_back(cpu_test::random_tensor(rng, DType::F32, channels, kKernel, -0.5, 0.5));
      conv_states.push_back(cpu_test::random_tensor(rng, DType::F32, channels, kKernel - 1, -1, 1));
      commit_conv_states.push_back(cpu_test::random_tensor(rng, DType::F32, channels, kKernel - 1));
      backend->copy(commit_conv_states.back().view(), conv_states.back().view());
      commit_states.push_back(p.state_copy());
    }
    for (int64_t i = 0; i < kLayers; ++i)
      layers.push_back({commit_conv_states[i].view(), conv_inputs[i].view(), commit_states[i].view(),
                        records[i].rows(tokens)});
    backend->gdn_commit(layers, kGroupedShape, Tensor{});
    for (int64_t i = 0; i < kLayers; ++i) {
      const GdnProblem& p = problems[i];
      TestTensor conv_out(DType::F32, tokens, p.qkv.cols()), out(DType::F32, tokens, p.out_cols());
      TestTensor state = p.state_copy();
      backend->conv1d_silu(conv_out.view(), conv_inputs[i].view(), conv_states[i].view(),
                           conv_weights[i].view(), true);
      backend->gated_delta_rule(out.view(), p.qkv.view(), p.beta.view(), p.g.view(), state.view(), p.shape,
                                true);
      EXPECT_EQ(cpu_test::relative_max_error(commit_conv_states[i], cpu_test::reference_of(conv_states[i])),
                0.0);
      EXPECT_EQ(cpu_test::relative_max_error(commit_states[i], cpu_test::reference_of(state)), 0.0);
      EXPECT_GT(cpu_test::relative_max_error(commit_states[i], cpu_test::reference_of(p.state)), 0.0);
    }
  }
  const GdnProblem long_problem(rng, kGroupedShape, 17);
  const GdnRecord record(kGroupedShape, 17);
  TestTensor out(DType::F32, 17, long_problem.out_cols()), state = long_problem.state_copy();
  cpu_test::expect_error(
      [&] {
        backend->gated_delta_rule(out.view(), long_problem.qkv.view(), long_problem.beta.view(),
                                  long_problem.g.view(), state.view(), kGroupedShape,
                                  GdnStateUpdate(record.rows(17)));
      },
      {"gated_delta_rule", "replay record of 17 rows", "at most 16"});
}

// A replay record of other rows than qkv's, a partial one, and one sharing memory with the output are
// refused before anything runs, naming the record's tensor; the state stays as it was.
TEST(CpuGdnReplay, RefusesBadRecords) {
  std::mt19937 rng(37);
  auto backend = make_cpu_backend();
  const GdnProblem p(rng, kGroupedShape, 4);
  TestTensor out(DType::F32, 4, p.out_cols()), state = p.state_copy();
  const GdnRecord record(kGroupedShape, 4);
  auto verify = [&](const GdnReplayRows& rows) {
    backend->gated_delta_rule(out.view(), p.qkv.view(), p.beta.view(), p.g.view(), state.view(), p.shape,
                              GdnStateUpdate(rows));
  };
  GdnReplayRows short_deltas = record.rows(4);
  short_deltas.deltas = record.deltas.view().rows_view(0, 3);
  cpu_test::expect_error([&] { verify(short_deltas); },
                         {"gated_delta_rule", "replay.deltas", "[3, 64]", "[4, 64]"});
  GdnReplayRows no_keys = record.rows(4);
  no_keys.keys = Tensor{};
  cpu_test::expect_error([&] { verify(no_keys); }, {"gated_delta_rule", "replay.keys"});
  GdnReplayRows into_out = record.rows(4);
  into_out.deltas = out.view();
  cpu_test::expect_error([&] { verify(into_out); }, {"gated_delta_rule", "replay.deltas overlaps out"});
  EXPECT_EQ(cpu_test::relative_max_error(state, cpu_test::reference_of(p.state)), 0.0);
}

// A count of rows in a tensor (as the model's recorded replays take it) accepts that prefix of the layer's
// rows: the states equal those of a commit given only those rows, and the recurrence's over only those rows,
// bit for bit, at every count 0..T. A count
// outside [0, T] or a count tensor of another shape is refused before any state changes.
TEST(CpuGdnCommit, RowCountAcceptsAPrefix) {
  std::mt19937 rng(36);
  auto backend = make_cpu_backend();
  constexpr int64_t kTokens = 5;
  const GdnProblem p(rng, kGroupedShape, kTokens);
  const int64_t channels = p.qkv.cols();
  const TestTensor conv_input = cpu_test::random_tensor(rng, DType::F32, kTokens, channels, -1, 1);
  const TestTensor conv_state = cpu_test::random_tensor(rng, DType::F32, channels, 3, -1, 1);
  const GdnRecord record = verify_record(*backend, p);
  auto layer_of = [&](const TestTensor& c, const TestTensor& s, int64_t rows) {
    return GdnCommitLayer{c.view(), conv_input.view().rows_view(0, rows), s.view(), record.rows(rows)};
  };
  auto copy_of = [&](const TestTensor& t) {
    TestTensor copy(DType::F32, t.rows(), t.cols());
    backend->copy(copy.view(), t.view());
    return copy;
  };
  TestTensor count(DType::I32, 1, 1);
  for (int rows = 0; rows <= kTokens; ++rows) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows);
    TestTensor counted_conv = copy_of(conv_state), counted = p.state_copy();
    TestTensor prefix_conv = copy_of(conv_state), prefix = p.state_copy();
    count.set(0, 0, rows);
    const GdnCommitLayer counted_layer = layer_of(counted_conv, counted, kTokens);
    const GdnCommitLayer prefix_layer = layer_of(prefix_conv, prefix, rows);
    backend->gdn_commit({&counted_layer, 1}, kGroupedShape, count.view());
    backend->gdn_commit({&prefix_layer, 1}, kGroupedShape, Tensor{});
    EXPECT_EQ(cpu_test::relative_max_error(counted_conv, cpu_test::reference_of(prefix_conv)), 0.0);
    EXPECT_EQ(cpu_test::relative_max_error(counted, cpu_test::reference_of(prefix)), 0.0);
    if (rows > 0) {
      EXPECT_GT(cpu_test::relative_max_error(counted, cpu_test::reference_of(p.state_copy())), 0.0);
    }
    // The prefix of the record advances the state as the recurrence over those rows alone does.
    TestTensor advanced = p.state_copy();
    if (rows > 0) {
      TestTensor out(DType::F32, rows, p.out_cols());
      backend->gated_delta_rule(out.view(), p.qkv_rows(0, rows), p.beta_rows(0, rows), p.g_rows(0, rows),
                                advanced.view(), p.shape, true);
    }
    EXPECT_EQ(cpu_test::relative_max_error(counted, cpu_test::reference_of(advanced)), 0.0);
  }
  TestTensor conv = copy_of(conv_state), state = p.state_copy();
  const GdnCommitLayer layer = layer_of(conv, state, kTokens);
  auto commit_with = [&](const TestTensor& count_tensor) {
    backend->gdn_commit({&layer, 1}, kGroupedShape, count_tensor.view());
  };
  for (int bad : {-1, int{kTokens} + 1}) {
    count.set(0, 0, bad);
    cpu_test::expect_error([&] { commit_with(count); },
                           {"gdn_commit", fmt::format("rows[0] is {}", bad), "expected 0 to 5"});
  }
  EXPECT_EQ(cpu_test::relative_max_error(state, cpu_test::reference_of(p.state_copy())), 0.0);
  EXPECT_EQ(cpu_test::relative_max_error(conv, cpu_test::reference_of(conv_state)), 0.0);
  const TestTensor two_counts(DType::I32, 2, 1), float_count(DType::F32, 1, 1);
  cpu_test::expect_error([&] { commit_with(two_counts); }, {"gdn_commit", "rows", "[2, 1]", "[1, 1]"});
  cpu_test::expect_error([&] { commit_with(float_count); }, {"gdn_commit", "rows must be I32, got F32"});
}

// A layer whose inputs have another T than the first layer's is refused, naming the layer; so is a record of
// other rows than the conv inputs', and more rows than a verify block.
TEST(CpuGdnCommit, RefusesLayersOfDifferentLengths) {
  std::mt19937 rng(35);
  auto backend = make_cpu_backend();
  const GdnProblem first(rng, kGroupedShape, 3), second(rng, kGroupedShape, 2);
  TestTensor conv_state = cpu_test::random_tensor(rng, DType::F32, first.qkv.cols(), 3);
  TestTensor state_a = first.state_copy(), state_b = second.state_copy();
  const GdnRecord record_a = verify_record(*backend, first), record_b = verify_record(*backend, second);
  const std::vector<GdnCommitLayer> layers = {
      {conv_state.view(), first.qkv.view(), state_a.view(), record_a.rows(3)},
      {conv_state.view(), second.qkv.view(), state_b.view(), record_b.rows(2)}};
  cpu_test::expect_error([&] { backend->gdn_commit(layers, kGroupedShape, Tensor{}); },
                         {"gdn_commit", "layers[1].conv_input", "[2, 192]", "[3, 192]"});
  // A record of other rows than the conv inputs', naming the record's tensor.
  const std::vector<GdnCommitLayer> short_record = {
      {conv_state.view(), first.qkv.view(), state_a.view(), record_a.rows(2)}};
  cpu_test::expect_error([&] { backend->gdn_commit(short_record, kGroupedShape, Tensor{}); },
                         {"gdn_commit", "layers[0].replay.keys", "[2, 64]", "[3, 64]"});
  // More rows than a verify block.
  const GdnRecord long_record(kGroupedShape, 17);
  const TestTensor long_input(DType::F32, 17, first.qkv.cols());
  const std::vector<GdnCommitLayer> long_layers = {
      {conv_state.view(), long_input.view(), state_a.view(), long_record.rows(17)}};
  cpu_test::expect_error([&] { backend->gdn_commit(long_layers, kGroupedShape, Tensor{}); },
                         {"gdn_commit", "layers of 17 rows", "at most 16"});
}

}  // namespace
}  // namespace qspec
