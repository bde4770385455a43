#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

namespace qspec {

Progress::Progress(std::string what, int64_t total, std::string unit)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      total_(total),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_),
      tty_(::isatty(STDERR_FILENO) != 0) {}

void Progress::advance(int64_t amount) {
  done_ += amount;
  auto now = std::chrono::steady_clock::now();
  auto since_start = now - start_, since_print = now - last_print_;
  if (since_start < std::chrono::seconds(1)) return;
  if (!tty_ && printed_ && since_print < std::chrono::seconds(5)) return;
  if (tty_ && since_print < std::chrono::milliseconds(100)) return;
  last_print_ = now;
  print(false);
}

void Progress::finish() {
  if (printed_) print(true);
}

void Progress::print(bool final_line) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? double(done_) / elapsed : 0.0;
  double percent = total_ > 0 ? 100.0 * double(done_) / double(total_) : 100.0;
  fmt::print(stderr, "{}{}: {}/{} {} ({:.0f}%, {:.1f} {}/s){}", tty_ ? "\r" : "", what_, done_, total_, unit_,
             percent, rate, unit_, tty_ && !final_line ? "" : "\n");
  std::fflush(stderr);
  printed_ = true;
}

}  // namespace qspec
