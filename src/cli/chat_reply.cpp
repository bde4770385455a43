#include "cli/chat_reply.h"

#include <fmt/format.h>

#include <algorithm>

namespace qspec::cli {

namespace {

constexpr const char* kDim = "\x1b[2m";
constexpr const char* kNormal = "\x1b[0m";

}  // namespace

ChatReply::ChatReply(const Tokenizer& tokenizer, bool in_reasoning, bool terminal, std::FILE* out)
    : think_start_(tokenizer.find_token("<think>")),
      think_end_(tokenizer.find_token("</think>")),
      text_(tokenizer),
      terminal_(terminal),
      out_(out) {
  if (in_reasoning) enter_reasoning();
}

void ChatReply::push(TokenId id) {
  // <think> and </think> are single added tokens, so the switch is exact even mid-stream.
  if (id == think_start_ && !in_reasoning_) {
    print(text_.finish());
    enter_reasoning();
  } else if (id == think_end_ && in_reasoning_) {
    print(text_.finish());
    leave_reasoning();
  } else {
    print(text_.push(id));
  }
  std::fflush(out_);
}

std::string ChatReply::finish() {
  print(text_.finish());
  if (in_reasoning_) leave_reasoning();
  fmt::print(out_, "\n");
  std::fflush(out_);
  return answer_;
}

void ChatReply::print(const std::string& text) {
  if (in_reasoning_) {
    fmt::print(out_, "{}", text);
    return;
  }
  // The template puts "\n\n" between </think> and the answer; the answer starts at its first other character.
  const std::string shown =
      answer_.empty() ? text.substr(std::min(text.find_first_not_of('\n'), text.size())) : text;
  answer_ += shown;
  fmt::print(out_, "{}", shown);
}

void ChatReply::enter_reasoning() {
  in_reasoning_ = true;
  fmt::print(out_, "{}", terminal_ ? kDim : "[thinking]\n");
}

void ChatReply::leave_reasoning() {
  in_reasoning_ = false;
  fmt::print(out_, "{}", terminal_ ? kNormal : "\n[/thinking]\n");
}

}  // namespace qspec::cli
