#include "engine/reply_text.h"

#include <algorithm>
#include <utility>

namespace qspec {

ReplyText::ReplyText(const Tokenizer& tokenizer, bool split_reasoning, bool in_reasoning,
                     std::vector<std::string> stop_strings)
    : text_(tokenizer),
      stops_(std::move(stop_strings)),
      split_reasoning_(split_reasoning),
      in_reasoning_(split_reasoning && in_reasoning) {
  if (split_reasoning) {
    think_start_ = tokenizer.find_token("<think>");
    think_end_ = tokenizer.find_token("</think>");
  }
}

ReplyDelta ReplyText::push(TokenId id) {
  if ((id == think_start_ && !in_reasoning_) || (id == think_end_ && in_reasoning_)) {
    // Text held for a stop string does not run on across the switch (vLLM sees "</think>" in between).
    ReplyDelta delta = flush();
    in_reasoning_ = !in_reasoning_;
    return delta;
  }
  ReplyDelta delta;
  add(stops_.push(text_.push(id)), delta);
  return delta;
}

ReplyDelta ReplyText::finish() {
  return flush();
}

ReplyDelta ReplyText::flush() {
  ReplyDelta delta;
  add(stops_.push(text_.finish()), delta);
  add(stops_.finish(), delta);
  return delta;
}

void ReplyText::add(std::string text, ReplyDelta& delta) {
  if (in_reasoning_) {
    delta.reasoning += text;
    return;
  }
  if (split_reasoning_ && !answer_started_) {
    text.erase(0, std::min(text.find_first_not_of('\n'), text.size()));
    answer_started_ = !text.empty();
  }
  delta.content += text;
}

}  // namespace qspec
