// ThreadPool: a fixed set of workers that run ParallelFor(n, fn(task, worker)) over a flattened
// index range (batch x heads x blocks in the attention operator).
//
// A pool either owns its threads (below) or runs every dispatch on a host application's
// Executor (runtime/host_dispatch.h: no thread of its own; NumThreads() is the executor's
// num_workers()). The operator sees the same ParallelFor either way.
//
// Owned threads:
// - Workers are created once; the calling thread is worker 0 and takes part in every dispatch,
//   so a pool of N threads creates N-1 OS threads.
// - Each dispatch splits [0, num_tasks) into N contiguous ranges of equal size (+-1), in worker
//   order. Worker w claims tasks from its own range first (one atomic counter per range), then
//   from the others' in turn. So while every worker keeps up, a task runs on the same worker
//   from one dispatch to the next (cache affinity: a projection panel's weights stay in that
//   core's L2 across forwards), and when one does not (a descheduled vCPU,
//   unequal tasks) the others take its tasks. Which worker runs a task can vary from run to
//   run: results must depend only on `task`, never on `worker`. `worker` (0..N-1) only selects
//   per-thread scratch.
// - No heap allocation per dispatch: the callable is passed by pointer and type-erased through a
//   function pointer.
// - Idle workers spin for a short, bounded time (kSpinMicros) and then sleep on a condition
//   variable: the VMs we run on may deschedule a vCPU, so no unbounded spinning. A worker whose
//   tasks are done while the dispatch runs on (the others' last tasks, at most one each) first
//   polls until it closes, for up to kTailSpinMicros, and the caller likewise polls for its
//   workers' last tasks: a forward's next stage then finds its workers awake. (A stage boundary
//   where one side had gone to sleep cost 60-110 us on a 2-vCPU VM: bench/README, "Thread
//   pool".)
// - A dispatch ends when its tasks are done, not when every worker has looked at it: a worker
//   that is asleep (or whose vCPU is descheduled) when a dispatch starts and wakes after the
//   others have run every task takes no part and delays nothing. Workers join a dispatch through
//   one atomic word (see state_).
// - ParallelFor is not reentrant: one thread (the owner) calls it, one call at a time, never
//   from inside a task (a task's nested call would rewrite the running dispatch). Debug builds
//   assert this. Destruction while idle joins all workers.
#ifndef MHA_RUNTIME_THREAD_POOL_H_
#define MHA_RUNTIME_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "mha/mha.hpp"

namespace mha {

class HostDispatch;

class ThreadPool {
 public:
  // How long an idle worker (or the waiting caller) polls before it sleeps, in microseconds.
  static constexpr int kSpinMicros = 50;
  // How long a worker that ran out of tasks polls for the end of its dispatch (the others'
  // last tasks) before the kSpinMicros above, and the caller for its workers' last tasks before
  // it sleeps, in microseconds: a bound, reached only by tasks longer than that (or a
  // descheduled vCPU).
  static constexpr int kTailSpinMicros = 2000;

  // `num_threads` >= 1 counts the calling thread; 0 is treated as 1.
  explicit ThreadPool(size_t num_threads);
  // Runs on `host` (which must outlive the pool) with `num_workers` >= 1, its num_workers():
  // starts no thread.
  ThreadPool(Executor& host, size_t num_workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Workers, counting the calling thread (or the host's num_workers()): `worker` < this.
  size_t NumThreads() const { return num_threads_; }

  // Runs func(task, worker) for every task in [0, num_tasks) exactly once and returns when all
  // have finished. func must not throw. Not reentrant (see the file comment).
  template <typename Func>
  void ParallelFor(uint64_t num_tasks, const Func& func) {
    Run(num_tasks, &Trampoline<Func>, &func);
  }

  // On a host executor: its breach of contract since the last call (see HostDispatch), cleared.
  // Always Ok for owned threads.
  Status TakeError();

 private:
  using TaskFn = void (*)(const void* closure, uint64_t task, size_t worker);
  template <typename Func>
  static void Trampoline(const void* closure, uint64_t task, size_t worker) {
    (*static_cast<const Func*>(closure))(task, worker);
  }

  void Run(uint64_t num_tasks, TaskFn fn, const void* closure);
  void WorkerLoop(size_t worker);
  void RunTasks(size_t worker);

  size_t num_threads_ = 1;
  std::unique_ptr<HostDispatch> host_;  // null for owned threads
  std::vector<std::thread> workers_;

  // The current dispatch. Written by the owner only while the dispatch is closed and no worker
  // is inside it; read by workers after they have joined it (the join's acquire pairs with the
  // owner's release when it opens the dispatch).
  TaskFn fn_ = nullptr;
  const void* closure_ = nullptr;
  // Per worker: its range of the current dispatch's tasks, claimed by fetch_add on `next` (by
  // the worker, then by others once theirs is done). Cache-line sized so that claims on
  // different ranges do not contend. Allocated once with the pool.
  struct alignas(64) Range {
    std::atomic<uint64_t> next{0};
    uint64_t end = 0;
  };
  std::unique_ptr<Range[]> ranges_;
  // state_ = epoch << 32 | (workers inside the dispatch) << 1 | closed. The owner opens epoch
  // e + 1 (0 workers, open) after writing the fields above; a worker joins by incrementing the
  // count with a compare-exchange that also checks the epoch and that the dispatch is open, and
  // leaves by decrementing it. The owner, having run tasks itself until none is left, waits for
  // the count to reach 0 and closes the dispatch with a compare-exchange from (e, 0, open):
  // after that no worker can join epoch e, so the fields may be rewritten. A worker that sees
  // a closed dispatch, or a newer epoch than it was woken for, skips it.
  std::atomic<uint64_t> state_{1};  // epoch 0, closed
  uint32_t epoch_ = 0;              // the owner's copy of the current epoch
  std::mutex mu_;
  std::condition_variable wake_cv_;   // workers sleep here between dispatches
  std::condition_variable done_cv_;   // the owner sleeps here waiting for workers
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> owner_sleeping_{false};
  std::atomic<bool> stop_{false};  // written under mu_ so sleeping workers see it
  std::atomic<bool> in_dispatch_{false};  // debug builds: a ParallelFor is running
};

}  // namespace mha

#endif  // MHA_RUNTIME_THREAD_POOL_H_
