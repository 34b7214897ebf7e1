#include "runtime/thread_pool.h"

#include <chrono>

#include "hwy/cache_control.h"  // hwy::Pause: portable spin-wait hint

namespace mha {

namespace {

// Polls `done` for up to kSpinMicros; returns true if it became true.
template <typename Pred>
bool SpinFor(const Pred& done) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::microseconds(ThreadPool::kSpinMicros);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      hwy::Pause();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(size_t num_threads) {
  if (num_threads == 0) num_threads = 1;
  workers_.reserve(num_threads - 1);
  for (size_t w = 1; w < num_threads; ++w) {
    workers_.emplace_back([this, w] { WorkerLoop(w); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_seq_cst);
  }
  // Bump the epoch so spinning workers notice too.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  wake_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunTasks(size_t worker) {
  const uint64_t n = num_tasks_;
  for (;;) {
    const uint64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n) break;
    fn_(closure_, task, worker);
  }
}

void ThreadPool::Run(uint64_t num_tasks, TaskFn fn, const void* closure) {
  if (num_tasks == 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (uint64_t t = 0; t < num_tasks; ++t) fn(closure, t, 0);
    return;
  }
  fn_ = fn;
  closure_ = closure;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  pending_workers_.store(workers_.size(), std::memory_order_relaxed);
  // seq_cst pairs with the sleeping_workers_ increment in WorkerLoop: either the worker sees the
  // new epoch before it sleeps, or we see it asleep and notify it.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    wake_cv_.notify_all();
  }

  RunTasks(0);

  // seq_cst pairs with the worker's decrement and owner_sleeping_ check (see WorkerLoop).
  auto all_done = [this] { return pending_workers_.load(std::memory_order_seq_cst) == 0; };
  if (!SpinFor(all_done)) {
    std::unique_lock<std::mutex> lock(mu_);
    owner_sleeping_.store(true, std::memory_order_seq_cst);
    done_cv_.wait(lock, all_done);
    owner_sleeping_.store(false, std::memory_order_relaxed);
  }
}

void ThreadPool::WorkerLoop(size_t worker) {
  uint64_t seen_epoch = 0;
  for (;;) {
    auto has_work = [&] { return epoch_.load(std::memory_order_acquire) != seen_epoch; };
    if (!SpinFor(has_work)) {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
      wake_cv_.wait(lock, [&] { return stop_.load(std::memory_order_relaxed) || has_work(); });
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen_epoch = epoch_.load(std::memory_order_acquire);
    RunTasks(worker);
    // The last worker out wakes the owner if it went to sleep. Both sides are seq_cst: either we
    // see owner_sleeping_ and notify under mu_ (the owner holds mu_ until it waits), or the
    // owner's predicate sees pending == 0. The wake-up cannot be lost.
    if (pending_workers_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
        owner_sleeping_.load(std::memory_order_seq_cst)) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace mha
