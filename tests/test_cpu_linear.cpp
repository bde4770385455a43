// CPU linear: dense BF16/F16/F32 and W4A16 (compressed-tensors pack-quantized) weights against a double
// reference.
#include <gtest/gtest.h>

#include <random>
#include <string_view>
#include <vector>

#include "cpu_op_testing.h"

namespace qspec {
namespace {

using cpu_test::Reference;
using cpu_test::TestTensor;

struct LinearCase {
  int64_t tokens, in_features, out_features, x_stride;
};

// out[t][n] = sum_k x[t][k] * w(n, k) in double; bound[t][n] = sum_k |x w| (the scale of the fp32 rounding
// error).
template <typename WeightValue>
void reference_linear(const TestTensor& x, int64_t out_features, WeightValue w, Reference& out,
                      Reference& bound) {
  for (int64_t t = 0; t < x.rows(); ++t)
    for (int64_t n = 0; n < out_features; ++n) {
      double sum = 0, magnitude = 0;
      for (int64_t k = 0; k < x.cols(); ++k) {
        double term = x.get(t, k) * w(n, k);
        sum += term;
        magnitude += std::abs(term);
      }
      out.at(t, n) = sum;
      bound.at(t, n) = magnitude;
    }
}

// Error measure: per element |got - want| <= 1e-5 * sum_k |x_k w_k| (fp32 accumulation over K terms).
void expect_linear_close(const TestTensor& got, const Reference& want, const Reference& bound) {
  for (int64_t t = 0; t < want.rows; ++t)
    for (int64_t n = 0; n < want.cols; ++n)
      ASSERT_LE(std::abs(got.get(t, n) - want.at(t, n)), 1e-5 * bound.at(t, n)) << "t " << t << " n " << n;
}

class CpuLinearDense : public ::testing::TestWithParam<DType> {};

TEST_P(CpuLinearDense, MatchesDoubleReference) {
  std::mt19937 rng(7);
  auto backend = make_cpu_backend();
  for (LinearCase c : {LinearCase{1, 96, 40, 96}, LinearCase{3, 200, 33, 211}, LinearCase{63, 72, 9, 80},
                       LinearCase{65, 264, 17, 264}, LinearCase{130, 37, 5, 40}}) {
    SCOPED_TRACE(::testing::Message()
                 << "T " << c.tokens << " K " << c.in_features << " N " << c.out_features);
    TestTensor x = cpu_test::random_tensor(rng, DType::F32, c.tokens, c.in_features, -1, 1, c.x_stride);
    TestTensor w = cpu_test::random_tensor(rng, GetParam(), c.out_features, c.in_features);
    TestTensor out(DType::F32, c.tokens, c.out_features);
    LinearWeight weight{c.out_features, c.in_features, w.view(), {}, {}, 0, {}};
    backend->linear(out.view(), x.view(), weight);
    Reference want(c.tokens, c.out_features), bound(c.tokens, c.out_features);
    reference_linear(
        x, c.out_features, [&](int64_t n, int64_t k) { return w.get(n, k); }, want, bound);
    expect_linear_close(out, want, bound);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuLinearDense, ::testing::Values(DType::F32, DType::BF16, DType::F16));

// Packs 4-bit codes [N, K] the compressed-tensors way: word k/8, nibble k%8 (lowest first).
TestTensor pack_nibbles(const std::vector<std::vector<int>>& codes) {
  const auto rows = static_cast<int64_t>(codes.size());
  const auto cols = static_cast<int64_t>(codes[0].size());
  TestTensor packed(DType::I32, rows, cols / 8);
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t w = 0; w < cols / 8; ++w) {
      uint32_t word = 0;
      for (int64_t i = 0; i < 8; ++i) word |= static_cast<uint32_t>(codes[n][w * 8 + i]) << (4 * i);
      packed.view().row<uint32_t>(n)[w] = word;
    }
  return packed;
}

struct W4A16Case {
  int64_t tokens, in_features, out_features;
  int group_size;
  DType scale_dtype;
};

TEST(CpuLinear, W4A16MatchesDequantizedDoubleReference) {
  std::mt19937 rng(11);
  auto backend = make_cpu_backend();
  for (W4A16Case c : {W4A16Case{1, 96, 24, 32, DType::BF16}, W4A16Case{3, 384, 19, 128, DType::F16},
                      W4A16Case{64, 160, 40, 32, DType::F16}, W4A16Case{65, 640, 9, 128, DType::BF16},
                      W4A16Case{130, 200, 7, 40, DType::BF16}}) {
    SCOPED_TRACE(::testing::Message()
                 << "T " << c.tokens << " K " << c.in_features << " group " << c.group_size);
    std::uniform_int_distribution<int> nibble(0, 15);
    std::vector<std::vector<int>> codes(static_cast<size_t>(c.out_features),
                                        std::vector<int>(static_cast<size_t>(c.in_features)));
    for (auto& row : codes)
      for (int& code : row) code = nibble(rng);
    TestTensor packed = pack_nibbles(codes);
    TestTensor scales =
        cpu_test::random_tensor(rng, c.scale_dtype, c.out_features, c.in_features / c.group_size, -0.1, 0.1);
    TestTensor x =
        cpu_test::random_tensor(rng, DType::F32, c.tokens, c.in_features, -1, 1, c.in_features + 3);
    TestTensor out(DType::F32, c.tokens, c.out_features);
    LinearWeight weight{c.out_features, c.in_features, {}, packed.view(), scales.view(), c.group_size, {}};
    backend->linear(out.view(), x.view(), weight);
    Reference want(c.tokens, c.out_features), bound(c.tokens, c.out_features);
    auto dequantized = [&](int64_t n, int64_t k) {
      return (codes[n][k] - 8) * scales.get(n, k / c.group_size);
    };
    reference_linear(x, c.out_features, dequantized, want, bound);
    expect_linear_close(out, want, bound);
  }
}

// Pins the nibble order independently of the test's packer: word 0x76543210 holds codes 0..7 for k = 0..7.
TEST(CpuLinear, W4A16NibbleOrderIsLowestFirst) {
  auto backend = make_cpu_backend();
  TestTensor packed(DType::I32, 1, 1);
  packed.view().row<uint32_t>(0)[0] = 0x76543210u;
  TestTensor scales(DType::BF16, 1, 1);
  scales.set(0, 0, 1.0);
  for (int64_t k = 0; k < 8; ++k) {
    TestTensor x(DType::F32, 1, 8);
    for (int64_t i = 0; i < 8; ++i) x.set(0, i, i == k ? 1.0 : 0.0);
    TestTensor out(DType::F32, 1, 1);
    backend->linear(out.view(), x.view(), LinearWeight{1, 8, {}, packed.view(), scales.view(), 8, {}});
    EXPECT_EQ(out.get(0, 0), static_cast<double>(k) - 8.0) << "k " << k;
  }
}

TEST(CpuLinear, ResultDoesNotDependOnThreadSplit) {
  // The same output row computed alone and inside a batch must be bit-identical.
  std::mt19937 rng(3);
  auto backend = make_cpu_backend();
  TestTensor x = cpu_test::random_tensor(rng, DType::F32, 5, 300);
  TestTensor w = cpu_test::random_tensor(rng, DType::BF16, 70, 300);
  LinearWeight weight{70, 300, w.view(), {}, {}, 0, {}};
  TestTensor all(DType::F32, 5, 70), one(DType::F32, 1, 70);
  backend->linear(all.view(), x.view(), weight);
  backend->linear(one.view(), x.view().rows_view(3, 1), weight);
  for (int64_t n = 0; n < 70; ++n) EXPECT_EQ(all.get(3, n), one.get(0, n));
}

// A fused op's output against its ops' one by one: the same values, bit for bit (the first difference is
// named).
void expect_bitwise_equal(const TestTensor& fused, const TestTensor& ops, std::string_view what = "out") {
  for (int64_t t = 0; t < ops.rows(); ++t)
    for (int64_t n = 0; n < ops.cols(); ++n)
      if (fused.get(t, n) != ops.get(t, n)) {
        ADD_FAILURE() << what << " differs at (" << t << ", " << n << "): " << fused.get(t, n) << " vs "
                      << ops.get(t, n);
        return;
      }
}

// The gated attention's output projection (Backend::sigmoid_gated_linear) is sigmoid_mul then linear: the
// same values, bit for bit.
TEST(CpuLinear, SigmoidGatedLinearIsSigmoidMulThenLinear) {
  std::mt19937 rng(4);
  auto backend = make_cpu_backend();
  TestTensor x = cpu_test::random_tensor(rng, DType::F32, 3, 96),
             gate = cpu_test::random_tensor(rng, DType::F32, 3, 96);
  TestTensor w = cpu_test::random_tensor(rng, DType::BF16, 40, 96);
  const LinearWeight weight{40, 96, w.view(), {}, {}, 0, {}};
  TestTensor gated(DType::F32, 3, 96), fused(DType::F32, 3, 40), two_ops(DType::F32, 3, 40);
  backend->sigmoid_mul(gated.view(), x.view(), gate.view());
  backend->linear(two_ops.view(), gated.view(), weight);
  backend->sigmoid_gated_linear(fused.view(), x.view(), gate.view(), weight);
  expect_bitwise_equal(fused, two_ops);
}

// The gated MLP's down projection (Backend::silu_gated_linear) is silu_mul then linear: the same values, bit
// for bit.
TEST(CpuLinear, SiluGatedLinearIsSiluMulThenLinear) {
  std::mt19937 rng(5);
  auto backend = make_cpu_backend();
  TestTensor gate_up = cpu_test::random_tensor(rng, DType::F32, 3, 192);
  TestTensor w = cpu_test::random_tensor(rng, DType::BF16, 40, 96);
  const LinearWeight weight{40, 96, w.view(), {}, {}, 0, {}};
  TestTensor act(DType::F32, 3, 96), gated(DType::F32, 3, 96), fused(DType::F32, 3, 40),
      two_ops(DType::F32, 3, 40);
  backend->silu_mul(gated.view(), gate_up.view().cols_view(0, 96), gate_up.view().cols_view(96, 96));
  backend->linear(two_ops.view(), gated.view(), weight);
  backend->silu_gated_linear(fused.view(), gate_up.view(), act.view(), weight);
  expect_bitwise_equal(fused, two_ops);
}

// A sublayer's norm and its projections (Backend::add_rmsnorm_linear) are add_rmsnorm (rmsnorm when there is
// no delta) then linear per projection: the same values, bit for bit, the residual and the kept rows too.
TEST(CpuLinear, AddRmsnormLinearIsTheNormThenTheLinears) {
  std::mt19937 rng(6);
  auto backend = make_cpu_backend();
  const TestTensor norm = cpu_test::random_tensor(rng, DType::BF16, 1, 96, -0.5, 0.5);
  const TestTensor w_a = cpu_test::random_tensor(rng, DType::BF16, 40, 96),
                   w_b = cpu_test::random_tensor(rng, DType::F32, 8, 96);
  const LinearWeight a{40, 96, w_a.view(), {}, {}, 0, {}}, b{8, 96, w_b.view(), {}, {}, 0, {}};
  for (bool residual : {true, false}) {
    SCOPED_TRACE(residual ? "x += delta" : "no delta");
    TestTensor x = cpu_test::random_tensor(rng, DType::F32, 3, 96, -2, 2), x_ops(DType::F32, 3, 96);
    backend->copy(x_ops.view(), x.view());
    const TestTensor delta = cpu_test::random_tensor(rng, DType::F32, 3, 96);
    TestTensor normed(DType::F32, 3, 96), out_a(DType::F32, 3, 40), out_b(DType::F32, 3, 8);
    TestTensor normed_ops(DType::F32, 3, 96), ops_a(DType::F32, 3, 40), ops_b(DType::F32, 3, 8);
    const std::vector<LinearProjection> projections = {{out_a.view(), a}, {out_b.view(), b}};
    backend->add_rmsnorm_linear(projections, normed.view(), NormedRows::Kept, x.view(),
                                residual ? delta.view() : Tensor{}, norm.view(), 1e-6f, true);
    if (residual)
      backend->add_rmsnorm(normed_ops.view(), x_ops.view(), delta.view(), norm.view(), 1e-6f, true);
    else
      backend->rmsnorm(normed_ops.view(), x_ops.view(), norm.view(), 1e-6f, true);
    backend->linear(ops_a.view(), normed_ops.view(), a);
    backend->linear(ops_b.view(), normed_ops.view(), b);
    expect_bitwise_equal(x, x_ops, "x");
    expect_bitwise_equal(normed, normed_ops, "normed");
    expect_bitwise_equal(out_a, ops_a, "projection 0");
    expect_bitwise_equal(out_b, ops_b, "projection 1");
  }
}

// A GDN layer's mixer and its output projection (Backend::gdn_mixer_linear) are gdn_mixer into gated then
// linear: the same values, bit for bit, every output of the mixer and both states too.
TEST(CpuLinear, GdnMixerLinearIsTheMixerThenTheLinear) {
  std::mt19937 rng(7);
  auto backend = make_cpu_backend();
  const GdnShape shape{2, 4, 8, 4};  // conv channels 2 * 2 * 8 + 4 * 4 = 48, z 16
  constexpr int64_t kTokens = 5, kHidden = 24, kChannels = 48, kValues = 16;
  const TestTensor qkvz = cpu_test::random_tensor(rng, DType::F32, kTokens, kChannels + kValues),
                   x = cpu_test::random_tensor(rng, DType::F32, kTokens, kHidden);
  const TestTensor conv_weight = cpu_test::random_tensor(rng, DType::BF16, kChannels, 4, -0.5, 0.5),
                   w_b = cpu_test::random_tensor(rng, DType::BF16, 4, kHidden, -0.3, 0.3),
                   w_a = cpu_test::random_tensor(rng, DType::BF16, 4, kHidden, -0.3, 0.3),
                   a_log = cpu_test::random_tensor(rng, DType::F32, 1, 4, -3, 1),
                   dt_bias = cpu_test::random_tensor(rng, DType::BF16, 1, 4, -1, 1),
                   norm = cpu_test::random_tensor(rng, DType::BF16, 1, 4, 0.5, 1.5),
                   w_out = cpu_test::random_tensor(rng, DType::BF16, kHidden, kValues);
  const GdnMixerWeights weights{conv_weight.view(),
                                {4, kHidden, w_b.view(), {}, {}, 0, {}},
                                {4, kHidden, w_a.view(), {}, {}, 0, {}},
                                a_log.view(),
                                dt_bias.view(),
                                norm.view()};
  const LinearWeight out_proj{kHidden, kValues, w_out.view(), {}, {}, 0, {}};
  // One call's outputs and states (the states start alike).
  struct Run {
    TestTensor out{DType::F32, kTokens, kHidden}, gated{DType::F32, kTokens, kValues},
        conv_out{DType::F32, kTokens, kChannels}, beta{DType::F32, kTokens, 4}, g{DType::F32, kTokens, 4},
        core{DType::F32, kTokens, kValues}, conv_state{DType::F32, kChannels, 3}, state{DType::F32, 32, 4};
  };
  Run fused, ops;
  const TestTensor conv_state = cpu_test::random_tensor(rng, DType::F32, kChannels, 3),
                   state = cpu_test::random_tensor(rng, DType::F32, 32, 4, -0.5, 0.5);
  for (Run* run : {&fused, &ops}) {
    backend->copy(run->conv_state.view(), conv_state.view());
    backend->copy(run->state.view(), state.view());
  }
  backend->gdn_mixer_linear({fused.out.view(), out_proj}, fused.gated.view(), fused.conv_out.view(),
                            fused.beta.view(), fused.g.view(), fused.core.view(), qkvz.view(), x.view(),
                            fused.conv_state.view(), fused.state.view(), weights, shape, 1e-6f, true);
  backend->gdn_mixer(ops.gated.view(), ops.conv_out.view(), ops.beta.view(), ops.g.view(), ops.core.view(),
                     qkvz.view(), x.view(), ops.conv_state.view(), ops.state.view(), weights, shape, 1e-6f,
                     true);
  backend->linear(ops.out.view(), ops.gated.view(), out_proj);
  expect_bitwise_equal(fused.out, ops.out, "out");
  expect_bitwise_equal(fused.gated, ops.gated, "gated");
  expect_bitwise_equal(fused.conv_out, ops.conv_out, "conv_out");
  expect_bitwise_equal(fused.beta, ops.beta, "beta");
  expect_bitwise_equal(fused.g, ops.g, "g");
  expect_bitwise_equal(fused.core, ops.core, "core");
  expect_bitwise_equal(fused.conv_state, ops.conv_state, "conv state");
  expect_bitwise_equal(fused.state, ops.state, "recurrent state");
}

}  // namespace
}  // namespace qspec
