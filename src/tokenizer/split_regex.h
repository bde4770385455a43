// The pre-tokenizer: splits normalized text into the pieces BPE runs on, with the tokenizer's regex in
// "isolated" mode (every match is a piece, and so is every gap between matches). PCRE2 with UTF + UCP, so
// \p{L}, \p{N}, \p{M} are Unicode classes (the pattern is first translated to match as in HF tokenizers'
// Oniguruma: onig_pattern.h), JIT-compiled.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace qspec {

class SplitRegex {
 public:
  // Throws qspec::Error naming `where` (the file and field the pattern came from) when it does not compile.
  SplitRegex(const std::string& pattern, std::string_view where);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Calls on_piece(piece) for each piece of `text` (valid UTF-8) in order. Thread-safe.
  template <typename OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) const {
    Matcher matcher(*this, text);
    size_t gap_begin = 0;
    while (const auto match = matcher.next()) {
      if (match->begin > gap_begin) on_piece(text.substr(gap_begin, match->begin - gap_begin));
      on_piece(text.substr(match->begin, match->end - match->begin));
      gap_begin = match->end;
    }
    if (gap_begin < text.size()) on_piece(text.substr(gap_begin));
  }

 private:
  struct Match {
    size_t begin, end;
  };
  // Walks the non-empty matches of one text; holds the per-call PCRE2 match data.
  class Matcher {
   public:
    Matcher(const SplitRegex& regex, std::string_view text);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    const Match* next();

   private:
    const SplitRegex& regex_;
    std::string_view text_;
    size_t search_from_ = 0;
    struct MatchData;
    std::unique_ptr<MatchData> data_;
    Match current_{};
  };

  struct Code;
  std::unique_ptr<Code> code_;
  std::string where_;
};

}  // namespace qspec
