// Plain (non-speculative) generation: prefill the prompt in chunks, then one token per step.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "model/qwen35.h"

namespace qspec {

struct GenerationOptions {
  int max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;
  std::vector<int32_t> stop_ids;  // in addition to the model's EOS ids
  int prefill_chunk = 512;        // tokens per prefill step; bounds activation memory on long prompts
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids, including a final stop id if one was produced
  std::string finish_reason;    // "stop" or "length"
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
};

// on_token is called with each generated id as soon as it is chosen; returning false stops generation.
using TokenCallback = std::function<bool(int32_t)>;

GenerationResult generate(Qwen35Model& model, Qwen35State& state, std::span<const int32_t> prompt,
                          const GenerationOptions& options, const TokenCallback& on_token = {});

}  // namespace qspec
