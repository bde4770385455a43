// A fixed pool of worker threads for the CPU backend: parallel_for over an index range, blocking until done.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qspec {

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads = 0);  // 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t size() const { return workers_.size() + 1; }

  // Calls fn(begin, end) on disjoint sub-ranges covering [0, n); the caller's thread takes a share.
  // Calls from several threads at once take turns; a call from inside fn runs serially on its thread.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn);

  static ThreadPool& global();

 private:
  void worker_loop(size_t index);

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time owns the workers
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_size_ = 0;
  size_t generation_ = 0;
  size_t pending_ = 0;
  bool stopping_ = false;
};

}  // namespace qspec
