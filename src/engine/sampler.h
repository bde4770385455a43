// Token choice from one row of logits: greedy (temperature 0) or seeded sampling with temperature, top-k,
// top-p.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace qspec {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: all
  float top_p = 1.0f;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest logit (the lowest index on ties, like torch.argmax).
int32_t argmax(std::span<const float> logits);

}  // namespace qspec
