// End to end: the Qwen3.5 forward (model/qwen35.h) on the CUDA backend against the same forward on the CPU
// backend, on every fixture checkpoint under tests/fixtures/qwen35 (tools/oracle/make_qwen35_fixtures.py):
// prefill logits of every row for prompts around the GDN chunk of 64, then greedy decode steps whose logits
// and tokens must agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/launchers.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/qwen35.h"
#include "op_check.h"

namespace qspec::cuda_test {
namespace {

namespace fs = std::filesystem;

// Prompts of more than kLinearMmaMaxRows tokens take the BF16 prefill (the linears' x and dequantized
// weights and attention's operands rounded to BF16, beyond kGdnChunkedSplitMaxTokens the chunked GDN's too;
// ~2e-3 of the largest output per linear); the small random fixture models amplify that to 2-8e-2 of the
// largest logit over their 4-6 layers, and the decode steps after it inherit ~1-2e-2 (seen on the H200). From
// there on logits are held to this; a greedy token is compared where the CPU's top1-top2 margin is at least
// the 1e-2 and twice the step's largest logit difference (a smaller margin can flip under errors the
// logit check already allows).
constexpr double kBf16PrefillLogitTolerance = 1e-1;
constexpr float kBf16PrefillGreedyMargin = 1e-2f;

float largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  float largest = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, std::fabs(a[i] - b[i]));
  return largest;
}
constexpr int kDecodeSteps = 16;
constexpr int kMaxContext = 512;

fs::path fixtures_root() {
  if (const char* dir = std::getenv("QSPEC_FIXTURES_DIR")) return fs::path(dir) / "qwen35";
  return fs::path("tests") / "fixtures" / "qwen35";
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  if (fs::exists(fixtures_root()))
    for (const auto& entry : fs::directory_iterator(fixtures_root()))
      if (fs::exists(entry.path() / "config.json")) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<float> read_logits(Backend& backend, const Tensor& logits) {
  std::vector<float> values(static_cast<size_t>(logits.numel()));
  backend.read(values.data(), logits);
  return values;
}

// The argmax of a row and its margin over the runner-up.
std::pair<int32_t, float> top_token(const std::vector<float>& row) {
  const auto best = std::max_element(row.begin(), row.end());
  float second = -INFINITY;
  for (auto it = row.begin(); it != row.end(); ++it)
    if (it != best) second = std::max(second, *it);
  return {static_cast<int32_t>(best - row.begin()), *best - second};
}

class CudaModel : public testing::TestWithParam<std::string> {};

// One fixture on the CUDA backend made with `options` against the CPU.
void check_against_cpu(const std::string& name, const BackendOptions& options) {
  const fs::path dir = fixtures_root() / name;
  const Qwen35Config config = Qwen35Config::load(dir.string());
  const TensorStore store = TensorStore::open_dir(dir.string());
  const std::unique_ptr<Backend> cpu_backend = make_cpu_backend();
  const std::unique_ptr<Backend> gpu_backend = make_cuda_backend(options);
  Qwen35Model cpu_model(config, store, *cpu_backend);
  Qwen35Model gpu_model(config, store, *gpu_backend);
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token_ids(0, config.vocab_size - 1);

  // 20 tokens: the FP32-class prefill (tensor-core linears, split-BF16 attention); 65 and 200: the BF16 one
  // (W4A16 weights: cuBLAS on their BF16 copies, or without copies the W4A16 kernel at 65 and the
  // dequantization at 200).
  for (int prompt_length : {1, 20, 65, 200}) {
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_length));
    for (int32_t& id : prompt) id = token_ids(rng);
    auto cpu_state = cpu_model.new_state(kMaxContext);
    auto gpu_state = gpu_model.new_state(kMaxContext);
    ForwardOptions prefill;
    prefill.all_logits = true;
    const std::vector<float> cpu_prefill =
        read_logits(*cpu_backend, cpu_model.forward(*cpu_state, prompt, prefill).logits);
    const std::vector<float> gpu_prefill =
        read_logits(*gpu_backend, gpu_model.forward(*gpu_state, prompt, prefill).logits);
    const std::string label = fmt::format("e2e {}{} prompt {}", name,
                                          options.bf16_copies ? "" : " (no BF16 copies)", prompt_length);
    const bool bf16_prefill = prompt_length > cuda::kLinearMmaMaxRows;
    const bool quantized = config.quantization.has_value();
    const double tolerance = bf16_prefill ? kBf16PrefillLogitTolerance : model_tolerance(quantized);
    const float margin_rule = bf16_prefill ? kBf16PrefillGreedyMargin : greedy_margin(quantized);
    expect_close("e2e", label + " prefill logits (all rows)", gpu_prefill, cpu_prefill, tolerance);

    // Greedy decode, both fed the CPU's token; tokens must agree wherever the CPU's choice is clear.
    const auto vocab = static_cast<size_t>(config.vocab_size);
    std::vector<float> cpu_row(cpu_prefill.end() - static_cast<std::ptrdiff_t>(vocab), cpu_prefill.end());
    std::vector<float> gpu_row(gpu_prefill.end() - static_cast<std::ptrdiff_t>(vocab), gpu_prefill.end());
    std::vector<float> cpu_steps, gpu_steps;
    int compared = 0, differing = 0;
    std::string differences;
    for (int step = 0; step < kDecodeSteps; ++step) {
      const auto [cpu_token, margin] = top_token(cpu_row);
      const int32_t gpu_token = top_token(gpu_row).first;
      const float step_rule =
          bf16_prefill ? std::max(margin_rule, 2.0f * largest_difference(gpu_row, cpu_row)) : margin_rule;
      if (margin >= step_rule) {
        ++compared;
        if (gpu_token != cpu_token) {
          ++differing;
          differences += fmt::format(" step {}: {} vs {} (margin {}, needed {});", step, gpu_token, cpu_token,
                                     margin, step_rule);
        }
      }
      const std::vector<int32_t> next{cpu_token};
      cpu_row = read_logits(*cpu_backend, cpu_model.forward(*cpu_state, next, ForwardOptions{}).logits);
      gpu_row = read_logits(*gpu_backend, gpu_model.forward(*gpu_state, next, ForwardOptions{}).logits);
      cpu_steps.insert(cpu_steps.end(), cpu_row.begin(), cpu_row.end());
      gpu_steps.insert(gpu_steps.end(), gpu_row.begin(), gpu_row.end());
    }
    expect_close("e2e", fmt::format("{} decode logits ({} steps)", label, kDecodeSteps), gpu_steps, cpu_steps,
                 tolerance);
    recorded_checks().push_back(CheckResult{
        "e2e",
        fmt::format("{} greedy tokens differing (of {} with margin >= {}{})", label, compared, margin_rule,
                    bf16_prefill ? " and twice the step's largest logit difference" : ""),
        static_cast<double>(differing), 0.0});
    EXPECT_EQ(differing, 0) << label << ": " << differing << " of " << compared
                            << " greedy tokens differ:" << differences;
    EXPECT_GT(compared, kDecodeSteps / 2) << label << ": too few clear greedy choices to compare";
  }
}

