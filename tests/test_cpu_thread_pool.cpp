// The thread pool behind the CPU backend: full coverage of the range, nested calls and concurrent callers.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace qspec {
namespace {

// Every index visited exactly once.
void expect_each_once(const std::vector<std::atomic<int>>& visits) {
  for (size_t i = 0; i < visits.size(); ++i) ASSERT_EQ(visits[i].load(), 1) << "index " << i;
}

TEST(CpuThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(4);
  for (size_t n : {1, 3, 4, 5, 1000}) {
    std::vector<std::atomic<int>> visits(n);
    pool.parallel_for(n, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) ++visits[i];
    });
    expect_each_once(visits);
  }
}

TEST(CpuThreadPool, NestedCallRunsInline) {
  ThreadPool pool(4);
  const size_t outer = 8, inner = 16;
  std::vector<std::atomic<int>> visits(outer * inner);
  pool.parallel_for(outer, [&](size_t begin, size_t end) {
    for (size_t o = begin; o < end; ++o)
      pool.parallel_for(inner, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) ++visits[o * inner + i];
      });
  });
  expect_each_once(visits);
}

TEST(CpuThreadPool, ConcurrentCallersTakeTurns) {
  ThreadPool pool(4);
  const size_t n = 5000;
  std::vector<std::atomic<int>> first(n), second(n);
  auto run = [&](std::vector<std::atomic<int>>& visits) {
    for (int repeat = 0; repeat < 50; ++repeat)
      pool.parallel_for(n, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) ++visits[i];
      });
  };
  std::thread other([&] { run(second); });
  run(first);
  other.join();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(first[i].load(), 50) << "index " << i;
    ASSERT_EQ(second[i].load(), 50) << "index " << i;
  }
}

}  // namespace
}  // namespace qspec
