#include "engine/served_model.h"

#include <algorithm>

#include "core/error.h"

namespace qspec {

namespace {

// The drafter, when one is asked for: loaded after its options are checked against it.
std::optional<LoadedDrafter> open_drafter(const ServedModelOptions& options, const LoadedModel& target) {
  const SpeculativeOptions& spec = options.speculative;
  if (options.draft_model_dir.empty()) {
    if (spec.spec_tokens != 0 || spec.draft_window != 0)
      fail("--spec-tokens and --draft-window need --draft-model");
    if (options.draft_head != DraftHead::Target) fail("--draft-head needs --draft-model");
    return std::nullopt;
  }
  LoadedDrafter drafter =
      LoadedDrafter::open(options.draft_model_dir, target, options.model_dir, options.draft_head);
  drafts_per_step(drafter.model.get(), spec);
  return drafter;
}

}  // namespace

ServedModel::ServedModel(const ServedModelOptions& options)
    : target_(LoadedModel::open(options.model_dir, options.backend, options.backend_options)),
      drafter_(open_drafter(options, target_)),
      speculative_(options.speculative),
      max_model_len_(options.max_model_len > 0 ? options.max_model_len
                                               : target_.model->config().max_position_embeddings),
      prefill_chunk_(options.prefill_chunk),
      tokenizer_(open_model_tokenizer(options.model_dir, options.tokenizer_dir, config().vocab_size)) {
  if (options.max_model_len < 0) fail("--max-model-len: expected > 0, got {}", options.max_model_len);
  if (options.prefill_chunk <= 0) fail("--prefill-chunk: expected > 0, got {}", options.prefill_chunk);
  if (max_model_len_ <= 0) fail("--max-model-len: the model gives no max_position_embeddings; give one");
  if (!tokenizer_) {
    chat_template_error_ = "the model has no tokenizer";
    return;
  }
  try {
    chat_template_.emplace(ChatTemplate::from_model_dir(tokenizer_->directory));
    end_of_turn_id(*tokenizer_);  // a chat reply must be able to end
  } catch (const Error& error) {
    chat_template_.reset();
    chat_template_error_ = error.what();
  }
}

void ServedModel::prepare_states(int positions) {
  if (!state_ || state_->max_context < positions) {
    const int rounded = (positions + kStatePositionsStep - 1) / kStatePositionsStep * kStatePositionsStep;
    const int capacity = std::max(positions, std::min(rounded, max_model_len_));
    state_ = target_.model->new_state(capacity);
    if (drafter_) draft_state_ = drafter_->model->new_state(capacity);
    return;  // new states start reset
  }
  target_.model->reset(*state_);
  if (drafter_) drafter_->model->reset(*draft_state_);
}

GenerationResult ServedModel::generate(std::span<const TokenId> prompt, const GenerationOptions& options,
                                       const TokenCallback& on_token) {
  prepare_states(int(prompt.size()) + options.max_tokens);
  GenerationOptions chunked = options;
  chunked.prefill_chunk = prefill_chunk_;
  if (!drafter_) return qspec::generate(*target_.model, *state_, prompt, chunked, on_token);
  const Drafter drafter{*drafter_->model, *draft_state_};
  return generate_speculative(*target_.model, *state_, &drafter, prompt, chunked, speculative_, on_token);
}

}  // namespace qspec
