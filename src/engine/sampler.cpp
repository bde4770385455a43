#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qspec {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
    fail("temperature: expected a finite value >= 0, got {}", params.temperature);
  if (params.top_k < 0) fail("top_k: expected >= 0, got {}", params.top_k);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    fail("top_p: expected a value in (0, 1], got {}", params.top_p);
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (greedy()) return argmax(logits);
  return draw(distribution(logits));
}

const std::vector<TokenProbability>& Sampler::distribution(std::span<const float> logits) {
  if (logits.empty()) fail("sample: empty logits");
  const double temperature = greedy() ? 1.0 : params_.temperature;
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) candidates_.emplace_back(logits[i], int32_t(i));
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && size_t(params_.top_k) < keep) {
    keep = size_t(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + ptrdiff_t(keep), candidates_.end(),
                      by_logit);
    candidates_.resize(keep);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax of logit / temperature over the kept candidates, in double for a stable sum.
  distribution_.clear();
  const double top = candidates_.front().first;
  double total = 0.0;
  for (const auto& [logit, id] : candidates_) {
    distribution_.push_back({id, std::exp((double(logit) - top) / temperature)});
    total += distribution_.back().probability;
  }
  // top-p: the smallest prefix (by probability) whose mass reaches top_p.
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < distribution_.size(); ++i) {
      mass += distribution_[i].probability / total;
      if (mass >= params_.top_p) {
        distribution_.resize(i + 1);
        break;
      }
    }
  }
  double kept_total = 0.0;
  for (const TokenProbability& t : distribution_) kept_total += t.probability;
  for (TokenProbability& t : distribution_) t.probability /= kept_total;
  return distribution_;
}

int32_t Sampler::draw(std::span<const TokenProbability> distribution, int32_t excluded) {
  double total = 0.0;
  const TokenProbability* last = nullptr;
  for (const TokenProbability& t : distribution)
    if (t.id != excluded) {
      total += t.probability;
      last = &t;
    }
  if (!last || !(total > 0.0)) fail("sample: no probability mass left to draw from");
  double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  for (const TokenProbability& t : distribution) {
    if (t.id == excluded) continue;
    r -= t.probability;
    if (r < 0.0) return t.id;
  }
  return last->id;
}

double Sampler::uniform() {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
}

}  // namespace qspec
