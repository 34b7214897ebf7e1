// mha-bench: the profiler users run on their CPU. For each case (the default suite or one custom
// shape) and thread count it measures the latency of MultiheadAttention::Forward, reports
// GFLOP/s and efficiency relative to a BLIS sgemm measured in the same process, memory, and the
// error against a double-precision reference; optionally a per-stage breakdown, a Chrome trace
// and a comparison with peer libraries. --decode measures KvCache steps instead. HelpText() in
// bench_args.cc is the user-facing description. This file is the command line: the suites are
// bench_forward.cc and bench_decode_suite.cc.
#include <cstdio>
#include <cstring>
#include <new>

#include "kernels/gemm_route.h"
#include "kernels/gemv_int8.h"
#include "mha/mha.hpp"
#include "tools/bench_args.h"
#include "tools/bench_decode.h"
#include "tools/bench_forward.h"
#include "tools/bench_host.h"

namespace mha {
namespace bench {

int Main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], kSgemmProbeFlag) == 0) return RunSgemmProbe(argc, argv);
  BenchOptions options;
  const ParseResult parsed = ParseArgs(argc, argv, &options);
  switch (parsed.action) {
    case ParseAction::kError:
      std::fprintf(stderr, "mha-bench: %s\n", parsed.error.c_str());
      return kExitUsage;
    case ParseAction::kHelp:
      std::fputs(HelpText().c_str(), stdout);
      return kExitOk;
    case ParseAction::kVersion:
      // "f32 prepacking": whether f32 layers keep their weights packed at creation
      // (WeightPrepack::kOn has effect), which the grouped forward of short sequences needs;
      // "no" where BLIS's micro-kernel prefers column-major C tiles (kernels::WeightsPrepackable),
      // as Debian's arm64 BLIS does under qemu (its cortexa57 configuration).
      std::printf(
          "mha-bench (mha %s)\nSIMD target: %s\nBLIS arch: %s\nbf16 kernel: %s\n"
          "int8 kernel: %s\nf32 prepacking: %s\n",
          OrUnknown(Version()).c_str(), OrUnknown(SimdTarget()).c_str(),
          OrUnknown(BlasArch()).c_str(), OrUnknown(Bf16Kernel()).c_str(),
          kernels::Int8KernelName(kernels::Int8ActiveKernel()),
          kernels::WeightsPrepackable(DType::kF32) ? "yes" : "no");
      return kExitOk;
    case ParseAction::kRun:
      break;
  }
  try {
    return options.decode ? RunDecodeSuite(options) : RunForwardSuite(options);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mha-bench: out of memory (reduce the shape or the thread count)\n");
    return kExitFailure;
  }
}

}  // namespace bench
}  // namespace mha

int main(int argc, char** argv) { return mha::bench::Main(argc, argv); }
