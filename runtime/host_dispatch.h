// HostDispatch: runs ThreadPool dispatches on a host application's Executor (mha/mha.hpp) and
// checks the executor's side of the contract stated there.
//
// - Every dispatch of n >= 1 tasks is one Executor::ParallelFor(n, ...): mha never starts a
//   thread and never runs a task outside the host's call.
// - Each task call is checked before the task runs: task index < n, worker index <
//   num_workers, and that worker index not running another task at that moment (a per-worker
//   busy flag; two tasks on one index would share its scratch). A call that fails a check is
//   skipped. After ParallelFor returns, the number of task calls must equal n (a host that
//   skipped or repeated tasks, or returned before they ran). The first breach is kept as an
//   error; the dispatches after it in the same entry point do not reach the host, and the entry
//   point returns the error (TakeDispatchError in runtime/context_internal.h).
// - Per-worker slots are cache-line sized and allocated once, so a dispatch allocates nothing
//   and the checks cost one uncontended atomic exchange and one increment per task.
// - Tasks are noexcept: no exception can unwind through the host's (possibly C) frames.
#ifndef MHA_RUNTIME_HOST_DISPATCH_H_
#define MHA_RUNTIME_HOST_DISPATCH_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "mha/mha.hpp"

namespace mha {

class HostDispatch {
 public:
  // The ThreadPool's type-erased task (closure, task, worker).
  using TaskFn = void (*)(const void* closure, uint64_t task, size_t worker);

  // `executor` must outlive this object; `num_workers` (>= 1) is its num_workers(), read once
  // by the caller.
  HostDispatch(Executor& executor, size_t num_workers);
  HostDispatch(const HostDispatch&) = delete;
  HostDispatch& operator=(const HostDispatch&) = delete;

  size_t num_workers() const { return num_workers_; }

  // Runs fn(closure, task, worker) for every task in [0, num_tasks) on the executor, unless an
  // earlier dispatch since the last TakeError found a breach. Called by one thread at a time.
  void Run(uint64_t num_tasks, TaskFn fn, const void* closure);

  // The first breach since the last call (InvalidArgument naming it), or Ok; clears it.
  Status TakeError();

 private:
  enum class Breach : int { kNone = 0, kWorkerRange, kWorkerBusy, kTaskRange, kTaskCount };

  static void Task(void* self, uint64_t task, size_t worker) noexcept;
  void Record(Breach breach, uint64_t task, uint64_t worker);

  Executor& executor_;
  const size_t num_workers_;
  struct alignas(64) Slot {
    std::atomic<bool> busy{false};
    std::atomic<uint64_t> calls{0};  // task calls made with this worker index, this dispatch
  };
  std::unique_ptr<Slot[]> slots_;         // [num_workers_]
  std::atomic<uint64_t> stray_calls_{0};  // calls with an out-of-range worker index

  // The current dispatch; written by the dispatching thread before ParallelFor (which hands
  // them to the tasks with the host's own synchronization).
  TaskFn fn_ = nullptr;
  const void* closure_ = nullptr;
  uint64_t num_tasks_ = 0;

  // The first breach: set once (compare-exchange on breach_) by whichever task call finds it.
  std::atomic<int> breach_{0};
  std::atomic<uint64_t> breach_task_{0};
  std::atomic<uint64_t> breach_worker_{0};
  uint64_t breach_calls_ = 0;     // kTaskCount: the calls counted
  uint64_t breach_expected_ = 0;  // kTaskCount: the tasks of that dispatch
};

}  // namespace mha

#endif  // MHA_RUNTIME_HOST_DISPATCH_H_
