// Accuracy check of one forward pass against a double-precision reference.
#ifndef MHA_TOOLS_BENCH_CHECK_H_
#define MHA_TOOLS_BENCH_CHECK_H_

#include <cstddef>
#include <cstdint>

#include "tools/bench_workload.h"

namespace mha {
namespace bench {

struct CheckResult {
  double max_abs_err = 0.0;  // over the checked output (and attention weight) elements
  int64_t rows_checked = 0;  // query rows compared, over all batches
  bool full = false;         // every row was compared (full reference), not a subset
};

// Compares the workload's output (and attention weights, when requested) with a double
// reference. Small cases run tests/reference's full Attention; for large ones (where its
// O(N*L*S*E) scalar doubles would take seconds to minutes) only query rows 0, L/2 and L-1 of
// the first and last batch are recomputed, which needs K and V of all keys of those batches:
// O(S*E^2) per batch, done with a BLIS dgemm on `threads` threads.
CheckResult CheckAccuracy(const Workload& workload, size_t threads);

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_CHECK_H_
