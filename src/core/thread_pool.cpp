#include "core/thread_pool.h"

#include <algorithm>
#include <string>

#include "core/env.h"

namespace qspec {

namespace {

// Share i of n items split into `parts` nearly equal contiguous pieces.
std::pair<size_t, size_t> share(size_t n, size_t parts, size_t i) {
  size_t base = n / parts, extra = n % parts;
  size_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

// Set while this thread runs a share of a parallel_for, so that a nested call neither waits for the workers
// (which are busy with the outer call) nor for call_mutex_.
thread_local bool running_share = false;

void run_share(const std::function<void(size_t, size_t)>& fn, size_t begin, size_t end) {
  struct ShareScope {
    bool outer = running_share;
    ShareScope() { running_share = true; }
    ~ShareScope() { running_share = outer; }
  } scope;
  fn(begin, end);
}

}  // namespace

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(size_t index) {
  size_t seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* job;
    size_t n;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
      n = job_size_;
    }
    auto [b, e] = share(n, size(), index);
    if (b < e) run_share(*job, b, e);
    {
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) work_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1 || running_share) {
    fn(0, n);
    return;
  }
  std::lock_guard call(call_mutex_);
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    job_size_ = n;
    pending_ = workers_.size();
    ++generation_;
  }
  work_ready_.notify_all();
  auto [b, e] = share(n, size(), 0);
  if (b < e) run_share(fn, b, e);
  std::unique_lock lock(mutex_);
  work_done_.wait(lock, [&] { return pending_ == 0; });
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    return static_cast<size_t>(env_integer("QSPEC_THREADS", 0, 4096).value_or(0));  // 0: every core
  }());
  return pool;
}

}  // namespace qspec
