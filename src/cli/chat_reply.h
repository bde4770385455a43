// One assistant reply of `qspec chat`, printed as its tokens arrive: the reasoning (between <think> and
// </think>) set apart from the answer — dimmed on a terminal, between [thinking] and [/thinking] otherwise —
// and the answer kept for the conversation history without the think block, as the template expects.
#pragma once

#include <cstdio>
#include <string>

#include "engine/reply_text.h"
#include "tokenizer/tokenizer.h"

namespace qspec::cli {

class ChatReply {
 public:
  // `in_reasoning`: the prompt ended inside an open <think> block (thinking on). `terminal`: `out` is a
  // terminal, so reasoning is dimmed rather than marked. `tokenizer` must outlive this.
  ChatReply(const Tokenizer& tokenizer, bool in_reasoning, bool terminal, std::FILE* out);

  // Prints the text `id` completes.
  void push(TokenId id);
  // Prints what is held, ends the line and returns the answer (without reasoning).
  std::string finish();

 private:
  void print(const ReplyDelta& delta);
  void mark_reasoning(bool entering);

  ReplyText text_;
  bool terminal_;
  std::FILE* out_;
  std::string answer_;
};

}  // namespace qspec::cli
