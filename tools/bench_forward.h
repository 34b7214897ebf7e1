// mha-bench's forward suite: MultiheadAttention::Forward per case and thread count, against
// the BLIS sgemm baseline, with accuracy, memory, an optional breakdown, trace and peers.
#ifndef MHA_TOOLS_BENCH_FORWARD_H_
#define MHA_TOOLS_BENCH_FORWARD_H_

#include "tools/bench_args.h"

namespace mha {
namespace bench {

// Runs the cases of `o`, prints the table and writes --json/--csv/--trace; returns the exit
// code (kExitOk, kExitFailure, kExitInaccurate or kExitUsage).
int RunForwardSuite(const BenchOptions& o);

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_FORWARD_H_
