// mha-bench's probes of the host: CPU model, load, date, peak RSS, and the BLIS sgemm baseline
// that efficiencies divide by (measured in process, or in a child process with BLIS's skx
// configuration where that is faster).
#ifndef MHA_TOOLS_BENCH_HOST_H_
#define MHA_TOOLS_BENCH_HOST_H_

#include <cstddef>
#include <string>

namespace mha {
namespace bench {

// s, or "unknown" when null or empty.
std::string OrUnknown(const char* s);
// /proc/cpuinfo's "model name", or "unknown".
std::string CpuModel();
// The 1-minute load average, or -1 where /proc/loadavg does not exist.
double LoadAverage();
// Now, ISO 8601 in UTC ("2026-01-31T12:00:00Z").
std::string IsoDateUtc();

// The first argument of the child process that measures the skx baseline.
inline constexpr const char kSgemmProbeFlag[] = "--sgemm-probe";

struct SgemmBaseline {
  bool child = false;  // measured by a child process with BLIS's skx configuration
  std::string arch;
};

// GFLOP/s of the fastest of a few n x n x n BLIS sgemm calls on `threads` threads, in process.
double MeasureSgemmGflops(size_t n, size_t threads);
// GFLOP/s of `baseline`'s configuration (in process, or by a child process).
double MeasureBaseline(const SgemmBaseline& baseline, size_t n, size_t threads);
// The faster of BLIS's own configuration and, on AVX-512 targets, skx in a child process.
SgemmBaseline ChooseSgemmBaseline(size_t n, size_t threads);
// The child's side of the probe: `mha-bench --sgemm-probe N T`; returns the exit code.
int RunSgemmProbe(int argc, char** argv);

// Peak RSS per case on Linux: writing "5" to /proc/self/clear_refs resets the kernel's
// high-water mark (VmHWM) to the current RSS. getrusage's ru_maxrss cannot be reset (the kernel
// folds exited threads' peaks into it), so it is only the fallback.
class PeakRss {
 public:
  PeakRss();
  const char* method() const {
    return per_case_ ? "VmHWM, reset per case" : "ru_maxrss, process lifetime";
  }
  // Also hands freed heap memory back to the OS first (glibc keeps freed blocks resident, e.g.
  // the sgemm baseline's or the reference's buffers), so the next peak is the case's own.
  bool Reset();
  double PeakMib() const;
  bool per_case() const { return per_case_; }

 private:
  static long ReadVmHwmKib();
  bool per_case_ = false;
};

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_HOST_H_
