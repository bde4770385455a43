// CPU ops other than linear and the Gated DeltaNet family, each against a straightforward double reference:
// norms, elementwise ops, the query/gate split, rope, attention, embed and kv_store.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "cpu_op_testing.h"

namespace qspec {
namespace {

using cpu_test::Reference;
using cpu_test::sigmoid;
using cpu_test::silu;
using cpu_test::TestTensor;

// y = x / sqrt(mean over the group of x^2 + eps) * scale(i), per group of `group` columns.
template <typename Scale>
Reference reference_rmsnorm(const TestTensor& x, int64_t group, double eps, Scale scale) {
  Reference y(x.rows(), x.cols());
  for (int64_t t = 0; t < x.rows(); ++t)
    for (int64_t first = 0; first < x.cols(); first += group) {
      double sum = 0;
      for (int64_t i = 0; i < group; ++i) sum += x.get(t, first + i) * x.get(t, first + i);
      double inv = 1 / std::sqrt(sum / static_cast<double>(group) + eps);
      for (int64_t i = 0; i < group; ++i) y.at(t, first + i) = x.get(t, first + i) * inv * scale(t, first, i);
    }
  return y;
}

struct NormCase {
  int64_t tokens, cols, group, stride;
};

// Error measure for norms, elementwise ops and rope: max |got - want| / max |want| <= 1e-5.
constexpr double kTolerance = 1e-5;

TEST(CpuRmsnorm, BothOffsetsFullRowAndPerHead) {
  std::mt19937 rng(1);
  auto backend = make_cpu_backend();
  for (NormCase c : {NormCase{1, 64, 64, 64}, NormCase{3, 96, 32, 100}, NormCase{65, 6 * 17, 17, 6 * 17}})
    for (bool unit_offset : {false, true})
      for (DType weight_dtype : {DType::BF16, DType::F32}) {
        SCOPED_TRACE(::testing::Message()
                     << "cols " << c.cols << " group " << c.group << " offset " << unit_offset);
        TestTensor x = cpu_test::random_tensor(rng, DType::F32, c.tokens, c.cols, -2, 2, c.stride);
        TestTensor w = cpu_test::random_tensor(rng, weight_dtype, 1, c.group, -0.5, 0.5);
        TestTensor out(DType::F32, c.tokens, c.cols);
        backend->rmsnorm(out.view(), x.view(), w.view(), 1e-6f, unit_offset);
        Reference want = reference_rmsnorm(x, c.group, 1e-6, [&](int64_t, int64_t, int64_t i) {
          return (unit_offset ? 1.0 : 0.0) + w.get(0, i);
        });
        EXPECT_LE(cpu_test::relative_max_error(out, want), kTolerance);
      }
}

TEST(CpuRmsnorm, InPlace) {
  std::mt19937 rng(2);
  auto backend = make_cpu_backend();
  TestTensor x = cpu_test::random_tensor(rng, DType::F32, 4, 48);
  TestTensor w = cpu_test::random_tensor(rng, DType::F32, 1, 16);
  Reference want =
      reference_rmsnorm(x, 16, 1e-6, [&](int64_t, int64_t, int64_t i) { return 1 + w.get(0, i); });
  backend->rmsnorm(x.view(), x.view(), w.view(), 1e-6f, true);
  EXPECT_LE(cpu_test::relative_max_error(x, want), kTolerance);
}

// The fused residual form: x ends as x + delta and out as rmsnorm of that, against the double reference;
// strided x and delta; out aliasing x or delta is refused.
TEST(CpuAddRmsnorm, UpdatesResidualThenNormalises) {
  std::mt19937 rng(21);
  auto backend = make_cpu_backend();
  for (int64_t tokens : {1, 3, 17}) {
    TestTensor x = cpu_test::random_tensor(rng, DType::F32, tokens, 96, -2, 2, 100);
    const TestTensor delta = cpu_test::random_tensor(rng, DType::F32, tokens, 96, -1, 1, 104);
    const TestTensor w = cpu_test::random_tensor(rng, DType::BF16, 1, 96, -0.5, 0.5);
    Reference sum(tokens, 96);
    TestTensor want_x(DType::F32, tokens, 96);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < 96; ++i) {
        sum.at(t, i) = x.get(t, i) + delta.get(t, i);
        want_x.view().row<float>(t)[i] = static_cast<float>(sum.at(t, i));
      }
    Reference want =
        reference_rmsnorm(want_x, 96, 1e-6, [&](int64_t, int64_t, int64_t i) { return 1 + w.get(0, i); });
    TestTensor out(DType::F32, tokens, 96);
    backend->add_rmsnorm(out.view(), x.view(), delta.view(), w.view(), 1e-6f, true);
    EXPECT_LE(cpu_test::relative_max_error(x, sum), kTolerance) << tokens << " tokens: residual";
    EXPECT_LE(cpu_test::relative_max_error(out, want), kTolerance) << tokens << " tokens: norm";
    EXPECT_THROW(backend->add_rmsnorm(x.view(), x.view(), delta.view(), w.view(), 1e-6f, true), Error);
  }
}

TEST(CpuGatedRmsnorm, PerHeadTimesSiluGate) {
  std::mt19937 rng(3);
  auto backend = make_cpu_backend();
  for (NormCase c : {NormCase{1, 32, 16, 32}, NormCase{65, 4 * 24, 24, 101}}) {
    TestTensor x = cpu_test::random_tensor(rng, DType::F32, c.tokens, c.cols, -2, 2, c.stride);
    TestTensor z = cpu_test::random_tensor(rng, DType::F32, c.tokens, c.cols, -4, 4, c.stride + 1);
    TestTensor w = cpu_test::random_tensor(rng, DType::F32, 1, c.group, 0.5, 1.5);
    TestTensor out(DType::F32, c.tokens, c.cols, c.cols + 2);
    backend->gated_rmsnorm(out.view(), x.view(), w.view(), z.view(), 1e-6f);
    Reference want = reference_rmsnorm(x, c.group, 1e-6, [&](int64_t t, int64_t first, int64_t i) {
      return w.get(0, i) * silu(z.get(t, first + i));
    });
    EXPECT_LE(cpu_test::relative_max_error(out, want), kTolerance);
    EXPECT_TRUE(out.padding_intact());
  }
}

TEST(CpuElementwise, AddSiluMulSigmoidMul) {
  std::mt19937 rng(4);
  auto backend = make_cpu_backend();
  TestTensor a = cpu_test::random_tensor(rng, DType::F32, 7, 33, -6, 6, 40);
  TestTensor b = cpu_test::random_tensor(rng, DType::F32, 7, 33, -6, 6);
  TestTensor out(DType::F32, 7, 33);
  Reference want(7, 33);
  const std::vector<std::pair<std::string, std::function<double(double, double)>>> cases = {
      {"add", [](double x, double y) { return x + y; }},
      {"silu_mul", [](double x, double y) { return silu(x) * y; }},
      {"sigmoid_mul", [](double x, double y) { return x * sigmoid(y); }},
  };
  for (const auto& [op, combine] : cases) {
    SCOPED_TRACE(op);
    if (op == "add") backend->add(out.view(), a.view(), b.view());
    if (op == "silu_mul") backend->silu_mul(out.view(), a.view(), b.view());
    if (op == "sigmoid_mul") backend->sigmoid_mul(out.view(), a.view(), b.view());
    for (int64_t t = 0; t < 7; ++t)
      for (int64_t i = 0; i < 33; ++i) want.at(t, i) = combine(a.get(t, i), b.get(t, i));
    EXPECT_LE(cpu_test::relative_max_error(out, want), kTolerance);
  }
}

// The forward updates activations in place (x = x + h, o = o * sigmoid(gate), ...): same values as out of
// place.
TEST(CpuElementwise, OutputMayAliasInput) {
  std::mt19937 rng(12);
  auto backend = make_cpu_backend();
  TestTensor a = cpu_test::random_tensor(rng, DType::F32, 5, 24, -3, 3, 30);
  TestTensor b = cpu_test::random_tensor(rng, DType::F32, 5, 24, -3, 3);
  TestTensor w = cpu_test::random_tensor(rng, DType::F32, 1, 8);
  TestTensor separate(DType::F32, 5, 24);
  const std::vector<std::pair<std::string, std::function<void(const Tensor&)>>> ops = {
      {"add", [&](const Tensor& out) { backend->add(out, a.view(), b.view()); }},
      {"silu_mul", [&](const Tensor& out) { backend->silu_mul(out, a.view(), b.view()); }},
      {"sigmoid_mul", [&](const Tensor& out) { backend->sigmoid_mul(out, a.view(), b.view()); }},
      {"gated_rmsnorm",
       [&](const Tensor& out) { backend->gated_rmsnorm(out, a.view(), w.view(), b.view(), 1e-6f); }},
  };
  for (const auto& [op, run] : ops) {
    SCOPED_TRACE(op);
    run(separate.view());
    run(a.view());
    EXPECT_EQ(cpu_test::relative_max_error(a, cpu_test::reference_of(separate)), 0.0);
    a.fill_random(rng, -3, 3);
  }
}

// The default attention_prologue against the ops it stands for, called one by one on a copy: query, gate and
// both caches equal exactly; bad shapes name the op and the argument.
TEST(CpuAttentionPrologue, EqualsSplitNormRopeStore) {
  std::mt19937 rng(23);
  auto backend = make_cpu_backend();
  const int heads = 4, kv_heads = 2, dim = 16, rotary = 8, tokens = 3;
  const int64_t q_cols = heads * dim, kv_cols = kv_heads * dim, width = 2 * q_cols + 2 * kv_cols;
  const AttentionPrologueShape shape{heads, kv_heads, dim, rotary, 1e4, 1e-6f, true};
  // TestTensor copies share storage: copy values into new tensors.
  auto copy_of = [](const TestTensor& t) {
    TestTensor copy(t.view().dtype, t.rows(), t.cols());
    for (int64_t r = 0; r < t.rows(); ++r)
      for (int64_t c = 0; c < t.cols(); ++c) copy.set(r, c, t.get(r, c));
    return copy;
  };
  TestTensor qkv = cpu_test::random_tensor(rng, DType::F32, tokens, width, -2, 2);
  TestTensor qkv_copy = copy_of(qkv);
  const TestTensor q_norm = cpu_test::random_tensor(rng, DType::BF16, 1, dim, -0.5, 0.5);
  const TestTensor k_norm = cpu_test::random_tensor(rng, DType::BF16, 1, dim, -0.5, 0.5);
  TestTensor positions(DType::I32, tokens, 1);
  for (int t = 0; t < tokens; ++t) positions.view().row<int32_t>(t)[0] = 5 + 2 * t;
  TestTensor k_cache = cpu_test::random_tensor(rng, DType::F32, 12, kv_cols);
  TestTensor v_cache = cpu_test::random_tensor(rng, DType::F32, 12, kv_cols);
  TestTensor k_want = copy_of(k_cache), v_want = copy_of(v_cache);
  TestTensor query(DType::F32, tokens, q_cols), gate(DType::F32, tokens, q_cols);
  TestTensor query_want(DType::F32, tokens, q_cols), gate_want(DType::F32, tokens, q_cols);
  backend->attention_prologue(query.view(), gate.view(), qkv.view(), q_norm.view(), k_norm.view(),
                              k_cache.view(), v_cache.view(), positions.view(), shape);
  const Tensor k = qkv_copy.view().cols_view(2 * q_cols, kv_cols),
               v = qkv_copy.view().cols_view(2 * q_cols + kv_cols, kv_cols);
  backend->split_query_gate(query_want.view(), gate_want.view(), qkv_copy.view().cols_view(0, 2 * q_cols),
                            dim);
  backend->rmsnorm(query_want.view(), query_want.view(), q_norm.view(), 1e-6f, true);
  backend->rmsnorm(k, k, k_norm.view(), 1e-6f, true);
  backend->rope(query_want.view(), positions.view(), dim, rotary, 1e4);
  backend->rope(k, positions.view(), dim, rotary, 1e4);
  backend->kv_store(k_want.view(), k, positions.view());
  backend->kv_store(v_want.view(), v, positions.view());
  EXPECT_EQ(cpu_test::relative_max_error(query, cpu_test::reference_of(query_want)), 0.0);
  EXPECT_EQ(cpu_test::relative_max_error(gate, cpu_test::reference_of(gate_want)), 0.0);
  EXPECT_EQ(cpu_test::relative_max_error(k_cache, cpu_test::reference_of(k_want)), 0.0);
  EXPECT_EQ(cpu_test::relative_max_error(v_cache, cpu_test::reference_of(v_want)), 0.0);

  TestTensor narrow = cpu_test::random_tensor(rng, DType::F32, tokens, width - 1);
  cpu_test::expect_error(
      [&] {
        backend->attention_prologue(query.view(), gate.view(), narrow.view(), q_norm.view(), k_norm.view(),
                                    k_cache.view(), v_cache.view(), positions.view(), shape);
      },
      {"attention_prologue", "qkv"});
  const TestTensor f32_norm = cpu_test::random_tensor(rng, DType::F32, 1, dim);
  cpu_test::expect_error(
      [&] {
        backend->attention_prologue(query.view(), gate.view(), qkv.view(), q_norm.view(), f32_norm.view(),
                                    k_cache.view(), v_cache.view(), positions.view(), shape);
      },
      {"attention_prologue", "dtypes"});
}

// Without a gate (qkv = queries | keys | values, the DFlash drafter's layers): the default against the ops
// it stands for, with the queries normed in place (query = qkv's query columns) and into a tensor of their
// own; a qkv as wide as the gated form's, or a query overlapping qkv elsewhere, is refused by name.
TEST(CpuAttentionPrologue, WithoutGateInPlaceOrNot) {
  std::mt19937 rng(29);
  auto backend = make_cpu_backend();
  const int heads = 4, kv_heads = 2, dim = 16, tokens = 3;
  const int64_t q_cols = heads * dim, kv_cols = kv_heads * dim, width = q_cols + 2 * kv_cols;
  const AttentionPrologueShape shape{heads, kv_heads, dim, dim, 1e4, 1e-6f, false};
  const TestTensor q_norm = cpu_test::random_tensor(rng, DType::BF16, 1, dim, -0.5, 0.5);
  const TestTensor k_norm = cpu_test::random_tensor(rng, DType::BF16, 1, dim, -0.5, 0.5);
  TestTensor positions(DType::I32, tokens, 1);
  for (int t = 0; t < tokens; ++t) positions.view().row<int32_t>(t)[0] = 4 + t;
  // TestTensor copies share storage: new tensors with the values of random ones.
  auto copy_of = [](const TestTensor& t) {
    TestTensor copy(t.view().dtype, t.rows(), t.cols());
    for (int64_t r = 0; r < t.rows(); ++r)
      for (int64_t c = 0; c < t.cols(); ++c) copy.set(r, c, t.get(r, c));
    return copy;
  };
  const TestTensor base = cpu_test::random_tensor(rng, DType::F32, tokens, width, -2, 2);
  const TestTensor k_base = cpu_test::random_tensor(rng, DType::F32, 10, kv_cols);
  const TestTensor v_base = cpu_test::random_tensor(rng, DType::F32, 10, kv_cols);
  auto qkv_of = [&] { return copy_of(base); };
  // The ops one by one.
  TestTensor want_qkv = qkv_of();
  TestTensor k_want = copy_of(k_base), v_want = copy_of(v_base);
  const Tensor q = want_qkv.view().cols_view(0, q_cols), k = want_qkv.view().cols_view(q_cols, kv_cols);
  backend->rmsnorm(q, q, q_norm.view(), 1e-6f, false);
  backend->rmsnorm(k, k, k_norm.view(), 1e-6f, false);
  backend->rope(q, positions.view(), dim, dim, 1e4);
  backend->rope(k, positions.view(), dim, dim, 1e4);
  backend->kv_store(k_want.view(), k, positions.view());
  backend->kv_store(v_want.view(), want_qkv.view().cols_view(q_cols + kv_cols, kv_cols), positions.view());
  for (const bool in_place : {true, false}) {
    TestTensor qkv = qkv_of(), own_query(DType::F32, tokens, q_cols);
    TestTensor k_cache = copy_of(k_base), v_cache = copy_of(v_base);
    const Tensor query = in_place ? qkv.view().cols_view(0, q_cols) : own_query.view();
    backend->attention_prologue(query, Tensor{}, qkv.view(), q_norm.view(), k_norm.view(), k_cache.view(),
                                v_cache.view(), positions.view(), shape);
    std::vector<float> got(static_cast<size_t>(tokens * q_cols)), expected(got.size());
    for (int64_t r = 0; r < tokens; ++r)
      for (int64_t c = 0; c < q_cols; ++c) {
        got[static_cast<size_t>(r * q_cols + c)] = query.row<float>(r)[c];
        expected[static_cast<size_t>(r * q_cols + c)] = q.row<float>(r)[c];
      }
    EXPECT_EQ(got, expected) << (in_place ? "in place" : "own query tensor");
    if (!in_place) {  // qkv's query columns stay as they were
      for (int64_t r = 0; r < tokens; ++r)
        for (int64_t c = 0; c < q_cols; ++c) {
          ASSERT_EQ(qkv.get(r, c), base.get(r, c)) << r << ", " << c;
        }
    }
    EXPECT_EQ(cpu_test::relative_max_error(k_cache, cpu_test::reference_of(k_want)), 0.0);
    EXPECT_EQ(cpu_test::relative_max_error(v_cache, cpu_test::reference_of(v_want)), 0.0);
  }
  TestTensor qkv = qkv_of(), k_cache(DType::F32, 10, kv_cols), v_cache(DType::F32, 10, kv_cols);
  TestTensor gated_width(DType::F32, tokens, width + q_cols), query(DType::F32, tokens, q_cols);
  cpu_test::expect_error(
      [&] {
        backend->attention_prologue(query.view(), Tensor{}, gated_width.view(), q_norm.view(), k_norm.view(),
                                    k_cache.view(), v_cache.view(), positions.view(), shape);
      },
      {"attention_prologue", "qkv"});
  cpu_test::expect_error(
      [&] {
        backend->attention_prologue(qkv.view().cols_view(1, q_cols), Tensor{}, qkv.view(), q_norm.view(),
                                    k_norm.view(), k_cache.view(), v_cache.view(), positions.view(), shape);
      },
      {"attention_prologue", "query overlaps qkv"});
}

// Without query heads (qkv = keys | values, the drafter's context rows): the caches equal what the ops one
// by one make; a query or gate passed along is refused by name.
TEST(CpuAttentionPrologue, KeysAndValuesOnly) {
  std::mt19937 rng(31);
  auto backend = make_cpu_backend();
  const int kv_heads = 2, dim = 16, tokens = 3;
  const int64_t kv_cols = kv_heads * dim;
  const AttentionPrologueShape shape{0, kv_heads, dim, dim, 1e4, 1e-6f, false};
  const TestTensor k_norm = cpu_test::random_tensor(rng, DType::BF16, 1, dim, -0.5, 0.5);
  TestTensor positions(DType::I32, tokens, 1);
  for (int t = 0; t < tokens; ++t) positions.view().row<int32_t>(t)[0] = 7 - 3 * t;
  // The keys and values of one layer among three, as the drafter's stacked context rows hold them.
  TestTensor layers = cpu_test::random_tensor(rng, DType::F32, tokens, 3 * 2 * kv_cols, -2, 2);
  const Tensor kv = layers.view().cols_view(2 * kv_cols, 2 * kv_cols);
  TestTensor want_kv(DType::F32, tokens, 2 * kv_cols);
  backend->copy(want_kv.view(), kv);
  TestTensor k_cache = cpu_test::random_tensor(rng, DType::F32, 9, kv_cols);
  TestTensor v_cache = cpu_test::random_tensor(rng, DType::F32, 9, kv_cols);
  TestTensor k_want(DType::F32, 9, kv_cols), v_want(DType::F32, 9, kv_cols);
  backend->copy(k_want.view(), k_cache.view());
  backend->copy(v_want.view(), v_cache.view());
  const Tensor k = want_kv.view().cols_view(0, kv_cols);
  backend->rmsnorm(k, k, k_norm.view(), 1e-6f, false);
  backend->rope(k, positions.view(), dim, dim, 1e4);
  backend->kv_store(k_want.view(), k, positions.view());
  backend->kv_store(v_want.view(), want_kv.view().cols_view(kv_cols, kv_cols), positions.view());
  backend->attention_prologue(Tensor{}, Tensor{}, kv, Tensor{}, k_norm.view(), k_cache.view(), v_cache.view(),
                              positions.view(), shape);
  EXPECT_EQ(cpu_test::relative_max_error(k_cache, cpu_test::reference_of(k_want)), 0.0);
  EXPECT_EQ(cpu_test::relative_max_error(v_cache, cpu_test::reference_of(v_want)), 0.0);
  TestTensor query(DType::F32, tokens, dim);
  const std::vector<std::tuple<Tensor, Tensor, Tensor>> passed_along = {{query.view(), Tensor{}, Tensor{}},
                                                                        {Tensor{}, query.view(), Tensor{}},
                                                                        {Tensor{}, Tensor{}, k_norm.view()}};
  for (const auto& [q, gate, q_norm] : passed_along)
    cpu_test::expect_error(
        [&] {
          backend->attention_prologue(q, gate, kv, q_norm, k_norm.view(), k_cache.view(), v_cache.view(),
                                      positions.view(), shape);
        },
        {"attention_prologue", "without query heads"});
  const AttentionPrologueShape negative{-2, kv_heads, dim, dim, 1e4, 1e-6f, false};
  cpu_test::expect_error(
      [&] {
        backend->attention_prologue(Tensor{}, Tensor{}, kv, Tensor{}, k_norm.view(), k_cache.view(),
                                    v_cache.view(), positions.view(), negative);
      },
      {"attention_prologue", "-2 query heads"});
}

// attention_prologues over three layers of stacked context rows equals attention_prologue a layer at a time;
// a layer of other rows, layers sharing a cache and a bad layer are refused, naming the layers, before any
// layer runs.
TEST(CpuAttentionPrologue, LayersTogetherEqualOneByOne) {
  std::mt19937 rng(32);
  auto backend = make_cpu_backend();
  const int kv_heads = 2, dim = 16, tokens = 3, layer_count = 3;
  const int64_t kv_cols = kv_heads * dim;
  const AttentionPrologueShape shape{0, kv_heads, dim, dim, 1e4, 1e-6f, false};
  TestTensor positions(DType::I32, tokens, 1);
  for (int t = 0; t < tokens; ++t) positions.view().row<int32_t>(t)[0] = 2 + t;
  const TestTensor rows = cpu_test::random_tensor(rng, DType::F32, tokens, layer_count * 2 * kv_cols, -2, 2);
  std::vector<TestTensor> norms, caches;
  for (int i = 0; i < layer_count; ++i) {
    norms.push_back(cpu_test::random_tensor(rng, DType::BF16, 1, dim, -0.5, 0.5));
    caches.push_back(cpu_test::random_tensor(rng, DType::F32, 8, kv_cols));
    caches.push_back(cpu_test::random_tensor(rng, DType::F32, 8, kv_cols));
  }
  auto copies = [&] {
    std::vector<TestTensor> out;
    for (const TestTensor& t : caches) {
      out.emplace_back(DType::F32, t.rows(), t.cols());
      backend->copy(out.back().view(), t.view());
    }
    out.emplace_back(DType::F32, tokens, layer_count * 2 * kv_cols);
    backend->copy(out.back().view(), rows.view());
    return out;
  };
  auto layers_of = [&](const std::vector<TestTensor>& t) {
    std::vector<AttentionPrologueLayer> layers;
    for (int i = 0; i < layer_count; ++i)
      layers.push_back({Tensor{}, Tensor{}, t.back().view().cols_view(i * 2 * kv_cols, 2 * kv_cols), Tensor{},
                        norms[size_t(i)].view(), t[size_t(2 * i)].view(), t[size_t(2 * i + 1)].view()});
    return layers;
  };
  std::vector<TestTensor> together = copies(), one_by_one = copies();
  backend->attention_prologues(layers_of(together), positions.view(), shape);
  for (const AttentionPrologueLayer& l : layers_of(one_by_one))
    backend->attention_prologue(l.query, l.gate, l.qkv, l.q_norm, l.k_norm, l.k_cache, l.v_cache,
                                positions.view(), shape);
  for (size_t i = 0; i < together.size(); ++i) {
    EXPECT_EQ(cpu_test::relative_max_error(together[i], cpu_test::reference_of(one_by_one[i])), 0.0) << i;
    if (i < caches.size()) {
      EXPECT_GT(cpu_test::relative_max_error(together[i], cpu_test::reference_of(caches[i])), 0.0) << i;
    }
  }

  std::vector<TestTensor> untouched = copies();
  std::vector<AttentionPrologueLayer> shared_cache = layers_of(untouched);
  shared_cache[2].v_cache = shared_cache[0].k_cache;
  cpu_test::expect_error([&] { backend->attention_prologues(shared_cache, positions.view(), shape); },
                         {"attention_prologues", "layers[0] and layers[2] share memory"});
  std::vector<AttentionPrologueLayer> short_layer = layers_of(untouched);
  short_layer[1].qkv = short_layer[1].qkv.rows_view(0, 2);
  cpu_test::expect_error([&] { backend->attention_prologues(short_layer, positions.view(), shape); },
                         {"attention_prologues", "layers[1]"});
  std::vector<AttentionPrologueLayer> narrow_norm = layers_of(untouched);
  narrow_norm[2].k_norm = narrow_norm[2].k_norm.cols_view(0, dim - 1);
  cpu_test::expect_error([&] { backend->attention_prologues(narrow_norm, positions.view(), shape); },
                         {"attention_prologues", "layers[2]", "k_norm"});
  for (size_t i = 0; i < caches.size(); ++i)
    EXPECT_EQ(cpu_test::relative_max_error(untouched[i], cpu_test::reference_of(caches[i])), 0.0) << i;
}

// Adjacent column views of one tensor give the whole back; views apart, of other strides or out of order
// give an empty tensor; single rows side by side in memory are one row.
TEST(TensorViews, ConcatenatedColumns) {
  std::vector<float> storage(4 * 12);
  const Tensor whole = Tensor::make(DType::F32, 4, 12, storage.data());
  const std::vector<Tensor> parts = {whole.cols_view(0, 5), whole.cols_view(5, 3), whole.cols_view(8, 4)};
  const Tensor joined = concatenated_columns(parts);
  EXPECT_EQ(joined.data, whole.data);
  EXPECT_EQ(joined.rows, 4);
  EXPECT_EQ(joined.cols, 12);
  EXPECT_EQ(joined.stride, 12);
  const Tensor first_two = concatenated_columns(std::vector<Tensor>{parts[0], parts[1]});
  EXPECT_EQ(first_two.cols, 8);
  EXPECT_EQ(first_two.stride, 12);
  EXPECT_TRUE(concatenated_columns(std::vector<Tensor>{parts[0], parts[2]}).empty()) << "a gap";
  EXPECT_TRUE(concatenated_columns(std::vector<Tensor>{parts[1], parts[0]}).empty()) << "out of order";
  const Tensor apart = Tensor::make(DType::F32, 4, 3, storage.data() + 5);
  EXPECT_TRUE(concatenated_columns(std::vector<Tensor>{parts[0], apart}).empty()) << "another stride";
  const Tensor row_a = Tensor::make(DType::F32, 1, 5, storage.data());
  const Tensor row_b = Tensor::make(DType::F32, 1, 7, storage.data() + 5);
  const Tensor row = concatenated_columns(std::vector<Tensor>{row_a, row_b});
  EXPECT_EQ(row.cols, 12);
  EXPECT_EQ(row.stride, 12);
  EXPECT_TRUE(concatenated_columns(std::vector<Tensor>{}).empty());
  EXPECT_TRUE(concatenated_columns(std::vector<Tensor>{parts[0], parts[1].rows_view(0, 3)}).empty())
      << "other rows";
  Tensor as_i32 = parts[1];
  as_i32.dtype = DType::I32;
  EXPECT_TRUE(concatenated_columns(std::vector<Tensor>{parts[0], as_i32}).empty()) << "another dtype";
  // Rows of 3 values 3 apart, side by side: the whole would be 6 wide at a stride of 3 (rows overlapping).
  const Tensor narrow_a{DType::F32, 4, 3, 3, storage.data()},
      narrow_b{DType::F32, 4, 3, 3, storage.data() + 3};
  EXPECT_TRUE(concatenated_columns(std::vector<Tensor>{narrow_a, narrow_b}).empty()) << "overlapping rows";
}

TEST(CpuSplitQueryGate, InterleavedPerHead) {
  std::mt19937 rng(5);
  auto backend = make_cpu_backend();
  const int64_t heads = 3, dim = 5;
  TestTensor qg = cpu_test::random_tensor(rng, DType::F32, 4, heads * 2 * dim);
  TestTensor query(DType::F32, 4, heads * dim), gate(DType::F32, 4, heads * dim);
  backend->split_query_gate(query.view(), gate.view(), qg.view(), static_cast<int>(dim));
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < dim; ++i) {
        EXPECT_EQ(query.get(t, h * dim + i), qg.get(t, h * 2 * dim + i));
        EXPECT_EQ(gate.get(t, h * dim + i), qg.get(t, h * 2 * dim + dim + i));
      }
}

