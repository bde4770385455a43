#include "engine/stop_strings.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace qspec {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& stop : stops_)
    if (stop.empty()) fail("stop: a stop string must not be empty");
}

std::string StopStringMatcher::push(std::string_view text) {
  if (matched_) return {};
  held_ += text;
  // The earliest match wins; of two starting at the same place, the longer one (it covers more text).
  size_t match_at = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t at = held_.find(stop);
    if (at == std::string::npos) continue;
    if (at < match_at || (at == match_at && stop.size() > matched_->size())) {
      match_at = at;
      matched_ = stop;
    }
  }
  if (matched_) {
    std::string before = held_.substr(0, match_at);
    held_.clear();
    return before;
  }
  // Hold the longest end of the text that is the beginning of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_)
    for (size_t length = std::min(stop.size() - 1, held_.size()); length > hold; --length)
      if (held_.compare(held_.size() - length, length, stop, 0, length) == 0) {
        hold = length;
        break;
      }
  std::string ready = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return ready;
}

std::string StopStringMatcher::finish() {
  return std::exchange(held_, std::string());
}

}  // namespace qspec
