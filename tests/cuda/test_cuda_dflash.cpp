// Speculative decoding on the CUDA backend against the CPU reference: the windowed_attention op, GDN ops that
// only read their state (update_state = false), verify + commit of the target (step graphs on), the DFlash
// drafter against the oracle fixtures (tests/fixtures/dflash), and greedy speculative output equal to plain
// greedy output on the GPU.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/speculative.h"
#include "op_check.h"

namespace qspec::cuda_test {
namespace {

namespace fs = std::filesystem;

// Up to 64 query rows per KV head run the attention kernels (split-BF16 tensor cores for head_dim 32 / 64 /
// 128 / 256: q, k, p and v each hi + lo BF16, FP32 sums, as the causal attention op's tensor-core
// tolerance); more the FP32 windowed kernel (keys summed in another order).
constexpr double kWindowedAttentionTolerance = 5e-5;

fs::path fixtures_root() {
  if (const char* dir = std::getenv("QSPEC_FIXTURES_DIR")) return fs::path(dir);
  return fs::path("tests") / "fixtures";
}

std::vector<fs::path> fixture_dirs(const std::string& kind, const std::string& marker) {
  std::vector<fs::path> dirs;
  if (fs::exists(fixtures_root() / kind))
    for (const auto& entry : fs::directory_iterator(fixtures_root() / kind))
      if (fs::exists(entry.path() / marker)) dirs.push_back(entry.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::vector<float> read_all(Backend& backend, const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  backend.read(out.data(), t);
  return out;
}

// Random queries [rows, heads x head_dim] and K/V caches [keys, kv_heads x head_dim] in [-1, 1) on both
// backends, for windowed_attention.
struct WindowedOperands {
  TensorPair q, k, v;
  AttentionShape shape;
};

WindowedOperands random_windowed_operands(Backends& b, std::mt19937& rng, int heads, int kv_heads,
                                          int head_dim, int rows, int keys) {
  const int64_t q_cols = int64_t(heads) * head_dim, kv_cols = int64_t(kv_heads) * head_dim;
  return {b.activation(rows, q_cols, random_floats(rng, size_t(rows * q_cols), -1.0f, 1.0f)),
          b.activation(keys, kv_cols, random_floats(rng, size_t(keys * kv_cols), -1.0f, 1.0f)),
          b.activation(keys, kv_cols, random_floats(rng, size_t(keys * kv_cols), -1.0f, 1.0f)),
          {heads, kv_heads, head_dim, 1.0f / std::sqrt(float(head_dim))}};
}

// windowed_attention of `o` on each backend, each with its own key ranges (I32 [rows, 1]); the GPU's output
// and the CPU's, as read back.
std::pair<std::vector<float>, std::vector<float>> windowed_on_both(Backends& b, const WindowedOperands& o,
                                                                   const Tensor& cpu_begin,
                                                                   const Tensor& cpu_end,
                                                                   const Tensor& gpu_begin,
                                                                   const Tensor& gpu_end) {
  TensorPair out = b.poisoned(o.q.cpu().rows, o.q.cpu().cols);
  b.cpu().windowed_attention(out.cpu(), o.q.cpu(), o.k.cpu(), o.v.cpu(), cpu_begin, cpu_end, o.shape);
  b.gpu().windowed_attention(out.gpu(), o.q.gpu(), o.k.gpu(), o.v.gpu(), gpu_begin, gpu_end, o.shape);
  return {b.read_gpu(out.gpu()), b.read_cpu(out.cpu())};
}

TEST(CudaDFlash, WindowedAttentionMatchesCpu) {
  std::mt19937 rng(41);
  Backends b;
  struct Case {
    int heads, kv_heads, head_dim, rows, cache_rows, window;
  };
  // The drafter's shape (32/8 x 128, 16 queries) over short and long contexts, windowed or not; odd shapes.
  // Up to 64 query rows per KV head take the attention kernels with first keys: tensor-core verify (head_dim
  // 128, 256, 64), FP32 verify (16), decode (2 rows a KV head, with several key splits); more (16 heads a KV
  // head x 8 rows) the kernel of a block per row and head.
  const std::vector<Case> cases = {{32, 8, 128, 16, 40, 0},      {32, 8, 128, 16, 4100, 0},
                                   {32, 8, 128, 16, 4100, 1024}, {4, 2, 16, 16, 37, 12},
                                   {6, 3, 256, 5, 300, 7},       {2, 1, 64, 3, 1, 0},
                                   {4, 4, 64, 2, 3000, 700},     {16, 1, 64, 8, 100, 10}};
  for (const Case& c : cases) {
    const std::string label = fmt::format("windowed_attention {}/{} x {} rows {} keys {} window {}", c.heads,
                                          c.kv_heads, c.head_dim, c.rows, c.cache_rows, c.window);
    const WindowedOperands o =
        random_windowed_operands(b, rng, c.heads, c.kv_heads, c.head_dim, c.rows, c.cache_rows);
    // Queries sit at the last `rows` positions, as the drafter's block does.
    std::vector<int32_t> begin, end;
    for (int t = 0; t < c.rows; ++t) {
      const int p = c.cache_rows - c.rows + t;
      const bool windowed = c.window > 0 && c.cache_rows > c.window;
      begin.push_back(windowed ? std::max(0, p - (c.window - 1)) : 0);
      end.push_back(windowed ? std::min(c.cache_rows, p + c.window) : c.cache_rows);
    }
    const TensorPair key_begin = b.indices(begin), key_end = b.indices(end);
    const auto [gpu, cpu] =
        windowed_on_both(b, o, key_begin.cpu(), key_end.cpu(), key_begin.gpu(), key_end.gpu());
    expect_close("windowed_attention", label, gpu, cpu, kWindowedAttentionTolerance);
  }
}

// Ranges that are disjoint from one row to the next (the kernels with first keys read the keys between them,
// weighted 0) and an empty range (a NaN output row, as a position outside the cache gives the causal op; the
// CPU refuses it, so its row is compared with a CPU row of another range and then skipped), on both CUDA
// paths: 64 query rows a KV head (the attention kernels) and 128 (the windowed kernel).
TEST(CudaDFlash, WindowedAttentionDisjointAndEmptyRanges) {
  std::mt19937 rng(43);
  Backends b;
  struct Case {
    int heads, kv_heads, head_dim, rows;
  };
  constexpr int kKeys = 1000, kEmptyRow = 5;
  for (const Case& c : {Case{32, 8, 128, 16}, Case{16, 1, 64, 8}}) {
    const int64_t q_cols = int64_t(c.heads) * c.head_dim;
    const WindowedOperands o =
        random_windowed_operands(b, rng, c.heads, c.kv_heads, c.head_dim, c.rows, kKeys);
    std::vector<int32_t> begin, end;
    for (int t = 0; t < c.rows; ++t) {
      begin.push_back(t % 2 == 0 ? 3 * t : 600 + t);
      end.push_back(t % 2 == 0 ? 3 * t + 40 : 700 + t);
    }
    const TensorPair cpu_begin = b.indices(begin), cpu_end = b.indices(end);
    begin[kEmptyRow] = end[kEmptyRow] = 300;
    const TensorPair gpu_begin = b.indices(begin), gpu_end = b.indices(end);
    auto [gpu, cpu] = windowed_on_both(b, o, cpu_begin.cpu(), cpu_end.cpu(), gpu_begin.gpu(), gpu_end.gpu());
    const auto empty_row = gpu.begin() + kEmptyRow * q_cols;
    EXPECT_TRUE(std::all_of(empty_row, empty_row + q_cols, [](float x) { return std::isnan(x); }))
        << c.heads << "/" << c.kv_heads << " heads: the empty range's row is not NaN";
    std::copy(cpu.begin() + kEmptyRow * q_cols, cpu.begin() + (kEmptyRow + 1) * q_cols, empty_row);
    expect_close("windowed_attention",
                 fmt::format("windowed_attention {}/{} x {} rows {}, disjoint ranges", c.heads, c.kv_heads,
                             c.head_dim, c.rows),
                 gpu, cpu, kWindowedAttentionTolerance);
  }
}

// update_state = false: the GPU state is left bit for bit, the outputs are those of the updating call.
TEST(CudaDFlash, GdnOpsWithoutStateUpdateOnlyReadTheState) {
  std::mt19937 rng(42);
  Backends b;
  const int64_t tokens = 16, channels = 8192;
  const WeightPair weight =
      b.weight(DType::BF16, channels, 4, random_floats(rng, size_t(channels * 4), -0.6f, 0.6f));
  const std::vector<float> initial = random_floats(rng, size_t(channels * 3), -2.0f, 2.0f);
  const TensorPair x =
      b.activation(tokens, channels, random_floats(rng, size_t(tokens * channels), -2.0f, 2.0f));
  TensorPair read_only = b.activation(channels, 3, initial), updated = b.activation(channels, 3, initial);
  TensorPair out_read_only = b.poisoned(tokens, channels), out_updated = b.poisoned(tokens, channels);
  b.gpu().conv1d_silu(out_read_only.gpu(), x.gpu(), read_only.gpu(), weight.gpu, false);
  b.gpu().conv1d_silu(out_updated.gpu(), x.gpu(), updated.gpu(), weight.gpu, true);
  expect_close("conv1d_silu", "conv1d_silu update_state=false state untouched", b.read_gpu(read_only.gpu()),
               initial, 0.0);
  expect_close("conv1d_silu", "conv1d_silu update_state=false out", b.read_gpu(out_read_only.gpu()),
               b.read_gpu(out_updated.gpu()), 0.0);

  const GdnShape shape{16, 32, 128, 128};
  const int64_t qkv_cols = 2 * 16 * 128 + 32 * 128, state_rows = 32 * 128;
  const std::vector<float> state0 = random_floats(rng, size_t(state_rows * 128), -0.5f, 0.5f);
  const TensorPair qkv =
      b.activation(tokens, qkv_cols, random_floats(rng, size_t(tokens * qkv_cols), -1.0f, 1.0f));
  const TensorPair beta = b.activation(tokens, 32, random_floats(rng, size_t(tokens * 32), 0.05f, 0.95f));
  const TensorPair g = b.activation(tokens, 32, random_floats(rng, size_t(tokens * 32), -2.0f, -0.01f));
  TensorPair s_read_only = b.activation(state_rows, 128, state0),
             s_updated = b.activation(state_rows, 128, state0);
  TensorPair o_read_only = b.poisoned(tokens, 32 * 128), o_updated = b.poisoned(tokens, 32 * 128);
  b.gpu().gated_delta_rule(o_read_only.gpu(), qkv.gpu(), beta.gpu(), g.gpu(), s_read_only.gpu(), shape,
                           false);
  b.gpu().gated_delta_rule(o_updated.gpu(), qkv.gpu(), beta.gpu(), g.gpu(), s_updated.gpu(), shape, true);
  expect_close("gated_delta_rule", "gated_delta_rule update_state=false state untouched",
               b.read_gpu(s_read_only.gpu()), state0, 0.0);
  expect_close("gated_delta_rule", "gated_delta_rule update_state=false out", b.read_gpu(o_read_only.gpu()),
               b.read_gpu(o_updated.gpu()), 0.0);
}

std::vector<std::vector<float>> gdn_states(Backend& backend, const Qwen35State& state) {
  std::vector<std::vector<float>> states;
  for (const Qwen35State::Layer& layer : state.layers)
    if (layer.conv_state) {
      states.push_back(read_all(backend, layer.conv_state->tensor()));
      states.push_back(read_all(backend, layer.recurrent_state->tensor()));
    }
  return states;
}

// Verify steps of 16 rows committed at 1..16 rows, twice over (the one commit graph, whose count is read on
// the device, is recorded at the second commit and replayed from the third): the GPU's GDN states track the
// CPU's, and the next token's logits agree.
TEST(CudaDFlash, VerifyAndCommitMatchCpu) {
  for (const fs::path& dir : fixture_dirs("qwen35", "config.json")) {
    LoadedModel cpu = LoadedModel::open(dir.string(), "cpu");
    LoadedModel gpu = LoadedModel::open(dir.string(), "cuda");
    const int vocab = cpu.model->config().vocab_size;
    const double tolerance = model_tolerance(cpu.model->config().quantization.has_value());
    std::mt19937 rng(43);
    std::uniform_int_distribution<int32_t> token(0, vocab - 1);
    auto cpu_state = cpu.model->new_state(600), gpu_state = gpu.model->new_state(600);
    std::vector<int32_t> prompt(10);
    for (int32_t& t : prompt) t = token(rng);
    cpu.model->forward(*cpu_state, prompt, ForwardOptions{});
    gpu.model->forward(*gpu_state, prompt, ForwardOptions{});
    ForwardOptions verify;
    verify.all_logits = true;
    verify.advance = false;
    for (int pass = 0; pass < 2; ++pass)
      for (int rows = 1, block_rows = 16; rows <= block_rows; ++rows) {
        std::vector<int32_t> block(static_cast<size_t>(block_rows));
        for (int32_t& t : block) t = token(rng);
        const auto before = gdn_states(*gpu.backend, *gpu_state);
        const ForwardOutput gpu_out = gpu.model->forward(*gpu_state, block, verify);
        const ForwardOutput cpu_out = cpu.model->forward(*cpu_state, block, verify);
        const std::string label = fmt::format("{} pass {} commit {}", dir.filename().string(), pass, rows);
        expect_close("verify", label + " logits", read_all(*gpu.backend, gpu_out.logits),
                     read_all(*cpu.backend, cpu_out.logits), tolerance);
        EXPECT_EQ(gdn_states(*gpu.backend, *gpu_state), before)
            << label << ": the verify step wrote the state";
        gpu.model->commit(*gpu_state, rows);
        cpu.model->commit(*cpu_state, rows);
        const auto gpu_states = gdn_states(*gpu.backend, *gpu_state),
                   cpu_states = gdn_states(*cpu.backend, *cpu_state);
        for (size_t i = 0; i < gpu_states.size(); ++i)
          expect_close("commit", fmt::format("{} state {}", label, i), gpu_states[i], cpu_states[i],
                       tolerance);
      }
    const int32_t next = token(rng);
    expect_close(
        "commit", dir.filename().string() + " next logits",
        read_all(*gpu.backend, gpu.model->forward(*gpu_state, std::span(&next, 1), ForwardOptions{}).logits),
        read_all(*cpu.backend, cpu.model->forward(*cpu_state, std::span(&next, 1), ForwardOptions{}).logits),
        tolerance);
  }
}

// The one recorded commit across pending buffers of several sizes: verify blocks of 8 rows (commits 1..8),
// then of 16 (the buffers grown after the commit was recorded), again of 16 and of 5 (shorter than the
// buffers it was recorded on), on a model replaying step graphs and one issuing every op directly: the same
// verify logits and GDN states, bit for bit.
TEST(CudaDFlash, CommitGraphAcrossBlockSizesEqualsDirectOps) {
  for (const fs::path& dir : fixture_dirs("qwen35", "config.json")) {
    LoadedModel graphed = LoadedModel::open(dir.string(), "cuda"),
                direct = LoadedModel::open(dir.string(), "cuda");
    direct.model->set_step_graphs(false);
    std::mt19937 rng(45);
    std::uniform_int_distribution<int32_t> token(0, graphed.model->config().vocab_size - 1);
    auto graphed_state = graphed.model->new_state(700), direct_state = direct.model->new_state(700);
    std::vector<int32_t> prompt(10);
    for (int32_t& t : prompt) t = token(rng);
    graphed.model->forward(*graphed_state, prompt, ForwardOptions{});
    direct.model->forward(*direct_state, prompt, ForwardOptions{});
    ForwardOptions verify;
    verify.all_logits = true;
    verify.advance = false;
    for (int block_rows : {8, 16, 16, 5})
      for (int rows = 1; rows <= block_rows; ++rows) {
        std::vector<int32_t> block(static_cast<size_t>(block_rows));
        for (int32_t& t : block) t = token(rng);
        const std::string label =
            fmt::format("{} block {} commit {}", dir.filename().string(), block_rows, rows);
        EXPECT_EQ(read_all(*graphed.backend, graphed.model->forward(*graphed_state, block, verify).logits),
                  read_all(*direct.backend, direct.model->forward(*direct_state, block, verify).logits))
            << label;
        graphed.model->commit(*graphed_state, rows);
        direct.model->commit(*direct_state, rows);
        EXPECT_EQ(gdn_states(*graphed.backend, *graphed_state), gdn_states(*direct.backend, *direct_state))
            << label;
      }
  }
}

// The DFlash fixtures on the GPU: the first step's draft logits against the oracle's, and the whole greedy
// speculative run (drafter on the GPU) gives the oracle's tokens.
TEST(CudaDFlash, DrafterMatchesOracle) {
  const auto drafters = fixture_dirs("dflash", "oracle.safetensors");
  ASSERT_FALSE(drafters.empty()) << "no drafter fixtures under " << fixtures_root();
  for (const fs::path& dir : drafters) {
    const nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir / "oracle.json"));
    const std::string target_dir =
        (fixtures_root() / "qwen35" / fs::path(meta.at("target").get<std::string>()).filename()).string();
    const int window = meta.at("draft_window").get<int>();
    const TensorStore oracle = TensorStore::open_file((dir / "oracle.safetensors").string());
    auto ints = [&](const char* name) {
      const TensorView& v = oracle.get(name);
      std::vector<int32_t> out(size_t(v.numel()));
      std::memcpy(out.data(), v.data, out.size() * sizeof(int32_t));
      return out;
    };
    const std::vector<int32_t> prompt = ints("prompt"), tokens = ints("tokens");
    LoadedModel target = LoadedModel::open(target_dir, "cuda");
    LoadedDrafter drafter = LoadedDrafter::open(dir.string(), target, target_dir);

    auto state = target.model->new_state(int(prompt.size() + tokens.size()));
    auto draft_state = drafter.model->new_state(state->max_context);
    ForwardOptions prefill;
    prefill.logits = false;
    prefill.hidden_layers = drafter.model->config().target_layer_ids;
    drafter.model->add_context(*draft_state, target.model->forward(*state, prompt, prefill).hidden);
    const TensorView& logits = oracle.get("draft_logits");
    const size_t step_floats = size_t(logits.numel()) / ints("starts").size();
    std::vector<float> first_step(step_floats);
    std::memcpy(first_step.data(), logits.data, step_floats * sizeof(float));
    expect_close("dflash", dir.filename().string() + " step 0 draft logits vs oracle",
                 read_all(*target.backend, drafter.model->draft(*draft_state, tokens[0], window).logits),
                 first_step, model_tolerance(target.model->config().quantization.has_value()));

    target.model->reset(*state);
    drafter.model->reset(*draft_state);
    GenerationOptions options;
    options.max_tokens = int(tokens.size());
    options.ignore_eos = true;
    SpeculativeOptions spec;
    spec.draft_window = window;
    const Drafter pair{*drafter.model, *draft_state};
    const GenerationResult result = generate_speculative(*target.model, *state, &pair, prompt, options, spec);
    EXPECT_EQ(result.tokens, tokens) << dir.filename();
  }
}

// The drafter's context and draft steps replayed from step graphs compute exactly what the same ops issued
// one by one compute: two drafters on one GPU target, graphs on and off, fed the same features one token at a
// time (each step recorded on its second run, replayed from the third).
TEST(CudaDFlash, DrafterStepGraphsEqualDirectOps) {
  for (const fs::path& dir : fixture_dirs("dflash", "oracle.safetensors")) {
    const nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir / "oracle.json"));
    const std::string target_dir =
        (fixtures_root() / "qwen35" / fs::path(meta.at("target").get<std::string>()).filename()).string();
    const int window = meta.at("draft_window").get<int>();
    LoadedModel target = LoadedModel::open(target_dir, "cuda");
    LoadedDrafter graphed = LoadedDrafter::open(dir.string(), target, target_dir);
    LoadedDrafter direct = LoadedDrafter::open(dir.string(), target, target_dir);
    direct.model->set_step_graphs(false);
    auto state = target.model->new_state(64);
    auto graphed_state = graphed.model->new_state(64), direct_state = direct.model->new_state(64);
    ForwardOptions features;
    features.logits = false;
    features.hidden_layers = graphed.model->config().target_layer_ids;
    auto ids_of = [&](const Tensor& ids) {
      std::vector<int32_t> out(size_t(ids.rows));
      target.backend->read(out.data(), ids);
      return out;
    };
    int32_t token = 1;
    for (int step = 0; step < 5; ++step) {
      const ForwardOutput out = target.model->forward(*state, std::span(&token, 1), features);
      graphed.model->add_context(*graphed_state, out.hidden);
      direct.model->add_context(*direct_state, out.hidden);
      const DraftOutput from_graph = graphed.model->draft(*graphed_state, token, window);
      const std::vector<float> graph_logits = read_all(*target.backend, from_graph.logits);
      const std::vector<int32_t> graph_ids = ids_of(from_graph.ids);
      const DraftOutput from_ops = direct.model->draft(*direct_state, token, window);
      const std::string label = fmt::format("{} step {}", dir.filename().string(), step);
      expect_close("dflash", label + " draft logits, step graphs vs direct", graph_logits,
                   read_all(*target.backend, from_ops.logits), 0.0);
      EXPECT_EQ(graph_ids, ids_of(from_ops.ids)) << label;
      token = graph_ids.front();
    }
  }
}

