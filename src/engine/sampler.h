// Token choice from one row of logits: greedy (temperature 0) or seeded sampling with temperature, top-k,
// top-p.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "backend/argmax.h"

namespace qspec {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: all
  float top_p = 1.0f;
  uint64_t seed = 0;
};

struct TokenProbability {
  int32_t id;
  double probability;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);
  const SamplingParams& params() const { return params_; }
  bool greedy() const { return params_.temperature == 0.0f; }

  // What sample() draws from when not greedy: the candidates top-k and top-p keep, most likely first, with
  // probabilities (softmax of logit / temperature over them) summing to 1. Valid until the next call.
  const std::vector<TokenProbability>& distribution(std::span<const float> logits);
  // One draw from `distribution` with `excluded` left out and the rest renormalised (-1: nothing left out),
  // the residual of speculative sampling. The distribution must keep some mass besides `excluded`.
  int32_t draw(std::span<const TokenProbability> distribution, int32_t excluded = -1);
  // A uniform number in [0, 1) from the same generator.
  double uniform();

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<TokenProbability> distribution_;
};

}  // namespace qspec
