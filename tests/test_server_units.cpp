// The server's hand-written pieces in isolation: stop strings across pushes (StopStringMatcher), the
// Prometheus text format (PrometheusText, Histogram) and the scheduler's queue bound and drain.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/scheduler.h"
#include "engine/stop_strings.h"
#include "server/prometheus.h"

namespace qspec {
namespace {

// Everything the matcher lets out for `pieces`, then what finish() flushes.
std::string run(StopStringMatcher& matcher, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& piece : pieces) out += matcher.push(piece);
  return out + matcher.finish();
}

TEST(StopStrings, MatchAcrossPiecesIsCutAndNeverEmitted) {
  StopStringMatcher matcher({"END"});
  EXPECT_EQ(matcher.push("abc E"), "abc ");  // "E" may start the stop string
  EXPECT_EQ(matcher.push("N"), "");
  EXPECT_EQ(matcher.push("Dxyz"), "");
  EXPECT_EQ(matcher.matched(), "END");
  EXPECT_EQ(matcher.push("more"), "");
  EXPECT_EQ(matcher.finish(), "");
}

TEST(StopStrings, HeldTextThatDoesNotMatchIsReleasedOrFlushed) {
  StopStringMatcher matcher({"END"});
  EXPECT_EQ(matcher.push("aE"), "a");
  EXPECT_EQ(matcher.push("Nx"), "ENx");
  EXPECT_EQ(matcher.push("EN"), "");
  EXPECT_EQ(matcher.finish(), "EN");
  EXPECT_FALSE(matcher.matched());
}

TEST(StopStrings, EarliestMatchWinsThenTheLongest) {
  StopStringMatcher earliest({"world", "lo w"});
  EXPECT_EQ(run(earliest, {"hel", "lo wor", "ld"}), "hel");
  EXPECT_EQ(earliest.matched(), "lo w");
  StopStringMatcher longest({"ab", "abc"});
  EXPECT_EQ(run(longest, {"xabcd"}), "x");
  EXPECT_EQ(longest.matched(), "abc");
}

TEST(StopStrings, MultiByteCharactersAndNoStops) {
  StopStringMatcher matcher({"😀!"});
  EXPECT_EQ(run(matcher, {"a😀", "b😀", "!c"}), "a😀b");
  StopStringMatcher none({});
  EXPECT_EQ(run(none, {"any", "thing"}), "anything");
  EXPECT_THROW(StopStringMatcher({"a", ""}), Error);
}

TEST(PrometheusText, FamiliesLabelsEscapesAndHistograms) {
  server::Histogram histogram({0.125, 1.0});  // values exact in binary: the sum prints exactly
  for (double value : {0.0625, 0.125, 0.5, 3.0}) histogram.observe(value);
  server::PrometheusText text;
  text.add("q:requests_total", "counter", "Requests.\nAll of them.", {{"model", "a\"b\\c\nd"}}, 3);
  text.add("q:by_reason_total", "counter", "By reason.",
           {{{{"reason", "stop"}}, 1}, {{{"reason", "length"}}, 2}});
  text.add_histogram("q:latency_seconds", "Latency.", {{"model", "m"}}, histogram.snapshot());
  EXPECT_EQ(text.text(),
            "# HELP q:requests_total Requests.\\nAll of them.\n"
            "# TYPE q:requests_total counter\n"
            "q:requests_total{model=\"a\\\"b\\\\c\\nd\"} 3\n"
            "# HELP q:by_reason_total By reason.\n"
            "# TYPE q:by_reason_total counter\n"
            "q:by_reason_total{reason=\"stop\"} 1\n"
            "q:by_reason_total{reason=\"length\"} 2\n"
            "# HELP q:latency_seconds Latency.\n"
            "# TYPE q:latency_seconds histogram\n"
            "q:latency_seconds_bucket{model=\"m\",le=\"0.125\"} 2\n"
            "q:latency_seconds_bucket{model=\"m\",le=\"1\"} 3\n"
            "q:latency_seconds_bucket{model=\"m\",le=\"+Inf\"} 4\n"
            "q:latency_seconds_sum{model=\"m\"} 3.6875\n"
            "q:latency_seconds_count{model=\"m\"} 4\n");
}

TEST(Scheduler, RunsInArrivalOrderRefusesBeyondTheQueueAndDrains) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<int> order;
  std::atomic<bool> first_running{false};
  Scheduler scheduler(2);
  ASSERT_EQ(scheduler.submit([&] {
    first_running = true;
    released.wait();
    order.push_back(0);
  }),
            Scheduler::Admission::kAccepted);
  while (!first_running) std::this_thread::yield();
  EXPECT_EQ(scheduler.running(), 1u);
  EXPECT_EQ(scheduler.submit([&] { order.push_back(1); }), Scheduler::Admission::kAccepted);
  EXPECT_EQ(scheduler.submit([&] { order.push_back(2); }), Scheduler::Admission::kAccepted);
  EXPECT_EQ(scheduler.waiting(), 2u);
  EXPECT_EQ(scheduler.submit([] {}), Scheduler::Admission::kQueueFull);
  // Draining times out while the first request runs, and refuses new work.
  EXPECT_FALSE(scheduler.close_and_wait(std::chrono::steady_clock::now() + std::chrono::milliseconds(20)));
  EXPECT_EQ(scheduler.submit([] {}), Scheduler::Admission::kClosed);
  release.set_value();
  EXPECT_TRUE(scheduler.close_and_wait(std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(scheduler.running() + scheduler.waiting(), 0u);
}

}  // namespace
}  // namespace qspec