// The context step's graphs tell apart features at the same addresses read in place (adjacent columns of
// one tensor) and concatenated (rows of their own stride, overlapping here): two rows a step, the two layouts
// in turn over one buffer, every step's draft with step graphs equal to direct ops bit for bit (a graph of
// one layout replayed for the other reads other rows).
TEST(CudaDFlash, ContextGraphsTellFeatureLayoutsApart) {
  for (const fs::path& dir : fixture_dirs("dflash", "oracle.safetensors")) {
    const nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir / "oracle.json"));
    const std::string target_dir =
        (fixtures_root() / "qwen35" / fs::path(meta.at("target").get<std::string>()).filename()).string();
    LoadedModel target = LoadedModel::open(target_dir, "cuda");
    LoadedDrafter graphed = LoadedDrafter::open(dir.string(), target, target_dir);
    LoadedDrafter direct = LoadedDrafter::open(dir.string(), target, target_dir);
    direct.model->set_step_graphs(false);
    constexpr int kSteps = 6, kRows = 2;
    auto state = target.model->new_state(kSteps * kRows);
    auto graphed_state = graphed.model->new_state(kSteps * kRows);
    auto direct_state = direct.model->new_state(kSteps * kRows);
    ForwardOptions options;
    options.logits = false;
    options.hidden_layers = graphed.model->config().target_layer_ids;
    const auto layers = int64_t(options.hidden_layers.size());
    const int64_t H = target.model->config().hidden_size;
    const std::unique_ptr<Buffer> features = target.backend->alloc(DType::F32, kRows, layers * H);
    auto* base = features->tensor().ptr<float>();
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<int32_t> tokens = {2 * step + 1, 2 * step + 2};
      const ForwardOutput out = target.model->forward(*state, tokens, options);
      target.backend->copy(features->tensor(), concatenated_columns(out.hidden));
      std::vector<Tensor> handed;
      for (int64_t i = 0; i < layers; ++i)
        handed.push_back(step % 2 == 0 ? features->tensor().cols_view(i * H, H)
                                       : Tensor{DType::F32, kRows, H, H, base + i * H});
      ASSERT_EQ(concatenated_columns(handed).empty(), step % 2 == 1) << "step " << step;
      graphed.model->add_context(*graphed_state, handed);
      direct.model->add_context(*direct_state, handed);
      const std::vector<float> graph_logits =
          read_all(*target.backend, graphed.model->draft(*graphed_state, tokens.back(), 0).logits);
      const std::string label = fmt::format("{} step {}", dir.filename().string(), step);
      expect_close("dflash", label + " draft logits after the context, step graphs vs direct", graph_logits,
                   read_all(*target.backend, direct.model->draft(*direct_state, tokens.back(), 0).logits),
                   0.0);
    }
  }
}

