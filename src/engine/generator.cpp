#include "engine/generator.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/progress.h"

namespace qspec {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

DeviceArgmax::DeviceArgmax(Backend& backend, int64_t max_rows)
    : backend_(backend), ids_(backend.alloc(DType::I32, max_rows, 1)), host_ids_(size_t(max_rows)) {}

std::span<const int32_t> DeviceArgmax::operator()(const Tensor& logits) {
  if (logits.rows > ids_->tensor().rows)
    fail("argmax of {} rows; this DeviceArgmax holds {}", logits.rows, ids_->tensor().rows);
  const Tensor ids = ids_->tensor().rows_view(0, logits.rows);
  backend_.argmax(ids, logits);
  backend_.read(host_ids_.data(), ids);
  return {host_ids_.data(), size_t(logits.rows)};
}

int32_t next_token(Sampler& sampler, DeviceArgmax& device_argmax, Backend& backend, const Tensor& logits) {
  const Tensor last = logits.rows_view(logits.rows - 1, 1);
  if (sampler.greedy()) return device_argmax(last)[0];
  std::vector<float> row(size_t(logits.cols));
  backend.read(row.data(), last);
  return sampler.sample(row);
}

void check_generation_request(const Qwen35Config& config, const Qwen35State& state,
                              std::span<const int32_t> prompt, const GenerationOptions& options) {
  if (prompt.empty()) fail("prompt: expected at least one token");
  if (options.max_tokens < 0) fail("max_tokens: expected >= 0, got {}", options.max_tokens);
  if (options.prefill_chunk <= 0) fail("prefill_chunk: expected > 0, got {}", options.prefill_chunk);
  for (int32_t id : prompt)
    if (id < 0 || id >= config.vocab_size)
      fail("prompt: token id {} outside the vocabulary [0, {})", id, config.vocab_size);
  const int64_t needed = state.n_past + int64_t(prompt.size()) + options.max_tokens;
  if (needed > state.max_context)
    fail("prompt of {} tokens + max_tokens {} exceeds the context of {} tokens", prompt.size(),
         options.max_tokens, state.max_context - state.n_past);
}

std::vector<int32_t> stop_ids_of(const Qwen35Config& config, const GenerationOptions& options) {
  std::vector<int32_t> stops = options.stop_ids;
  if (!options.ignore_eos)
    stops.insert(stops.end(), config.eos_token_ids.begin(), config.eos_token_ids.end());
  return stops;
}

ForwardOutput prefill(Qwen35Model& model, Qwen35State& state, std::span<const int32_t> prompt,
                      const GenerationOptions& options, const std::vector<int>& hidden_layers,
                      const std::function<void(const ForwardOutput&)>& on_chunk) {
  Progress progress("prefill", int64_t(prompt.size()), "tokens");
  ForwardOutput out;
  for (size_t begin = 0; begin < prompt.size(); begin += size_t(options.prefill_chunk)) {
    size_t count = std::min(prompt.size() - begin, size_t(options.prefill_chunk));
    ForwardOptions fo;
    fo.logits = begin + count == prompt.size();
    fo.hidden_layers = hidden_layers;
    out = model.forward(state, prompt.subspan(begin, count), fo);
    if (on_chunk) on_chunk(out);
    progress.advance(int64_t(count));
  }
  progress.finish();
  return out;
}

GenerationResult generate(Qwen35Model& model, Qwen35State& state, std::span<const int32_t> prompt,
                          const GenerationOptions& options, const TokenCallback& on_token) {
  check_generation_request(model.config(), state, prompt, options);
  GenerationResult result;
  result.finish_reason = "length";
  if (options.max_tokens == 0) return result;

  const std::vector<int32_t> stops = stop_ids_of(model.config(), options);
  Sampler sampler(options.sampling);
  Backend& backend = model.backend();
  DeviceArgmax device_argmax(backend, 1);

  auto start = std::chrono::steady_clock::now();
  ForwardOutput out = prefill(model, state, prompt, options, {}, {});
  int32_t next = next_token(sampler, device_argmax, backend, out.logits);
  result.prefill_seconds = seconds_since(start);

  start = std::chrono::steady_clock::now();
  for (;;) {
    result.tokens.push_back(next);
    bool keep_going = !on_token || on_token(next);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      result.finish_reason = "stop";
      break;
    }
    if (!keep_going || int(result.tokens.size()) >= options.max_tokens) break;
    out = model.forward(state, std::span<const int32_t>(&next, 1), ForwardOptions{});
    next = next_token(sampler, device_argmax, backend, out.logits);
  }
  result.decode_seconds = seconds_since(start);
  return result;
}

}  // namespace qspec
