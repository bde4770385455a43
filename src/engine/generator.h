// Plain (non-speculative) generation: prefill the prompt in chunks, then one token per step.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
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
  // Tokens per prefill step; bounds activation memory on long prompts (Qwen3.5-4B: ~0.43 MB per token of
  // chunk, ~0.9 GB at 2048). Every chunk re-reads all weights (W4A16: dequantizes them again, ~2-3 ms on an
  // H200), so a 2048-token prompt is one chunk.
  int prefill_chunk = 2048;
};

// One speculative step: the drafts the target verified and how many of them it accepted.
struct SpeculativeStep {
  std::vector<int32_t> drafts;
  int accepted = 0;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids, including a final stop id if one was produced
  std::string finish_reason;    // "stop" or "length"
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  // Speculative decoding only: drafts verified and accepted in all steps, and each step.
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<SpeculativeStep> steps;
};

// on_token is called with each generated id as soon as it is chosen; returning false stops generation.
using TokenCallback = std::function<bool(int32_t)>;

GenerationResult generate(Qwen35Model& model, Qwen35State& state, std::span<const int32_t> prompt,
                          const GenerationOptions& options, const TokenCallback& on_token = {});

// What generate() and generate_speculative() share.
// Throws Error naming the option when the prompt or options do not fit the model and the state's context.
void check_generation_request(const Qwen35Config& config, const Qwen35State& state,
                              std::span<const int32_t> prompt, const GenerationOptions& options);
// The ids that end generation: options.stop_ids and, unless ignore_eos, the model's EOS ids.
std::vector<int32_t> stop_ids_of(const Qwen35Config& config, const GenerationOptions& options);
// Feeds the prompt in chunks of options.prefill_chunk; on_chunk sees each chunk's output (hidden states of
// `hidden_layers`). Returns the last chunk's output, whose logits are the last row's.
ForwardOutput prefill(Qwen35Model& model, Qwen35State& state, std::span<const int32_t> prompt,
                      const GenerationOptions& options, const std::vector<int>& hidden_layers,
                      const std::function<void(const ForwardOutput&)>& on_chunk);
// Greedy choice on the device: the argmax of logits rows (Backend::argmax), read back as ids, so that no
// logits cross to the host. Holds its buffers; a call allocates nothing.
class DeviceArgmax {
 public:
  DeviceArgmax(Backend& backend, int64_t max_rows);
  // The ids of the rows of `logits` (at most max_rows of them), valid until the next call.
  std::span<const int32_t> operator()(const Tensor& logits);

 private:
  Backend& backend_;
  std::unique_ptr<Buffer> ids_;
  std::vector<int32_t> host_ids_;
};

// The token after the last row of `logits`: its argmax on the device when the sampler is greedy, else a draw
// from the row read to the host.
int32_t next_token(Sampler& sampler, DeviceArgmax& device_argmax, Backend& backend, const Tensor& logits);
// Seconds since `start`.
double seconds_since(std::chrono::steady_clock::time_point start);

}  // namespace qspec
