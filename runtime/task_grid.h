// The coordinates of a ThreadPool::ParallelFor task over a grid of tasks whose last coordinate
// varies fastest. Every ParallelFor of the runtime that runs a grid numbers its tasks this way
// and splits the index here, so a task's order is stated once, at the call.
#ifndef MHA_RUNTIME_TASK_GRID_H_
#define MHA_RUNTIME_TASK_GRID_H_

#include <cstdint>

namespace mha {

// task = outer * inner_count + inner.
struct TaskPair {
  int64_t outer, inner;
};
inline TaskPair SplitTask(uint64_t task, uint64_t inner_count) {
  return {static_cast<int64_t>(task / inner_count), static_cast<int64_t>(task % inner_count)};
}

// task = (i0 * n1 + i1) * n2 + i2.
struct TaskTriple {
  int64_t i0, i1, i2;
};
inline TaskTriple SplitTask(uint64_t task, uint64_t n1, uint64_t n2) {
  return {static_cast<int64_t>(task / n2 / n1), static_cast<int64_t>(task / n2 % n1),
          static_cast<int64_t>(task % n2)};
}

}  // namespace mha

#endif  // MHA_RUNTIME_TASK_GRID_H_
