// Host thread pools for the executor tests: what an application that owns its threads gives a
// Context (mha::Executor, or mha_executor through the C API).
#ifndef MHA_TESTS_HOST_POOL_H_
#define MHA_TESTS_HOST_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "mha/mha.h"
#include "mha/mha.hpp"

namespace mha {
namespace testing_util {

// A pool of `threads` std::threads, plus the calling thread when `caller_runs`, sharing each
// ParallelFor's tasks. It exercises the freedom the contract gives a host: tasks are handed out
// last to first, and a worker index is checked out of a free list for each task and returned
// after it, so one thread carries different indices and one index travels between threads.
class HostPool final : public Executor {
 public:
  HostPool(size_t threads, bool caller_runs)
      : num_workers_(threads + (caller_runs ? 1 : 0)), caller_runs_(caller_runs) {
    for (size_t w = 0; w < num_workers_; ++w) free_.push_back(w);
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~HostPool() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  size_t num_workers() const override { return num_workers_; }

  void ParallelFor(uint64_t num_tasks, TaskFn task_fn, void* task_arg) override {
    std::unique_lock<std::mutex> lock(mu_);
    fn_ = task_fn;
    arg_ = task_arg;
    n_ = num_tasks;
    next_ = 0;
    done_ = 0;
    ++generation_;
    wake_.notify_all();
    if (caller_runs_) Work(&lock);
    done_cv_.wait(lock, [this] { return done_ == n_; });
    ++dispatches_;
  }

  // The C face: an mha_executor whose parallel_for forwards to this pool.
  mha_executor AsC() {
    mha_executor e;
    e.parallel_for = [](void* user, uint64_t n, mha_task_fn fn, void* arg) {
      static_cast<HostPool*>(user)->ParallelFor(n, fn, arg);
    };
    e.num_workers = num_workers_;
    e.user = this;
    return e;
  }

  size_t dispatches() {
    std::lock_guard<std::mutex> lock(mu_);
    return dispatches_;
  }

 private:
  // Runs tasks until none is left to claim; `lock` holds mu_ on entry and on return.
  void Work(std::unique_lock<std::mutex>* lock) {
    while (next_ < n_) {
      const uint64_t task = n_ - 1 - next_++;
      const size_t worker = free_.back();
      free_.pop_back();
      TaskFn fn = fn_;
      void* arg = arg_;
      lock->unlock();
      fn(arg, task, worker);
      lock->lock();
      free_.push_back(worker);
      if (++done_ == n_) done_cv_.notify_all();
    }
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t seen = 0;
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      Work(&lock);
    }
  }

  const size_t num_workers_;
  const bool caller_runs_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_cv_;
  std::vector<size_t> free_;  // worker indices not in use
  TaskFn fn_ = nullptr;
  void* arg_ = nullptr;
  uint64_t n_ = 0, next_ = 0, done_ = 0, generation_ = 0;
  size_t dispatches_ = 0;
  bool stop_ = false;
};

// One worker, the caller: every task in order on the calling thread.
class SerialExecutor final : public Executor {
 public:
  size_t num_workers() const override { return 1; }
  void ParallelFor(uint64_t num_tasks, TaskFn task_fn, void* task_arg) override {
    for (uint64_t t = 0; t < num_tasks; ++t) task_fn(task_arg, t, 0);
  }
};

}  // namespace testing_util
}  // namespace mha

#endif  // MHA_TESTS_HOST_POOL_H_
