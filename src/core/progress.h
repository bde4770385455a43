// Progress of long work on stderr: a live line on a terminal, a line every few seconds otherwise (CI logs).
// Silent for work that finishes within the first second.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace qspec {

class Progress {
 public:
  Progress(std::string what, int64_t total, std::string unit);
  void advance(int64_t amount);
  void finish();

 private:
  void print(bool final_line);

  std::string what_, unit_;
  int64_t total_ = 0, done_ = 0;
  std::chrono::steady_clock::time_point start_, last_print_;
  bool printed_ = false;
  bool tty_ = false;
};

}  // namespace qspec
