#include "engine/scheduler.h"

#include <utility>

namespace qspec {

Scheduler::Scheduler(size_t max_waiting) : max_waiting_(max_waiting), worker_([this] { run_worker(); }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    stopping_ = true;
  }
  work_changed_.notify_all();
  worker_.join();
}

Scheduler::Admission Scheduler::submit(Work work) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return Admission::kClosed;
    if (queue_.size() >= max_waiting_) return Admission::kQueueFull;
    queue_.push_back(std::move(work));
  }
  work_changed_.notify_all();
  return Admission::kAccepted;
}

bool Scheduler::close_and_wait(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  closed_ = true;
  return work_changed_.wait_until(lock, deadline, [this] { return queue_.empty() && running_ == 0; });
}

size_t Scheduler::waiting() const {
  std::lock_guard lock(mutex_);
  return queue_.size();
}

size_t Scheduler::running() const {
  std::lock_guard lock(mutex_);
  return running_;
}

void Scheduler::run_worker() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_changed_.wait(lock, [this] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;
    Work work = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    work();
    lock.lock();
    --running_;
    work_changed_.notify_all();
  }
}

}  // namespace qspec
