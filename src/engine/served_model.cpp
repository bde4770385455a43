#include "engine/served_model.h"

#include "core/error.h"

namespace qspec {

namespace {

LoadedModel open_target(const ServedModelOptions& options) {
  // Speculative decoding (issue 5) plugs in here and in ServedModel::generate: load the drafter beside the
  // target, and call generate_speculative() instead of generate().
  if (!options.draft_model_dir.empty())
    fail("--draft-model {}: speculative decoding is not available yet in this build",
         options.draft_model_dir);
  return LoadedModel::open(options.model_dir, options.backend);
}

}  // namespace

ServedModel::ServedModel(const ServedModelOptions& options)
    : target_(open_target(options)),
      max_model_len_(options.max_model_len > 0 ? options.max_model_len
                                               : target_.model->config().max_position_embeddings),
      tokenizer_(open_model_tokenizer(options.model_dir, options.tokenizer_dir, config().vocab_size)) {
  if (options.max_model_len < 0) fail("--max-model-len: expected > 0, got {}", options.max_model_len);
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

GenerationResult ServedModel::generate(std::span<const TokenId> prompt, const GenerationOptions& options,
                                       const TokenCallback& on_token) {
  auto state = target_.model->new_state(int(prompt.size()) + options.max_tokens);
  return qspec::generate(*target_.model, *state, prompt, options, on_token);
}

}  // namespace qspec