// HF's angle: inv_freq = 1 / theta^(float(2i) / rot) and float(pos) * inv_freq, all fp32; the rotation in
// double.
TEST(CpuRope, PartialNeoxRotationMatchesReference) {
  std::mt19937 rng(6);
  auto backend = make_cpu_backend();
  const int heads = 3, head_dim = 24, rotary_dim = 8;
  const double theta = 1e7;
  const std::vector<int32_t> positions = {0, 1, 7, 300, 4095, 131071};
  const auto tokens = static_cast<int64_t>(positions.size());
  TestTensor x =
      cpu_test::random_tensor(rng, DType::F32, tokens, heads * head_dim, -1, 1, heads * head_dim + 5);
  Reference want = cpu_test::reference_of(x);
  const int half = rotary_dim / 2;
  for (int64_t t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        float inv_freq = 1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / rotary_dim);
        double angle = static_cast<float>(positions[t]) * inv_freq;
        double x1 = x.get(t, h * head_dim + i), x2 = x.get(t, h * head_dim + i + half);
        want.at(t, h * head_dim + i) = x1 * std::cos(angle) - x2 * std::sin(angle);
        want.at(t, h * head_dim + i + half) = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
  TestTensor pos = cpu_test::index_tensor(positions);
  backend->rope(x.view(), pos.view(), head_dim, rotary_dim, theta);
  EXPECT_LE(cpu_test::relative_max_error(x, want), kTolerance);
  EXPECT_TRUE(x.padding_intact());
}

