// Generated ids as the text a client is sent, streamed: decoded into whole characters (GeneratedText), cut at
// stop strings (StopStringMatcher), and, for a chat reply of a thinking model, split into the reasoning
// (up to </think>) and the answer, as vLLM's qwen3 reasoning parser does. <think> and </think> are single
// added tokens, so the split is exact mid-stream. The answer starts at its first character other than a
// newline (the template puts "\n\n" after </think>).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/generated_text.h"
#include "engine/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace qspec {

struct ReplyDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

class ReplyText {
 public:
  // `split_reasoning`: <think>/</think> switch between reasoning and answer (a chat reply) rather than being
  // text (a raw completion); `in_reasoning`: the prompt left a <think> block open. `tokenizer` must outlive
  // this.
  ReplyText(const Tokenizer& tokenizer, bool split_reasoning, bool in_reasoning,
            std::vector<std::string> stop_strings = {});

  // The text `id` completes. A token that switches between reasoning and answer returns the text held for
  // the part it ends.
  ReplyDelta push(TokenId id);
  // Everything still held: an incomplete character (as U+FFFD) and text held for a possible stop string.
  ReplyDelta finish();

  bool in_reasoning() const { return in_reasoning_; }
  // The stop string that ended the text (generation should end), if one did.
  const std::optional<std::string>& stopped_by() const { return stops_.matched(); }

 private:
  void add(std::string text, ReplyDelta& delta);
  ReplyDelta flush();

  std::optional<TokenId> think_start_, think_end_;
  GeneratedText text_;
  StopStringMatcher stops_;
  bool split_reasoning_;
  bool in_reasoning_;
  bool answer_started_ = false;
};

}  // namespace qspec
