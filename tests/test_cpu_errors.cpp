// Bad arguments to CPU ops: each gets one qspec::Error naming the op, the argument and what was expected.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/gated_delta_rule.h"
#include "cpu_op_testing.h"
#include "io/safetensors.h"

namespace qspec {
namespace {

using cpu_test::expect_error;
using cpu_test::TestTensor;

class CpuErrors : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend();
  TestTensor f32(int64_t rows, int64_t cols) { return TestTensor(DType::F32, rows, cols); }
};

TEST_F(CpuErrors, Linear) {
  TestTensor x = f32(2, 16), out = f32(2, 4), w = TestTensor(DType::BF16, 4, 16);
  TestTensor x_bf16(DType::BF16, 2, 16), w_i32(DType::I32, 4, 16);
  expect_error(
      [&] {
        backend->linear(out.view(), x.view(), {4, 24, w.view(), {}, {}, 0, {}});
      },
      {"linear", "16 columns", "in_features 24"});
  expect_error(
      [&] {
        backend->linear(f32(3, 4).view(), x.view(), {4, 16, w.view(), {}, {}, 0, {}});
      },
      {"linear", "out", "[3, 4]", "[2, 4]"});
  expect_error(
      [&] {
        backend->linear(out.view(), x_bf16.view(), {4, 16, w.view(), {}, {}, 0, {}});
      },
      {"linear", "x must be F32, got BF16"});
  expect_error(
      [&] {
        backend->linear(out.view(), x.view(), {4, 16, w_i32.view(), {}, {}, 0, {}});
      },
      {"linear", "weight", "BF16, F16 or F32, got I32"});
  expect_error(
      [&] {
        backend->linear(out.view(), x.view(), {4, 16, w.view().rows_view(0, 3), {}, {}, 0, {}});
      },
      {"linear", "weight", "[3, 16]", "[4, 16]"});
}

// The gated MLP's down projection: gate_up twice the weight's in_features wide, act shaped [T, I] and apart
// from gate_up and out, out apart from gate_up (a one-row CUDA kernel reads gate_up while others write out).
TEST_F(CpuErrors, SiluGatedLinear) {
  TestTensor out = f32(2, 16), gate_up = f32(2, 16), act = f32(2, 8), w_down(DType::BF16, 16, 8);
  const LinearWeight down{16, 8, w_down.view(), {}, {}, 0, {}};
  expect_error([&] { backend->silu_gated_linear(out.view(), f32(2, 12).view(), act.view(), down); },
               {"silu_gated_linear", "gate_up", "[2, 12]", "[2, 16]"});
  expect_error([&] { backend->silu_gated_linear(out.view(), gate_up.view(), f32(2, 7).view(), down); },
               {"silu_gated_linear", "act", "[2, 7]", "[2, 8]"});
  expect_error(
      [&] { backend->silu_gated_linear(out.view(), gate_up.view(), gate_up.view().cols_view(8, 8), down); },
      {"silu_gated_linear", "act must not overlap gate_up or out"});
  expect_error([&] { backend->silu_gated_linear(f32(2, 5).view(), gate_up.view(), act.view(), down); },
               {"linear", "out", "[2, 5]", "[2, 16]"});
  TestTensor wide = f32(2, 32);
  expect_error(
      [&] {
        backend->silu_gated_linear(wide.view().cols_view(8, 16), wide.view().cols_view(0, 16), act.view(),
                                   down);
      },
      {"silu_gated_linear", "out must not overlap gate_up"});
}

// The gated attention's output projection: gate shaped as x, out as x W^T and apart from both.
TEST_F(CpuErrors, SigmoidGatedLinear) {
  TestTensor x = f32(2, 16), gate = f32(2, 16), out = f32(2, 4), w(DType::BF16, 4, 16);
  const LinearWeight weight{4, 16, w.view(), {}, {}, 0, {}};
  expect_error([&] { backend->sigmoid_gated_linear(out.view(), x.view(), f32(2, 15).view(), weight); },
               {"sigmoid_gated_linear", "gate", "[2, 15]", "[2, 16]"});
  expect_error([&] { backend->sigmoid_gated_linear(f32(2, 5).view(), x.view(), gate.view(), weight); },
               {"linear", "out", "[2, 5]", "[2, 4]"});
  expect_error(
      [&] { backend->sigmoid_gated_linear(x.view().cols_view(0, 4), x.view(), gate.view(), weight); },
      {"sigmoid_gated_linear", "out must not overlap x or gate"});
  expect_error(
      [&] { backend->sigmoid_gated_linear(gate.view().cols_view(4, 4), x.view(), gate.view(), weight); },
      {"sigmoid_gated_linear", "out must not overlap x or gate"});
}

TEST_F(CpuErrors, LinearW4A16) {
  TestTensor x = f32(2, 64), out = f32(2, 4);
  TestTensor packed(DType::I32, 4, 8), scales(DType::BF16, 4, 2), packed_f32 = f32(4, 8);
  expect_error(
      [&] {
        backend->linear(out.view(), x.view(), {4, 64, {}, packed.view(), scales.view(), 0, {}});
      },
      {"linear", "group_size"});
  expect_error(
      [&] {
        backend->linear(out.view(), x.view(), {4, 64, {}, packed.view(), scales.view(), 64, {}});
      },
      {"linear", "scales", "[4, 2]", "[4, 1]"});
  expect_error(
      [&] {
        backend->linear(out.view(), x.view(), {4, 64, {}, packed_f32.view(), scales.view(), 32, {}});
      },
      {"linear", "packed weight must be I32, got F32"});
  expect_error(
      [&] {
        backend->linear(out.view(), x.view(),
                        {4, 64, {}, packed.view().cols_view(0, 7), scales.view(), 32, {}});
      },
      {"linear", "packed weight", "[4, 7]", "[4, 8]"});
  TestTensor x_odd = f32(2, 60);
  expect_error(
      [&] {
        backend->linear(out.view(), x_odd.view(), {4, 60, {}, packed.view(), scales.view(), 30, {}});
      },
      {"linear", "in_features 60", "multiple of 8"});
}

TEST_F(CpuErrors, EmbedRejectsIdsOutsideVocabulary) {
  TestTensor table(DType::BF16, 50, 8), out = f32(2, 8);
  for (int32_t bad : {50, -1}) {
    TestTensor ids = cpu_test::index_tensor({3, bad});
    expect_error([&] { backend->embed(out.view(), table.view(), ids.view()); },
                 {"embed", "token id " + std::to_string(bad), "[0, 50)"});
  }
  TestTensor ids_f32 = f32(2, 1);
  expect_error([&] { backend->embed(out.view(), table.view(), ids_f32.view()); },
               {"embed", "ids must be I32, got F32"});
}

TEST_F(CpuErrors, KvStoreAndAttentionRejectPositionsOutsideCache) {
  TestTensor cache = f32(8, 16), x = f32(2, 16), q = f32(2, 32), out = f32(2, 32);
  TestTensor positions = cpu_test::index_tensor({7, 8});
  expect_error([&] { backend->kv_store(cache.view(), x.view(), positions.view()); },
               {"kv_store", "position 8", "8 rows"});
  const AttentionShape shape{2, 1, 16, 0.25f};
  expect_error(
      [&] { backend->attention(out.view(), q.view(), cache.view(), cache.view(), positions.view(), shape); },
      {"attention", "position 8", "8 rows"});
  TestTensor ok_positions = cpu_test::index_tensor({0, 1});
  expect_error(
      [&] {
        backend->attention(out.view(), q.view(), cache.view(), cache.view(), ok_positions.view(),
                           AttentionShape{3, 2, 16, 0.25f});
      },
      {"attention", "num_heads 3", "num_kv_heads 2"});
  expect_error(
      [&] {
        backend->attention(out.view(), q.view(), cache.view(), cache.view(), ok_positions.view(),
                           AttentionShape{2, 2, 16, 0.25f});
      },
      {"attention", "k_cache", "[8, 16]", "[8, 32]"});
}

TEST_F(CpuErrors, Norms) {
  TestTensor x = f32(2, 30), out = f32(2, 30), w = TestTensor(DType::F32, 1, 8);
  expect_error([&] { backend->rmsnorm(out.view(), x.view(), w.view(), 1e-6f, true); },
               {"rmsnorm", "30 columns", "multiple", "8"});
  TestTensor w2 = f32(2, 15);
  expect_error([&] { backend->rmsnorm(out.view(), x.view(), w2.view(), 1e-6f, true); },
               {"rmsnorm", "weight", "[2, 15]", "[1, group]"});
  TestTensor w15 = f32(1, 15), z = f32(3, 30);
  expect_error([&] { backend->gated_rmsnorm(out.view(), x.view(), w15.view(), z.view(), 1e-6f); },
               {"gated_rmsnorm", "z", "[3, 30]", "[2, 30]"});
}

// A sublayer's norm and its projections: delta shaped as x, each projection as linear checks it, and no
// output over an input or the normed rows.
TEST_F(CpuErrors, AddRmsnormLinear) {
  TestTensor x = f32(2, 16), delta = f32(2, 16), normed = f32(2, 16), out = f32(2, 4), norm = f32(1, 16);
  TestTensor w(DType::BF16, 4, 16);
  const LinearWeight weight{4, 16, w.view(), {}, {}, 0, {}};
  auto call = [&](const Tensor& projection_out, const Tensor& normed_rows, const Tensor& d) {
    const std::vector<LinearProjection> projections = {{projection_out, weight}};
    backend->add_rmsnorm_linear(projections, normed_rows, NormedRows::Scratch, x.view(), d, norm.view(),
                                1e-6f, true);
  };
  expect_error([&] { call(out.view(), normed.view(), f32(2, 15).view()); },
               {"add_rmsnorm_linear", "delta", "[2, 15]", "[2, 16]"});
  expect_error([&] { call(out.view(), x.view(), delta.view()); },
               {"add_rmsnorm_linear", "normed must not overlap x or delta"});
  expect_error([&] { call(f32(2, 5).view(), normed.view(), delta.view()); },
               {"linear", "out", "[2, 5]", "[2, 4]"});
  expect_error([&] { call(delta.view().cols_view(0, 4), normed.view(), delta.view()); },
               {"add_rmsnorm_linear", "projections[0].out overlaps normed, x or delta"});
}

TEST_F(CpuErrors, ElementwiseAndSplit) {
  TestTensor a = f32(2, 6), b = f32(2, 5), out = f32(2, 6);
  expect_error([&] { backend->add(out.view(), a.view(), b.view()); }, {"add", "b", "[2, 5]", "[2, 6]"});
  expect_error([&] { backend->silu_mul(out.view(), a.view(), b.view()); }, {"silu_mul", "up"});
  expect_error([&] { backend->sigmoid_mul(out.view(), a.view(), b.view()); }, {"sigmoid_mul", "gate"});
  TestTensor qg = f32(2, 12), query = f32(2, 6), gate = f32(2, 6);
  expect_error([&] { backend->split_query_gate(query.view(), gate.view(), qg.view(), 4); },
               {"split_query_gate", "12 columns", "2 * head_dim = 8"});
  Tensor bad_stride = a.view();
  bad_stride.stride = 3;
  expect_error([&] { backend->add(out.view(), bad_stride, a.view()); }, {"add", "stride 3", "6 columns"});
}

TEST_F(CpuErrors, Rope) {
  TestTensor x = f32(2, 32);
  TestTensor positions = cpu_test::index_tensor({0, 1});
  expect_error([&] { backend->rope(x.view(), positions.view(), 16, 18, 1e4); }, {"rope", "rotary_dim 18"});
  expect_error([&] { backend->rope(x.view(), positions.view(), 16, 7, 1e4); }, {"rope", "rotary_dim 7"});
  expect_error([&] { backend->rope(x.view(), positions.view(), 12, 8, 1e4); }, {"rope", "head_dim 12"});
  TestTensor three = cpu_test::index_tensor({0, 1, 2});
  expect_error([&] { backend->rope(x.view(), three.view(), 16, 8, 1e4); },
               {"rope", "positions", "[3, 1]", "[2, 1]"});
}

TEST_F(CpuErrors, Conv1dAndGates) {
  TestTensor x = f32(3, 8), out = f32(3, 8), state = f32(8, 3), w = TestTensor(DType::BF16, 8, 4);
  TestTensor short_state = f32(8, 2), w7 = TestTensor(DType::BF16, 7, 4);
  expect_error([&] { backend->conv1d_silu(out.view(), x.view(), short_state.view(), w.view(), true); },
               {"conv1d_silu", "state", "[8, 2]", "[8, 3]"});
  expect_error([&] { backend->conv1d_silu(out.view(), x.view(), state.view(), w7.view(), true); },
               {"conv1d_silu", "weight", "[7, 4]", "[8, 4]"});
  TestTensor b = f32(3, 4), a = f32(3, 4), beta = f32(3, 4), g = f32(3, 4), a_log = f32(1, 5),
             bias = f32(1, 4);
  expect_error(
      [&] { backend->gdn_gates(beta.view(), g.view(), b.view(), a.view(), a_log.view(), bias.view()); },
      {"gdn_gates", "a_log", "[1, 5]", "[1, 4]"});
  // gdn_gates_linear: a projection with other heads than beta / g, then the gates' own weights.
  TestTensor hidden = f32(3, 16), w_b = TestTensor(DType::BF16, 4, 16), w_a5 = TestTensor(DType::BF16, 5, 16);
  const LinearWeight b_weight{4, 16, w_b.view(), {}, {}, 0, {}}, a_weight{5, 16, w_a5.view(), {}, {}, 0, {}};
  expect_error(
      [&] {
        backend->gdn_gates_linear(beta.view(), g.view(), hidden.view(), b_weight, a_weight, bias.view(),
                                  bias.view());
      },
      {"linear", "out", "[3, 4]", "[3, 5]"});
  expect_error(
      [&] {
        backend->gdn_gates_linear(beta.view(), g.view(), hidden.view(), b_weight, b_weight, a_log.view(),
                                  bias.view());
      },
      {"gdn_gates", "a_log", "[1, 5]", "[1, 4]"});
}

TEST_F(CpuErrors, GatedDeltaRule) {
  const GdnShape shape{2, 4, 8, 4};
  TestTensor qkv = f32(3, 2 * 2 * 8 + 4 * 4), out = f32(3, 16), beta = f32(3, 4), g = f32(3, 4),
             state = f32(32, 4);
  expect_error(
      [&] {
        backend->gated_delta_rule(out.view(), qkv.view(), beta.view(), g.view(), state.view(), {3, 4, 8, 4},
                                  true);
      },
      {"gated_delta_rule", "num_key_heads 3", "num_value_heads 4"});
  TestTensor qkv_short = f32(3, 40);
  expect_error(
      [&] {
        backend->gated_delta_rule(out.view(), qkv_short.view(), beta.view(), g.view(), state.view(), shape,
                                  true);
      },
      {"gated_delta_rule", "qkv", "[3, 40]", "[3, 48]"});
  TestTensor small_state = f32(16, 4);
  expect_error(
      [&] {
        backend->gated_delta_rule(out.view(), qkv.view(), beta.view(), g.view(), small_state.view(), shape,
                                  true);
      },
      {"gated_delta_rule", "state", "[16, 4]", "[32, 4]"});
  expect_error(
      [&] {
        cpu::gated_delta_rule_chunked(out.view(), qkv.view(), beta.view(), g.view(), state.view(), shape, 0);
      },
      {"gated_delta_rule", "chunk size"});
}

// The GDN mixer: qkvz as wide as the conv channels plus z; the composed ops' own checks (a state of the
// wrong size, a norm weight that does not divide the output); outputs that share memory with each other or an
// input.
TEST_F(CpuErrors, GdnMixer) {
  const GdnShape shape{2, 4, 8, 4};  // C = 2 * 2 * 8 + 4 * 4 = 48, z 16
  TestTensor qkvz = f32(3, 64), x = f32(3, 16), out = f32(3, 16), conv_out = f32(3, 48), beta = f32(3, 4),
             g = f32(3, 4), core = f32(3, 16), conv_state = f32(48, 3), state = f32(32, 4);
  TestTensor conv_weight(DType::BF16, 48, 4), w_b(DType::BF16, 4, 16), a_log = f32(1, 4), norm = f32(1, 4);
  TestTensor norm_odd = f32(1, 3);
  const LinearWeight gate{4, 16, w_b.view(), {}, {}, 0, {}};
  auto mixer = [&](const Tensor& qkvz_view, const Tensor& state_view, const Tensor& norm_view) {
    backend->gdn_mixer(out.view(), conv_out.view(), beta.view(), g.view(), core.view(), qkvz_view, x.view(),
                       conv_state.view(), state_view,
                       {conv_weight.view(), gate, gate, a_log.view(), a_log.view(), norm_view}, shape, 1e-6f,
                       true);
  };
  expect_error([&] { mixer(qkvz.view().cols_view(0, 60), state.view(), norm.view()); },
               {"gdn_mixer", "qkvz", "[3, 60]", "[3, 64]"});
  expect_error([&] { mixer(qkvz.view(), f32(16, 4).view(), norm.view()); },
               {"gated_delta_rule", "state", "[16, 4]", "[32, 4]"});
  expect_error([&] { mixer(qkvz.view(), state.view(), norm_odd.view()); },
               {"gdn_mixer", "16 columns", "weight's 3"});
  const GdnMixerWeights weights{conv_weight.view(), gate, gate, a_log.view(), a_log.view(), norm.view()};
  expect_error(
      [&] {
        backend->gdn_mixer(core.view(), conv_out.view(), beta.view(), g.view(), core.view(), qkvz.view(),
                           x.view(), conv_state.view(), state.view(), weights, shape, 1e-6f, true);
      },
      {"gdn_mixer", "out and core overlap"});
  expect_error(
      [&] {
        backend->gdn_mixer(out.view(), qkvz.view().cols_view(0, 48), beta.view(), g.view(), core.view(),
                           qkvz.view(), x.view(), conv_state.view(), state.view(), weights, shape, 1e-6f,
                           true);
      },
      {"gdn_mixer", "conv_out overlaps the input qkvz"});
}

// The GDN mixer with its output projection: the mixer's checks (its out: gated), the projection's as linear
// checks them (its x: gated), and no projection output over one of the mixer's tensors.
TEST_F(CpuErrors, GdnMixerLinear) {
  const GdnShape shape{2, 4, 8, 4};  // C = 48, z 16
  TestTensor qkvz = f32(3, 64), x = f32(3, 16), gated = f32(3, 16), conv_out = f32(3, 48), beta = f32(3, 4),
             g = f32(3, 4), core = f32(3, 16), conv_state = f32(48, 3), state = f32(32, 4), out = f32(3, 8);
  TestTensor conv_weight(DType::BF16, 48, 4), w_b(DType::BF16, 4, 16), a_log = f32(1, 4), norm = f32(1, 4);
  TestTensor w_out(DType::BF16, 8, 16);
  const LinearWeight gate{4, 16, w_b.view(), {}, {}, 0, {}}, out_proj{8, 16, w_out.view(), {}, {}, 0, {}};
  const GdnMixerWeights weights{conv_weight.view(), gate, gate, a_log.view(), a_log.view(), norm.view()};
  auto call = [&](const Tensor& projection_out, const Tensor& gated_rows) {
    backend->gdn_mixer_linear({projection_out, out_proj}, gated_rows, conv_out.view(), beta.view(), g.view(),
                              core.view(), qkvz.view(), x.view(), conv_state.view(), state.view(), weights,
                              shape, 1e-6f, true);
  };
  expect_error([&] { call(out.view(), core.view()); }, {"gdn_mixer", "out and core overlap"});
  expect_error([&] { call(f32(3, 9).view(), gated.view()); }, {"linear", "out", "[3, 9]", "[3, 8]"});
  expect_error([&] { call(x.view().cols_view(0, 8), gated.view()); },
               {"gdn_mixer_linear", "projection.out overlaps x"});
  expect_error([&] { call(gated.view().cols_view(8, 8), gated.view()); },
               {"gdn_mixer_linear", "projection.out overlaps gated"});
  expect_error([&] { call(Tensor::make(DType::F32, 3, 8, state.view().data), gated.view()); },
               {"gdn_mixer_linear", "projection.out overlaps recurrent_state"});
}

TEST_F(CpuErrors, MemoryAndUpload) {
  auto buffer = backend->alloc(DType::F32, 2, 3);
  TestTensor strided(DType::F32, 2, 3, 4), other(DType::BF16, 2, 3);
  std::vector<float> host(6);
  expect_error([&] { backend->write(strided.view(), host.data()); }, {"write", "dst", "contiguous"});
  expect_error([&] { backend->copy(buffer->tensor(), other.view()); }, {"copy", "F32", "BF16"});
  std::vector<uint16_t> bytes(12);
  const std::string file = "model.safetensors";
  TensorView view{
      "layers.0.weight", DType::BF16, {3, 4}, reinterpret_cast<const uint8_t*>(bytes.data()), 24, &file};
  expect_error([&] { backend->upload_weight(view, 4, 4); },
               {"upload_weight", "layers.0.weight", "[3, 4]", "[4, 4]"});
  EXPECT_EQ(backend->upload_weight(view, 12, 1).rows, 12);
}

}  // namespace
}  // namespace qspec
