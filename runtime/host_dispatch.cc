#include "runtime/host_dispatch.h"

#include <string>

namespace mha {

HostDispatch::HostDispatch(Executor& executor, size_t num_workers)
    : executor_(executor),
      num_workers_(num_workers),
      slots_(std::make_unique<Slot[]>(num_workers_)) {}

void HostDispatch::Record(Breach breach, uint64_t task, uint64_t worker) {
  int expected = static_cast<int>(Breach::kNone);
  if (breach_.compare_exchange_strong(expected, static_cast<int>(breach),
                                      std::memory_order_relaxed)) {
    breach_task_.store(task, std::memory_order_relaxed);
    breach_worker_.store(worker, std::memory_order_relaxed);
  }
}

void HostDispatch::Task(void* self_arg, uint64_t task, size_t worker) noexcept {
  HostDispatch& self = *static_cast<HostDispatch*>(self_arg);
  if (worker >= self.num_workers_) {
    self.stray_calls_.fetch_add(1, std::memory_order_relaxed);
    self.Record(Breach::kWorkerRange, task, worker);
    return;
  }
  Slot& slot = self.slots_[worker];
  slot.calls.fetch_add(1, std::memory_order_relaxed);
  if (task >= self.num_tasks_) {
    self.Record(Breach::kTaskRange, task, worker);
    return;
  }
  // acquire/release: the previous task on this worker index (possibly on another thread) wrote
  // its scratch before releasing the flag.
  if (slot.busy.exchange(true, std::memory_order_acquire)) {
    self.Record(Breach::kWorkerBusy, task, worker);
    return;
  }
  self.fn_(self.closure_, task, worker);
  slot.busy.store(false, std::memory_order_release);
}

void HostDispatch::Run(uint64_t num_tasks, TaskFn fn, const void* closure) {
  if (num_tasks == 0 || breach_.load(std::memory_order_relaxed) != 0) return;
  fn_ = fn;
  closure_ = closure;
  num_tasks_ = num_tasks;
  for (size_t w = 0; w < num_workers_; ++w) slots_[w].calls.store(0, std::memory_order_relaxed);
  stray_calls_.store(0, std::memory_order_relaxed);
  executor_.ParallelFor(num_tasks, &HostDispatch::Task, this);
  uint64_t calls = stray_calls_.load(std::memory_order_relaxed);
  for (size_t w = 0; w < num_workers_; ++w) {
    calls += slots_[w].calls.load(std::memory_order_relaxed);
  }
  if (calls != num_tasks && breach_.load(std::memory_order_relaxed) == 0) {
    breach_calls_ = calls;
    breach_expected_ = num_tasks;
    Record(Breach::kTaskCount, 0, 0);
  }
}

Status HostDispatch::TakeError() {
  const auto breach = static_cast<Breach>(breach_.load(std::memory_order_relaxed));
  if (breach == Breach::kNone) return Status::Ok();
  const std::string task = std::to_string(breach_task_.load(std::memory_order_relaxed));
  const std::string worker = std::to_string(breach_worker_.load(std::memory_order_relaxed));
  std::string message = "executor: ";
  switch (breach) {
    case Breach::kWorkerRange:
      message += "parallel_for ran task " + task + " with worker index " + worker +
                 ", expected a worker index below num_workers " + std::to_string(num_workers_);
      break;
    case Breach::kWorkerBusy:
      message += "parallel_for ran task " + task + " with worker index " + worker +
                 " while another task with that worker index was running, expected one task "
                 "at a time per worker index (it selects the task's scratch)";
      break;
    case Breach::kTaskRange:
      message += "parallel_for ran task index " + task + " (worker " + worker +
                 "), expected a task index below n_tasks " + std::to_string(num_tasks_);
      break;
    case Breach::kTaskCount:
      message += "parallel_for returned after " + std::to_string(breach_calls_) +
                 " task calls, expected " + std::to_string(breach_expected_) +
                 " (every task exactly once, all finished before it returns)";
      break;
    case Breach::kNone:
      break;
  }
  message += "; the outputs of this call are unspecified";
  breach_.store(static_cast<int>(Breach::kNone), std::memory_order_relaxed);
  return InvalidArgument(message);
}

}  // namespace mha