struct AttentionCase {
  int heads, kv_heads, head_dim;
  std::vector<int32_t> positions;
  int64_t cache_rows;
};

// softmax over keys 0..pos[t] of (q . k) * scale, times V, in double.
Reference reference_attention(const TestTensor& q, const TestTensor& k, const TestTensor& v,
                              const AttentionCase& c, double scale) {
  Reference out(q.rows(), q.cols());
  for (int64_t t = 0; t < q.rows(); ++t)
    for (int h = 0; h < c.heads; ++h) {
      const int64_t kv = h / (c.heads / c.kv_heads) * c.head_dim;
      const int64_t keys = c.positions[t] + 1;
      std::vector<double> p(static_cast<size_t>(keys));
      double max_score = -INFINITY, total = 0;
      for (int64_t j = 0; j < keys; ++j) {
        double s = 0;
        for (int d = 0; d < c.head_dim; ++d) s += q.get(t, h * c.head_dim + d) * k.get(j, kv + d);
        p[j] = s * scale;
        max_score = std::max(max_score, p[j]);
      }
      for (double& s : p) total += s = std::exp(s - max_score);
      for (int d = 0; d < c.head_dim; ++d) {
        double sum = 0;
        for (int64_t j = 0; j < keys; ++j) sum += p[j] / total * v.get(j, kv + d);
        out.at(t, h * c.head_dim + d) = sum;
      }
    }
  return out;
}

