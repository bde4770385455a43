// Speculative sampling is exact: on a tiny model the tokens it emits after the first follow the same
// distribution as plain sampling's (a chi-square test of homogeneity over thousands of seeded runs), and a
// fixed seed reproduces the same output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/speculative.h"

namespace qspec {
namespace {

constexpr int kRuns = 3000;                // per side
constexpr double kNormalQuantile = 3.090;  // z of the one-sided 0.001 level: the test's significance level
constexpr int kPositions = 2;  // output positions 1 and 2 (position 0 is the prefill's, the same code)

// Pearson's statistic of a 2 x C contingency table (categories with an expected count below 5 pooled) and its
// degrees of freedom.
std::pair<double, int> chi_square(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
  std::map<int32_t, std::pair<int, int>> table;
  for (const auto& [id, count] : a) table[id].first += count;
  for (const auto& [id, count] : b) table[id].second += count;
  std::vector<std::pair<int, int>> cells;
  std::pair<int, int> pooled{0, 0};
  for (const auto& [id, counts] : table) {
    if ((counts.first + counts.second) / 2.0 < 5.0) {
      pooled.first += counts.first;
      pooled.second += counts.second;
    } else {
      cells.push_back(counts);
    }
  }
  if (pooled.first + pooled.second > 0) cells.push_back(pooled);
  double statistic = 0;
  for (const auto& [x, y] : cells) {
    const double expected = (x + y) / 2.0;  // equal sample sizes
    statistic += (x - expected) * (x - expected) / expected + (y - expected) * (y - expected) / expected;
  }
  return {statistic, int(cells.size()) - 1};
}

// The chi-square quantile at the test's level (Wilson-Hilferty).
double critical_value(int df) {
  const double k = df;
  const double t = 1.0 - 2.0 / (9.0 * k) + kNormalQuantile * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

class SpeculativeSampling : public testing::Test {
 protected:
  void SetUp() override {
    loaded_ = LoadedModel::open(std::string(QSPEC_FIXTURES_DIR) + "/qwen35/causal-f32-tiny", "cpu");
    state_ = loaded_.model->new_state(int(prompt_.size()) + 4);
    options_.max_tokens = 1 + kPositions;
    options_.ignore_eos = true;
    options_.sampling = {1.0f, 40, 0.95f, 0};
    GenerationOptions greedy = options_;
    greedy.sampling = {};
    // Drafts = the greedy continuation: likely tokens, so both acceptance and rejection happen often.
    spec_.oracle_drafts = run(greedy, false);
    spec_.spec_tokens = kPositions;
  }

  std::vector<int32_t> run(const GenerationOptions& options, bool speculative) {
    loaded_.model->reset(*state_);
    if (speculative)
      return generate_speculative(*loaded_.model, *state_, nullptr, prompt_, options, spec_).tokens;
    return generate(*loaded_.model, *state_, prompt_, options).tokens;
  }

  // Per output position 1.., the counts of each token over kRuns runs with seeds first_seed...
  std::vector<std::map<int32_t, int>> histograms(GenerationOptions options, bool speculative,
                                                 uint64_t first_seed) {
    std::vector<std::map<int32_t, int>> counts(kPositions);
    for (int i = 0; i < kRuns; ++i) {
      options.sampling.seed = first_seed + uint64_t(i);
      const std::vector<int32_t> tokens = run(options, speculative);
      for (int p = 0; p < kPositions; ++p) ++counts[size_t(p)][tokens[size_t(p + 1)]];
    }
    return counts;
  }

  LoadedModel loaded_;
  std::unique_ptr<Qwen35State> state_;
  const std::vector<int32_t> prompt_ = {17, 4, 99, 200, 31, 8};
  GenerationOptions options_;
  SpeculativeOptions spec_;
};

TEST_F(SpeculativeSampling, TokenDistributionEqualsPlainSampling) {
  const auto plain = histograms(options_, false, 1);
  const auto speculative = histograms(options_, true, 1 + kRuns);
  for (int p = 0; p < kPositions; ++p) {
    const auto [statistic, df] = chi_square(plain[size_t(p)], speculative[size_t(p)]);
    ASSERT_GE(df, 2) << "position " << p + 1 << ": too few distinct tokens to test";
    EXPECT_LT(statistic, critical_value(df)) << "position " << p + 1 << ", " << df << " degrees of freedom";
    std::printf(
        "[ sampling ] position %d: chi-square %.1f, %d degrees of freedom, critical value (0.001) %.1f\n",
        p + 1, statistic, df, critical_value(df));
  }
  // The same test tells apart a slightly different distribution (temperature 0.8), so it has power.
  GenerationOptions cooler = options_;
  cooler.sampling.temperature = 0.8f;
  const auto other = histograms(cooler, false, 1 + 2 * kRuns);
  const auto [statistic, df] = chi_square(plain[1], other[1]);
  EXPECT_GT(statistic, critical_value(df)) << "the chi-square test cannot see a temperature change";
}

TEST_F(SpeculativeSampling, FixedSeedReproducesTheOutput) {
  GenerationOptions options = options_;
  options.max_tokens = 3;
  options.sampling.seed = 1234;
  const std::vector<int32_t> first = run(options, true);
  EXPECT_EQ(run(options, true), first);
  int differing = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    options.sampling.seed = seed;
    differing += run(options, true) != first;
  }
  EXPECT_GT(differing, 0) << "every seed gives the same output: nothing is sampled";
}

}  // namespace
}  // namespace qspec
