#include "runtime/thread_pool.h"

#include <cassert>
#include <chrono>

#include "hwy/cache_control.h"  // hwy::Pause: portable spin-wait hint
#include "runtime/host_dispatch.h"

namespace mha {

namespace {

// Polls `done` for up to `micros`; returns true if it became true.
template <typename Pred>
bool SpinFor(const Pred& done, int micros = ThreadPool::kSpinMicros) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      hwy::Pause();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

constexpr uint64_t kClosed = 1;
constexpr uint64_t kOneWorker = 2;
constexpr uint64_t kWorkerMask = 0xFFFFFFFEull;

uint32_t EpochOf(uint64_t state) { return static_cast<uint32_t>(state >> 32); }
uint64_t WorkersIn(uint64_t state) { return (state & kWorkerMask) >> 1; }

}  // namespace

ThreadPool::ThreadPool(size_t num_threads) {
  if (num_threads == 0) num_threads = 1;
  num_threads_ = num_threads;
  ranges_ = std::make_unique<Range[]>(num_threads);
  workers_.reserve(num_threads - 1);
  for (size_t w = 1; w < num_threads; ++w) {
    workers_.emplace_back([this, w] { WorkerLoop(w); });
  }
}

ThreadPool::ThreadPool(Executor& host, size_t num_workers)
    : num_threads_(num_workers), host_(std::make_unique<HostDispatch>(host, num_workers)) {}

Status ThreadPool::TakeError() { return host_ != nullptr ? host_->TakeError() : Status::Ok(); }

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_seq_cst);
  }
  wake_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunTasks(size_t worker) {
  // The worker's own range first, then the others' in turn: a claim past a range's end means
  // that range is exhausted (counters only grow within a dispatch).
  const size_t threads = NumThreads();
  for (size_t i = 0; i < threads; ++i) {
    Range& range = ranges_[(worker + i) % threads];
    for (;;) {
      const uint64_t task = range.next.fetch_add(1, std::memory_order_relaxed);
      if (task >= range.end) break;
      fn_(closure_, task, worker);
    }
  }
}

void ThreadPool::Run(uint64_t num_tasks, TaskFn fn, const void* closure) {
#ifndef NDEBUG
  const bool nested = in_dispatch_.exchange(true, std::memory_order_acq_rel);
  assert(!nested && "ThreadPool::ParallelFor is not reentrant: called from a task or two threads");
  struct Leave {
    std::atomic<bool>* flag;
    ~Leave() { flag->store(false, std::memory_order_release); }
  } leave{&in_dispatch_};
  (void)nested;
#endif
  if (host_ != nullptr) {
    host_->Run(num_tasks, fn, closure);
    return;
  }
  if (num_tasks == 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (uint64_t t = 0; t < num_tasks; ++t) fn(closure, t, 0);
    return;
  }
  // The previous dispatch is closed with no worker inside: the fields are ours to write.
  fn_ = fn;
  closure_ = closure;
  // Range w: q or q + 1 tasks (the first n % threads ranges take one more), without overflow
  // for any num_tasks.
  const uint64_t threads = NumThreads();
  const uint64_t q = num_tasks / threads, extra = num_tasks % threads;
  uint64_t begin = 0;
  for (uint64_t w = 0; w < threads; ++w) {
    ranges_[w].next.store(begin, std::memory_order_relaxed);
    begin += q + (w < extra ? 1 : 0);
    ranges_[w].end = begin;
  }
  ++epoch_;
  const uint64_t open = static_cast<uint64_t>(epoch_) << 32;
  // seq_cst pairs with the sleeping_workers_ increment in WorkerLoop: either the worker sees the
  // new epoch before it sleeps, or we see it asleep and notify it. (Where that store-load
  // ordering is not honoured, as under qemu-aarch64, a missed wake-up costs this dispatch the
  // worker's help, never a hang: the dispatch waits only for workers that joined, and the next
  // one sees the sleeper.)
  state_.store(open, std::memory_order_seq_cst);
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    wake_cv_.notify_all();
  }

  RunTasks(0);

  // Every task is claimed; wait for the workers that joined to finish theirs, then close. The
  // sleep decision is made under mu_, like the last worker's wake-up (see WorkerLoop).
  auto none_inside = [this] {
    return WorkersIn(state_.load(std::memory_order_seq_cst)) == 0;
  };
  for (;;) {
    if (!SpinFor(none_inside, ThreadPool::kTailSpinMicros)) {
      std::unique_lock<std::mutex> lock(mu_);
      owner_sleeping_.store(true, std::memory_order_relaxed);
      done_cv_.wait(lock, none_inside);
      owner_sleeping_.store(false, std::memory_order_relaxed);
    }
    uint64_t expected = open;
    // Fails only if a worker joined since the check; it finds no task and leaves at once.
    if (state_.compare_exchange_strong(expected, open | kClosed, std::memory_order_seq_cst)) break;
  }
}

void ThreadPool::WorkerLoop(size_t worker) {
  uint32_t seen_epoch = 0;
  for (;;) {
    auto has_work = [&] {
      return stop_.load(std::memory_order_acquire) ||
             EpochOf(state_.load(std::memory_order_seq_cst)) != seen_epoch;
    };
    if (!SpinFor(has_work)) {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
      wake_cv_.wait(lock, has_work);
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // Join the current dispatch if it is still open.
    uint64_t state = state_.load(std::memory_order_acquire);
    seen_epoch = EpochOf(state);
    bool joined = false;
    while ((state & kClosed) == 0 && EpochOf(state) == seen_epoch) {
      if (state_.compare_exchange_weak(state, state + kOneWorker, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    RunTasks(worker);
    // The last worker out wakes the owner if it went to sleep, deciding under mu_: the owner sets
    // owner_sleeping_ and checks for workers inside under mu_ too, so either it checked after
    // our unlock (and sees our leave) or we lock after it waits (and see owner_sleeping_). Only
    // the mutex's acquire/release is relied on: a store-load handshake of two atomics would need
    // sequential consistency, which qemu-aarch64 on x86-64 does not give. One uncontended lock
    // per dispatch.
    const uint64_t before = state_.fetch_sub(kOneWorker, std::memory_order_seq_cst);
    if (WorkersIn(before) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      if (owner_sleeping_.load(std::memory_order_relaxed)) done_cv_.notify_one();
    }
    // Every task is claimed, but the dispatch runs on while others finish theirs (at most one
    // each): stay awake until it closes, so that the next dispatch (the forward's next stage)
    // finds this worker polling rather than asleep. Then the usual kSpinMicros.
    SpinFor(
        [&] {
          const uint64_t s = state_.load(std::memory_order_acquire);
          return (s & kClosed) != 0 || EpochOf(s) != seen_epoch ||
                 stop_.load(std::memory_order_acquire);
        },
        kTailSpinMicros);
  }
}

}  // namespace mha
