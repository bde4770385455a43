// Stop strings (OpenAI's `stop`) found in generated text as it streams: text that could be the start of a
// stop string is held back until the next text decides it, a stop string is never emitted, and generation
// ends at the earliest match, also when it spans several tokens.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qspec {

class StopStringMatcher {
 public:
  // `stops` must not contain an empty string (it would match before any text).
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends `text` and returns the part of the text so far that can no longer become part of a stop string.
  // After a match it returns the text before the match, and nothing on later calls.
  std::string push(std::string_view text);
  // The held-back text (nothing after a match); the matcher then holds nothing.
  std::string finish();

  // The stop string that ended the text, if one did.
  const std::optional<std::string>& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::optional<std::string> matched_;
};

}  // namespace qspec
