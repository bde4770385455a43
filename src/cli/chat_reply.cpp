#include "cli/chat_reply.h"

#include <fmt/format.h>

namespace qspec::cli {

namespace {

constexpr const char* kDim = "\x1b[2m";
constexpr const char* kNormal = "\x1b[0m";

}  // namespace

ChatReply::ChatReply(const Tokenizer& tokenizer, bool in_reasoning, bool terminal, std::FILE* out)
    : text_(tokenizer, /*split_reasoning=*/true, in_reasoning), terminal_(terminal), out_(out) {
  if (text_.in_reasoning()) mark_reasoning(true);
}

void ChatReply::push(TokenId id) {
  const bool was_reasoning = text_.in_reasoning();
  print(text_.push(id));
  if (text_.in_reasoning() != was_reasoning) mark_reasoning(text_.in_reasoning());
  std::fflush(out_);
}

std::string ChatReply::finish() {
  print(text_.finish());
  if (text_.in_reasoning()) mark_reasoning(false);
  fmt::print(out_, "\n");
  std::fflush(out_);
  return answer_;
}

void ChatReply::print(const ReplyDelta& delta) {
  fmt::print(out_, "{}{}", delta.reasoning, delta.content);
  answer_ += delta.content;
}

void ChatReply::mark_reasoning(bool entering) {
  if (terminal_) {
    fmt::print(out_, "{}", entering ? kDim : kNormal);
  } else {
    fmt::print(out_, "{}", entering ? "[thinking]\n" : "\n[/thinking]\n");
  }
}

}  // namespace qspec::cli