// A drafter with a W4A16 g32 copy of the target's head (DraftHead::W4A16, quantized on the host from each
// backend's own head, so the same words): the GPU's draft logits against the CPU's, three steps, under the
// model tolerance of op_check.h (the head is a W4A16 linear of 15 rows on the GPU).
TEST(CudaDFlash, QuantizedDraftHeadMatchesCpu) {
  for (const fs::path& dir : fixture_dirs("dflash", "oracle.safetensors")) {
    const nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir / "oracle.json"));
    const std::string target_dir =
        (fixtures_root() / "qwen35" / fs::path(meta.at("target").get<std::string>()).filename()).string();
    LoadedModel cpu = LoadedModel::open(target_dir, "cpu"), gpu = LoadedModel::open(target_dir, "cuda");
    LoadedDrafter cpu_drafter = LoadedDrafter::open(dir.string(), cpu, target_dir, DraftHead::W4A16);
    LoadedDrafter gpu_drafter = LoadedDrafter::open(dir.string(), gpu, target_dir, DraftHead::W4A16);
    ASSERT_TRUE(gpu_drafter.model->head().quantized() && !gpu.model->weights().lm_head.quantized())
        << dir.filename() << ": the draft head is not the W4A16 copy";
    auto cpu_state = cpu.model->new_state(64), gpu_state = gpu.model->new_state(64);
    auto cpu_draft = cpu_drafter.model->new_state(64), gpu_draft = gpu_drafter.model->new_state(64);
    ForwardOptions features;
    features.logits = false;
    features.hidden_layers = cpu_drafter.model->config().target_layer_ids;
    const double tolerance = model_tolerance(true);
    const std::vector<int32_t> tokens = {3, 14, 15, 9, 2, 6};
    for (size_t step = 0; step < 3; ++step) {
      const std::span<const int32_t> pair(tokens.data() + 2 * step, 2);
      cpu_drafter.model->add_context(*cpu_draft, cpu.model->forward(*cpu_state, pair, features).hidden);
      gpu_drafter.model->add_context(*gpu_draft, gpu.model->forward(*gpu_state, pair, features).hidden);
      expect_close(
          "dflash", fmt::format("{} step {} draft logits, W4A16 head", dir.filename().string(), step),
          read_all(*gpu.backend, gpu_drafter.model->draft(*gpu_draft, pair.back(), 0).logits),
          read_all(*cpu.backend, cpu_drafter.model->draft(*cpu_draft, pair.back(), 0).logits), tolerance);
    }
  }
}

