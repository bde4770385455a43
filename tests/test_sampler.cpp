#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "core/error.h"
#include "engine/sampler.h"

namespace qspec {
namespace {

TEST(Sampler, ArgmaxTakesTheFirstOfTies) {
  EXPECT_EQ(argmax(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f}), 1);
  EXPECT_THROW(argmax(std::vector<float>{}), Error);
}

TEST(Sampler, TemperatureZeroIsGreedy) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 0.3f, 0.2f}), 1);
}

TEST(Sampler, SameSeedSameSequenceAndTopKOneIsGreedy) {
  std::vector<float> logits = {1.0f, 1.2f, 0.9f, 1.1f, 0.0f};
  SamplingParams p{1.0f, 0, 1.0f, 1234};
  Sampler a(p), b(p);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 50; ++i) {
    sa.push_back(a.sample(logits));
    sb.push_back(b.sample(logits));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_GT(std::set<int32_t>(sa.begin(), sa.end()).size(), 1u);  // it really samples
  Sampler top1(SamplingParams{1.0f, 1, 1.0f, 7});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(top1.sample(logits), 1);
  Sampler nucleus(SamplingParams{1.0f, 0, 1e-6f, 7});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(nucleus.sample(logits), 1);
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  // p = softmax([0, ln 3]) = [0.25, 0.75]; 20,000 draws: the standard error of the frequency is 0.003.
  std::vector<float> logits = {0.0f, std::log(3.0f)};
  Sampler s(SamplingParams{1.0f, 0, 1.0f, 99});
  int ones = 0;
  for (int i = 0; i < 20000; ++i) ones += s.sample(logits);
  EXPECT_NEAR(ones / 20000.0, 0.75, 0.015);
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_THROW(Sampler(SamplingParams{-1.0f, 0, 1.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, -2, 1.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 0, 0.0f, 0}), Error);
  EXPECT_THROW(Sampler(SamplingParams{1.0f, 0, 1.5f, 0}), Error);
}

}  // namespace
}  // namespace qspec
