// mha-bench's host probes (tools/bench_host.h).
#include "tools/bench_host.h"

#include <blis.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

// __GLIBC__ is defined by the standard headers above.
#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include "mha/mha.hpp"
#include "runtime/trace.h"
#include "tools/bench_args.h"
#include "tools/bench_workload.h"

namespace mha {
namespace bench {

std::string OrUnknown(const char* s) { return s != nullptr && *s != '\0' ? s : "unknown"; }

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown";
}

// The 1-minute load average, or -1 where /proc/loadavg does not exist.
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) return -1;
  return load;
}

std::string IsoDateUtc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm_utc{};
  gmtime_r(&now, &tm_utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
  return buf;
}

// The BLIS sgemm baseline: GFLOP/s of the fastest of kSgemmReps n x n x n products on `threads`
// threads (BLIS's own threading, one rntm_t per call). The buffers are filled first, which faults
// their pages in, and freed on return, so that the mha runs measured after it are not charged for
// them (peak RSS); BLIS initializes itself in the first call of the process.
constexpr int kSgemmReps = 3;

double MeasureSgemmGflops(size_t n, size_t threads) {
  std::vector<float> a(n * n), b(n * n), c(n * n, 0.0f);
  Random rng(1);
  rng.Fill(&a, 1.0f);
  rng.Fill(&b, 1.0f);
  double best_s = 0;
  for (int rep = 0; rep < kSgemmReps; ++rep) {
    // rntm_t per call: BLIS writes its partitioning into it.
    rntm_t rntm;
    bli_rntm_init(&rntm);
    bli_rntm_set_num_threads(static_cast<dim_t>(threads), &rntm);
    float alpha = 1.0f, beta = 0.0f;
    const inc_t ld = static_cast<inc_t>(n);
    const int64_t t0 = TraceRecorder::NowNs();
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, static_cast<dim_t>(n), static_cast<dim_t>(n),
                 static_cast<dim_t>(n), &alpha, a.data(), ld, 1, b.data(), ld, 1, &beta, c.data(),
                 ld, 1, /*cntx=*/nullptr, &rntm);
    const double s = static_cast<double>(TraceRecorder::NowNs() - t0) * 1e-9;
    if (best_s == 0 || s < best_s) best_s = s;
  }
  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  return best_s > 0 ? flops / best_s * 1e-9 : 0.0;
}

// The BLIS configuration of the baseline: the one BLIS selects or, when mha dispatches an
// AVX-512 target, BLIS's skx configuration if it is faster. BLIS 0.9.0 selects its AVX2 haswell
// kernels on AVX-512 CPUs it does not know by model (about half skx's speed), which would make
// the baseline, and mha's efficiency against it, the AVX2 one. Debian's libblis does not export
// the lookup of another configuration's context and reads BLIS_ARCH_TYPE once per process, so
// the skx baseline runs in a child process (`mha-bench --sgemm-probe N T` with BLIS_ARCH_TYPE
// set), right where the in-process one would. With MHA_TARGETS forcing AVX2 the baseline stays
// BLIS's own choice.
namespace {

// GFLOP/s of the skx baseline measured by a child process of this executable; 0 on failure.
double ProbeSgemmGflops(size_t n, size_t threads) {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len <= 0) return 0.0;
  exe[len] = '\0';
  const std::string cmd = "BLIS_ARCH_TYPE=" + std::to_string(static_cast<int>(BLIS_ARCH_SKX)) +
                          " '" + exe + "' " + kSgemmProbeFlag + " " + std::to_string(n) + " " +
                          std::to_string(threads) + " 2>/dev/null";
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return 0.0;
  double gflops = 0.0;
  char arch[32] = {};
  const bool read = std::fscanf(pipe, "%lf %31s", &gflops, arch) == 2;
  const int status = pclose(pipe);
  return read && status == 0 && std::string(arch) == "skx" ? gflops : 0.0;
}

}  // namespace

double MeasureBaseline(const SgemmBaseline& baseline, size_t n, size_t threads) {
  return baseline.child ? ProbeSgemmGflops(n, threads) : MeasureSgemmGflops(n, threads);
}

SgemmBaseline ChooseSgemmBaseline(size_t n, size_t threads) {
  SgemmBaseline chosen{false, OrUnknown(BlasArch())};
  if (OrUnknown(SimdTarget()).rfind("AVX3", 0) != 0 || chosen.arch == "skx") return chosen;
  MeasureSgemmGflops(n, threads);  // initializes BLIS, warms up
  const double own = MeasureSgemmGflops(n, threads);
  if (ProbeSgemmGflops(n, threads) > own) chosen = {true, "skx"};
  return chosen;
}

// The child's side of ProbeSgemmGflops: prints "<GFLOP/s> <BLIS arch>" of the best of two
// measurements (the first also initializes BLIS).
int RunSgemmProbe(int argc, char** argv) {
  if (argc != 4) return kExitUsage;
  const long long n = std::atoll(argv[2]), threads = std::atoll(argv[3]);
  if (n <= 0 || n > 16384 || threads <= 0 || threads > 4096) return kExitUsage;
  const double first = MeasureSgemmGflops(static_cast<size_t>(n), static_cast<size_t>(threads));
  const double second = MeasureSgemmGflops(static_cast<size_t>(n), static_cast<size_t>(threads));
  std::printf("%.3f %s\n", std::max(first, second), OrUnknown(BlasArch()).c_str());
  return kExitOk;
}

PeakRss::PeakRss() { per_case_ = Reset() && ReadVmHwmKib() >= 0; }

bool PeakRss::Reset() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool wrote = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && wrote;
}

double PeakRss::PeakMib() const {
  if (per_case_) {
    const long kib = ReadVmHwmKib();
    if (kib >= 0) return static_cast<double>(kib) / 1024.0;
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
}

long PeakRss::ReadVmHwmKib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

}  // namespace bench
}  // namespace mha