// Error measure: max |got - want| / max |want| <= 1e-5. Cache rows past the last position hold NaN, so
// reading beyond a query's own position poisons the result.
TEST(CpuAttention, CausalGqaOverCachePositions) {
  std::mt19937 rng(8);
  auto backend = make_cpu_backend();
  const std::vector<AttentionCase> cases = {
      {4, 4, 16, {0}, 4},              // first token, MHA
      {4, 2, 16, {5, 6, 7}, 12},       // GQA, positions continuing a prefix
      {8, 1, 33, {2, 9, 10, 30}, 40},  // MQA, odd head dim, positions with a gap
      {6, 3, 8, {63, 64, 65}, 66},     // around 64
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.heads << "/" << c.kv_heads << " dim " << c.head_dim);
    const auto tokens = static_cast<int64_t>(c.positions.size());
    const int64_t kv_cols = int64_t{c.kv_heads} * c.head_dim;
    const int64_t visible = *std::max_element(c.positions.begin(), c.positions.end()) + 1;
    TestTensor k(DType::F32, c.cache_rows, kv_cols), v(DType::F32, c.cache_rows, kv_cols);
    for (int64_t j = 0; j < visible; ++j)
      for (int64_t i = 0; i < kv_cols; ++i) {
        k.set(j, i, std::uniform_real_distribution<double>(-2, 2)(rng));
        v.set(j, i, std::uniform_real_distribution<double>(-1, 1)(rng));
      }
    TestTensor q = cpu_test::random_tensor(rng, DType::F32, tokens, int64_t{c.heads} * c.head_dim, -2, 2);
    TestTensor out(DType::F32, tokens, int64_t{c.heads} * c.head_dim);
    TestTensor positions = cpu_test::index_tensor(c.positions);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    backend->attention(out.view(), q.view(), k.view(), v.view(), positions.view(),
                       AttentionShape{c.heads, c.kv_heads, c.head_dim, scale});
    EXPECT_LE(cpu_test::relative_max_error(out, reference_attention(q, k, v, c, scale)), kTolerance);
  }
}