TEST_P(CudaModel, LogitsAndGreedyTokensMatchCpu) {
  check_against_cpu(GetParam(), BackendOptions{});
  if (Qwen35Config::load((fixtures_root() / GetParam()).string()).quantization.has_value())
    check_against_cpu(GetParam(), BackendOptions{.bf16_copies = false});
}

// Replayed step graphs compute exactly what the same ops issued one by one compute: decode steps (recorded on
// the second step, replayed after) and repeated 16-token verify steps, bit for bit.
TEST_P(CudaModel, StepGraphsEqualDirectOps) {
  const fs::path dir = fixtures_root() / GetParam();
  const Qwen35Config config = Qwen35Config::load(dir.string());
  const TensorStore store = TensorStore::open_dir(dir.string());
  const std::unique_ptr<Backend> backend = make_cuda_backend();
  Qwen35Model graphed(config, store, *backend);
  Qwen35Model direct(config, store, *backend);
  direct.set_step_graphs(false);
  auto graphed_state = graphed.new_state(kMaxContext);
  auto direct_state = direct.new_state(kMaxContext);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token_ids(0, config.vocab_size - 1);
  ForwardOptions all_rows;
  all_rows.all_logits = true;
  for (int step = 0; step < 12; ++step) {
    const int tokens = step % 3 == 2 ? 16 : 1;
    std::vector<int32_t> ids(static_cast<size_t>(tokens));
    for (int32_t& id : ids) id = token_ids(rng);
    const std::vector<float> a = read_logits(*backend, graphed.forward(*graphed_state, ids, all_rows).logits);
    const std::vector<float> b = read_logits(*backend, direct.forward(*direct_state, ids, all_rows).logits);
    ASSERT_EQ(a.size(), b.size());
    // Equal NaNs would compare equal bit for bit: the logits must be finite too.
    EXPECT_TRUE(std::all_of(a.begin(), a.end(), [](float v) { return std::isfinite(v); }))
        << GetParam() << " step " << step << ": non-finite logits";
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << GetParam() << " step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModel, testing::ValuesIn(fixture_names()),
                         [](const testing::TestParamInfo<std::string>& param_info) {
                           std::string name = param_info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Without fixtures the parameterised test above has no instances; fail rather than pass silently.
TEST(CudaModelFixtures, FixturesArePresent) {
  EXPECT_FALSE(fixture_names().empty()) << "no Qwen3.5 fixtures under " << fixtures_root();
}

}  // namespace
}  // namespace qspec::cuda_test
