// What `qspec serve` runs requests on: the target model with its tokenizer and chat template (each optional:
// a checkpoint without a tokenizer serves token ids only) and, with --draft-model, a DFlash drafter.
// Requests run one at a time (the scheduler's worker thread); the tokenizer and the template are safe to use
// from other threads meanwhile.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "engine/generator.h"
#include "engine/loaded_model.h"
#include "engine/model_tokenizer.h"
#include "engine/speculative.h"
#include "tokenizer/chat_template.h"

namespace qspec {

struct ServedModelOptions {
  std::string model_dir;
  std::string draft_model_dir;  // empty: plain decoding
  DraftHead draft_head = DraftHead::Target;
  SpeculativeOptions speculative;  // spec_tokens and draft_window, with a drafter only
  std::string tokenizer_dir;       // empty: the model directory's own tokenizer, if any
  std::string backend = "cpu";
  BackendOptions backend_options;
  int max_model_len = 0;                                  // 0: the model's max_position_embeddings
  int prefill_chunk = GenerationOptions{}.prefill_chunk;  // prompt tokens per forward pass
};

class ServedModel {
 public:
  // Throws qspec::Error naming the directory, file or option.
  explicit ServedModel(const ServedModelOptions& options);

  const Qwen35Config& config() const { return target_.model->config(); }
  int max_model_len() const { return max_model_len_; }
  const ModelTokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }
  // Null when the tokenizer directory has no usable chat template; chat_template_error() then says why.
  const ChatTemplate* chat_template() const { return chat_template_ ? &*chat_template_ : nullptr; }
  const std::string& chat_template_error() const { return chat_template_error_; }

  bool speculative() const { return drafter_.has_value(); }

  // One request, plain decoding or speculative decoding when a drafter is loaded (same callback semantics;
  // greedy output equal to plain decoding's, sampled output of the same distribution), the prompt prefilled
  // in chunks of the options' prefill_chunk (options.prefill_chunk is not read). The states are kept
  // between requests and reset (so step graphs recorded on them are replayed by later requests); they grow
  // when a request needs more positions. Call from one thread at a time.
  GenerationResult generate(std::span<const TokenId> prompt, const GenerationOptions& options,
                            const TokenCallback& on_token);

 private:
  // The states of the last request, reset for the next one: grown to prompt + max_tokens positions when
  // short, rounded up to kStatePositionsStep (at most max_model_len).
  void prepare_states(int positions);

  static constexpr int kStatePositionsStep = 4096;
  LoadedModel target_;
  std::optional<LoadedDrafter> drafter_;
  std::unique_ptr<Qwen35State> state_;
  std::unique_ptr<DFlashState> draft_state_;
  SpeculativeOptions speculative_;
  int max_model_len_;
  int prefill_chunk_;
  std::optional<ModelTokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::string chat_template_error_;
};

}  // namespace qspec
