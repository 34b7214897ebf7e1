// ThreadPool: a fixed set of workers that run ParallelFor(n, fn(task, worker)) over a flattened
// index range (batch x heads x blocks in the attention operator).
//
// - Workers are created once; the calling thread is worker 0 and takes part in every dispatch,
//   so a pool of N threads creates N-1 OS threads.
// - Tasks are claimed dynamically (one atomic counter), so which worker runs a task varies from
//   run to run: results must depend only on `task`, never on `worker`. `worker` (0..N-1) only
//   selects per-thread scratch.
// - No heap allocation per dispatch: the callable is passed by pointer and type-erased through a
//   function pointer.
// - Idle workers spin for a short, bounded time (kSpinMicros) and then sleep on a condition
//   variable: the VMs we run on may deschedule a vCPU, so no unbounded spinning.
// - ParallelFor is not reentrant and must be called from one thread at a time (the owner).
//   Destruction while idle joins all workers.
#ifndef MHA_RUNTIME_THREAD_POOL_H_
#define MHA_RUNTIME_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace mha {

class ThreadPool {
 public:
  // How long an idle worker (or the waiting caller) polls before it sleeps, in microseconds.
  static constexpr int kSpinMicros = 50;

  // `num_threads` >= 1 counts the calling thread; 0 is treated as 1.
  explicit ThreadPool(size_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t NumThreads() const { return workers_.size() + 1; }

  // Runs func(task, worker) for every task in [0, num_tasks) exactly once and returns when all
  // have finished. func must not throw.
  template <typename Func>
  void ParallelFor(uint64_t num_tasks, const Func& func) {
    Run(num_tasks, &Trampoline<Func>, &func);
  }

 private:
  using TaskFn = void (*)(const void* closure, uint64_t task, size_t worker);
  template <typename Func>
  static void Trampoline(const void* closure, uint64_t task, size_t worker) {
    (*static_cast<const Func*>(closure))(task, worker);
  }

  void Run(uint64_t num_tasks, TaskFn fn, const void* closure);
  void WorkerLoop(size_t worker);
  void RunTasks(size_t worker);

  std::vector<std::thread> workers_;

  // The current dispatch. Written by the owner before epoch_ is bumped (release) and read by
  // workers after they observe the new epoch (acquire).
  TaskFn fn_ = nullptr;
  const void* closure_ = nullptr;
  uint64_t num_tasks_ = 0;
  std::atomic<uint64_t> next_task_{0};
  std::atomic<uint64_t> epoch_{0};
  std::atomic<size_t> pending_workers_{0};  // workers still inside the current dispatch

  std::mutex mu_;
  std::condition_variable wake_cv_;   // workers sleep here between dispatches
  std::condition_variable done_cv_;   // the owner sleeps here waiting for workers
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> owner_sleeping_{false};
  std::atomic<bool> stop_{false};  // written under mu_ so sleeping workers see it
};

}  // namespace mha

#endif  // MHA_RUNTIME_THREAD_POOL_H_
