#include "runtime/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace mha {
namespace {

TEST(ThreadPoolTest, EveryTaskRunsExactlyOnce) {
  for (size_t threads = 1; threads <= 8; ++threads) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.NumThreads(), threads);
    std::vector<std::atomic<int>> counts(10001);
    // n from 0 to 10000 in steps that cover tiny, odd and large counts.
    for (uint64_t n : {0, 1, 2, 3, 7, 8, 9, 63, 64, 65, 100, 999, 1000, 4097, 10000}) {
      for (auto& c : counts) c.store(0);
      std::atomic<bool> bad_worker{false};
      pool.ParallelFor(n, [&](uint64_t task, size_t worker) {
        if (worker >= threads) bad_worker = true;
        counts[task].fetch_add(1, std::memory_order_relaxed);
      });
      EXPECT_FALSE(bad_worker.load()) << "threads=" << threads << " n=" << n;
      for (uint64_t i = 0; i < counts.size(); ++i) {
        ASSERT_EQ(counts[i].load(), i < n ? 1 : 0)
            << "task " << i << " threads=" << threads << " n=" << n;
      }
    }
  }
}

TEST(ThreadPoolTest, AllCountsFrom0To300) {
  ThreadPool pool(4);
  std::vector<int> hits(300);
  for (uint64_t n = 0; n <= 300; ++n) {
    std::fill(hits.begin(), hits.end(), 0);
    std::atomic<uint64_t> sum{0};
    pool.ParallelFor(n, [&](uint64_t task, size_t) {
      hits[task] += 1;  // distinct tasks touch distinct elements
      sum.fetch_add(task + 1);
    });
    ASSERT_EQ(sum.load(), n * (n + 1) / 2) << n;
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1);
  }
}

TEST(ThreadPoolTest, TenThousandBackToBackDispatches) {
  ThreadPool pool(3);
  std::atomic<uint64_t> total{0};
  for (int i = 0; i < 10000; ++i) {
    pool.ParallelFor(5, [&](uint64_t task, size_t) { total.fetch_add(task); });
  }
  EXPECT_EQ(total.load(), 10000u * (0 + 1 + 2 + 3 + 4));
}

// A dispatch ends when its tasks are done, so workers often wake up for a dispatch that has
// already finished: they must skip it and never run a task of it (its closure is gone) or of
// the next one with the old closure. Each dispatch's closure and counters live on the stack of
// one loop iteration (a stale use is a use after scope under ASan, a race under TSan); task
// counts vary so that a worker with a stale count would run a missing or extra task.
TEST(ThreadPoolTest, LateWorkersNeverRunAFinishedDispatch) {
  for (size_t threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    for (int i = 0; i < 20000; ++i) {
      const uint64_t n = 2 + static_cast<uint64_t>(i % 3);
      std::atomic<int> counts[4] = {{0}, {0}, {0}, {0}};
      pool.ParallelFor(n, [&counts](uint64_t task, size_t) {
        counts[task].fetch_add(1, std::memory_order_relaxed);
      });
      for (uint64_t t = 0; t < 4; ++t) {
        ASSERT_EQ(counts[t].load(), t < n ? 1 : 0) << "dispatch " << i << " task " << t;
      }
    }
  }
}

// Workers asleep between dispatches wake up and each runs a task: NumThreads() tasks that each
// wait for all NumThreads() to have started can only all meet if each runs on its own worker (a
// worker waiting in one task cannot start another). A worker may miss one wake-up (where the
// store-load ordering is not honoured, the dispatch then runs without it and the next one wakes
// it), so the check retries; each wait is bounded so that a broken pool fails, never hangs.
TEST(ThreadPoolTest, WorkersSleepAndWakeUp) {
  constexpr size_t kThreads = 4;
  constexpr int kAttempts = 5;
  ThreadPool pool(kThreads);
  std::vector<size_t> ran_on;
  bool all_met = false;
  for (int attempt = 0; attempt < kAttempts && !all_met; ++attempt) {
    // Long enough for every worker to pass its spin phase and block on the condition variable.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<size_t> started{0}, met{0};
    std::vector<std::atomic<int>> tasks_of(kThreads);
    pool.ParallelFor(kThreads, [&](uint64_t, size_t worker) {
      tasks_of[worker]++;
      started++;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (started.load() < kThreads && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::yield();
      }
      if (started.load() == kThreads) met++;
    });
    all_met = met.load() == kThreads;
    ran_on.clear();
    for (size_t w = 0; w < kThreads; ++w) {
      if (tasks_of[w].load() > 0) ran_on.push_back(w);
    }
  }
  EXPECT_TRUE(all_met) << "in " << kAttempts << " dispatches after the workers slept, never all "
                       << kThreads << " workers running at once; last dispatch ran on "
                       << ran_on.size() << " worker(s)";
  EXPECT_EQ(ran_on.size(), kThreads);
}

// ParallelFor is not reentrant (thread_pool.h): debug builds stop a call from inside a task.
TEST(ThreadPoolDeathTest, NestedParallelForAsserts) {
#ifdef NDEBUG
  GTEST_SKIP() << "the reentrancy check is a debug assert";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        ThreadPool pool(2);
        pool.ParallelFor(2,
                         [&](uint64_t, size_t) { pool.ParallelFor(1, [](uint64_t, size_t) {}); });
      },
      "not reentrant");
#endif
}

TEST(ThreadPoolTest, WorkerIndexSelectsPrivateScratch) {
  ThreadPool pool(4);
  // Each worker accumulates into its own slot without atomics; the sum must be exact.
  std::vector<uint64_t> scratch(pool.NumThreads() * 8, 0);  // 8 apart: no false sharing concerns
  pool.ParallelFor(100000, [&](uint64_t task, size_t worker) { scratch[worker * 8] += task; });
  uint64_t sum = 0;
  for (size_t w = 0; w < pool.NumThreads(); ++w) sum += scratch[w * 8];
  EXPECT_EQ(sum, uint64_t{100000} * 99999 / 2);
}

TEST(ThreadPoolTest, DestroyWhileIdleAndRecreate) {
  for (int i = 0; i < 50; ++i) {
    auto pool = std::make_unique<ThreadPool>(1 + i % 6);
    if (i % 2) {
      std::atomic<int> n{0};
      pool->ParallelFor(10, [&](uint64_t, size_t) { n++; });
      ASSERT_EQ(n.load(), 10);
    }
    pool.reset();
  }
}

TEST(ThreadPoolTest, ZeroThreadsMeansOne) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.NumThreads(), 1u);
  int n = 0;
  pool.ParallelFor(3, [&](uint64_t, size_t worker) {
    EXPECT_EQ(worker, 0u);
    n++;
  });
  EXPECT_EQ(n, 3);
}

}  // namespace
}  // namespace mha