TEST(CpuEmbed, GathersRowsOfAnyWeightDtype) {
  std::mt19937 rng(9);
  auto backend = make_cpu_backend();
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    TestTensor table = cpu_test::random_tensor(rng, dtype, 50, 12);
    TestTensor ids = cpu_test::index_tensor({49, 0, 7, 7});
    TestTensor out(DType::F32, 4, 12);
    backend->embed(out.view(), table.view(), ids.view());
    for (int64_t t = 0; t < 4; ++t)
      for (int64_t i = 0; i < 12; ++i)
        EXPECT_EQ(out.get(t, i), table.get(static_cast<int64_t>(ids.get(t, 0)), i));
  }
}

TEST(CpuKvStore, WritesRowsAtPositions) {
  std::mt19937 rng(10);
  auto backend = make_cpu_backend();
  TestTensor cache(DType::F32, 8, 6);
  backend->fill_zero(cache.view());
  TestTensor x = cpu_test::random_tensor(rng, DType::F32, 3, 6, -1, 1, 9);
  TestTensor positions = cpu_test::index_tensor({2, 5, 6});
  backend->kv_store(cache.view(), x.view(), positions.view());
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t i = 0; i < 6; ++i) {
      double want = r == 2 ? x.get(0, i) : r == 5 ? x.get(1, i) : r == 6 ? x.get(2, i) : 0.0;
      EXPECT_EQ(cache.get(r, i), want) << "row " << r;
    }
}

TEST(CpuMemory, WriteReadCopyFillZero) {
  auto backend = make_cpu_backend();
  auto buffer = backend->alloc(DType::F32, 2, 3);
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  backend->write(buffer->tensor(), values.data());
  TestTensor strided(DType::F32, 2, 3, 5);
  backend->copy(strided.view(), buffer->tensor());
  EXPECT_EQ(strided.get(1, 2), 6.0);
  EXPECT_TRUE(strided.padding_intact());
  backend->fill_zero(buffer->tensor().rows_view(0, 1));
  std::vector<float> back(6);
  backend->read(back.data(), buffer->tensor());
  EXPECT_EQ(back, (std::vector<float>{0, 0, 0, 4, 5, 6}));
  // A strided view reads back with its rows packed.
  std::vector<float> columns(4);
  backend->read(columns.data(), strided.view().cols_view(1, 2));
  EXPECT_EQ(columns, (std::vector<float>{2, 3, 5, 6}));
}

}  // namespace
}  // namespace qspec