// Oracle drafts forcing acceptance lengths 0..15 on the GPU (verify and commit step graphs): the output is
// the GPU's plain greedy output.
TEST(CudaDFlash, SpeculativeGreedyEqualsPlainGreedy) {
  for (const fs::path& dir : fixture_dirs("qwen35", "config.json")) {
    LoadedModel gpu = LoadedModel::open(dir.string(), "cuda");
    const int vocab = gpu.model->config().vocab_size;
    const std::vector<int32_t> prompt = {5, 17, 2, 99 % vocab, 41, 7, 3, 11, 23};
    GenerationOptions options;
    options.max_tokens = 1 + 16 * 17 / 2;
    options.ignore_eos = true;
    auto state = gpu.model->new_state(int(prompt.size()) + options.max_tokens);
    const std::vector<int32_t> expected = generate(*gpu.model, *state, prompt, options).tokens;
    std::vector<int32_t> oracle = expected;
    for (int emitted = 1, a = 0; a < 15; emitted += a + 1, ++a)
      oracle[size_t(emitted + a)] = (expected[size_t(emitted + a)] + 1) % vocab;
    SpeculativeOptions spec;
    spec.oracle_drafts = oracle;
    gpu.model->reset(*state);
    const GenerationResult result = generate_speculative(*gpu.model, *state, nullptr, prompt, options, spec);
    EXPECT_EQ(result.tokens, expected) << dir.filename();
    ASSERT_GE(result.steps.size(), 16u) << dir.filename();
    for (int a = 0; a < 16; ++a) EXPECT_EQ(result.steps[size_t(a)].accepted, a) << dir.filename();
  }
}

}  // namespace
}  // namespace qspec::cuda_test
