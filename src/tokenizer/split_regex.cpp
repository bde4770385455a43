#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/split_regex.h"

#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/onig_pattern.h"

namespace qspec {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return std::string(reinterpret_cast<const char*>(buffer));
}

}  // namespace

struct SplitRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

struct SplitRegex::Matcher::MatchData {
  pcre2_match_data* data = nullptr;
  ~MatchData() { pcre2_match_data_free(data); }
};

SplitRegex::SplitRegex(const std::string& pattern, std::string_view where)
    : code_(std::make_unique<Code>()), where_(where) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;  // an offset into the translated pattern: not shown
  const std::string translated = onig_to_pcre2(pattern);
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (code_->code == nullptr) {
    fail("{}: the split regex \"{}\" does not compile (as PCRE2): {}", where_, pattern, pcre2_message(error));
  }
  // JIT is only a speed-up: the interpreter gives the same matches where JIT is unavailable.
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);
}

SplitRegex::~SplitRegex() = default;

SplitRegex::Matcher::Matcher(const SplitRegex& regex, std::string_view text)
    : regex_(regex), text_(text), data_(std::make_unique<MatchData>()) {
  data_->data = pcre2_match_data_create_from_pattern(regex.code_->code, nullptr);
  if (data_->data == nullptr) fail("{}: out of memory for regex match data", regex.where_);
}

SplitRegex::Matcher::~Matcher() = default;

const SplitRegex::Match* SplitRegex::Matcher::next() {
  while (search_from_ < text_.size()) {
    // The text was validated once by the caller; PCRE2 would otherwise re-check the rest of it on every
    // match.
    const int result = pcre2_match(regex_.code_->code, reinterpret_cast<PCRE2_SPTR>(text_.data()),
                                   text_.size(), search_from_, PCRE2_NO_UTF_CHECK, data_->data, nullptr);
    if (result == PCRE2_ERROR_NOMATCH) return nullptr;
    if (result < 0) fail("{}: the split regex failed on the input: {}", regex_.where_, pcre2_message(result));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data_->data);
    current_ = {ovector[0], ovector[1]};
    if (current_.end > current_.begin) {
      search_from_ = current_.end;
      return &current_;
    }
    // An empty match is not a piece (as in HF); step over one whole code point to never loop.
    search_from_ = current_.begin + 1;
    while (search_from_ < text_.size() && (static_cast<unsigned char>(text_[search_from_]) & 0xC0) == 0x80) {
      ++search_from_;
    }
  }
  return nullptr;
}

}  // namespace qspec
