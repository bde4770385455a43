// The order in which requests reach the engine: arrival order, one at a time, on one worker thread (batch 1).
// The queue of waiting requests is bounded so that an overloaded server refuses work at once (HTTP 429)
// instead of letting latency grow without limit. Continuous batching will replace the policy behind this
// interface.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace qspec {

class Scheduler {
 public:
  using Work = std::function<void()>;
  enum class Admission { kAccepted, kQueueFull, kClosed };

  explicit Scheduler(size_t max_waiting);
  // Runs what was accepted, then joins the worker.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues `work` unless max_waiting requests already wait or the scheduler is closed. `work` must not throw.
  Admission submit(Work work);
  // Refuses new work from now on and waits until the accepted work has run or `deadline` passes; true when
  // it all ran.
  bool close_and_wait(std::chrono::steady_clock::time_point deadline);

  size_t waiting() const;
  size_t running() const;

 private:
  void run_worker();

  const size_t max_waiting_;
  mutable std::mutex mutex_;
  std::condition_variable work_changed_;
  std::deque<Work> queue_;
  size_t running_ = 0;
  bool closed_ = false;
  bool stopping_ = false;
  std::thread worker_;  // last: it starts after the members it uses
};

}  // namespace qspec
