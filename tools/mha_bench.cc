// mha-bench: the profiler users run on their CPU. For each case (the default suite or one custom
// shape) and thread count it measures the latency of MultiheadAttention::Forward, reports
// GFLOP/s and efficiency relative to a BLIS sgemm measured in the same process, memory, and the
// error against a double-precision reference; optionally a per-stage breakdown, a Chrome trace
// and a comparison with peer libraries (bench_peers.h). See HelpText() in bench_args.cc for the
// user-facing description.
#include <blis.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

// __GLIBC__ is defined by the standard headers above.
#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include "kernels/elementwise.h"
#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "runtime/context_internal.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"
#include "tools/bench_args.h"
#include "tools/bench_bandwidth.h"
#include "tools/bench_check.h"
#include "tools/bench_peers.h"
#include "tools/bench_report.h"
#include "tools/bench_workload.h"

namespace mha {
namespace bench {
namespace {

// Measured runs per case stop here even before --min-time: bounds the sample memory for tiny
// cases with a long --min-time.
constexpr int64_t kMaxRuns = 1000000;

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

// A status line on stderr, redrawn in place; only when stderr is a terminal, so logs and pipes
// get no carriage returns.
class Progress {
 public:
  Progress() : enabled_(isatty(STDERR_FILENO) == 1) {}
  void Show(const std::string& text) {
    if (!enabled_) return;
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  // Show(text), or Clear() for "" (the peers' status callback).
  void ShowOrClear(const std::string& text) {
    if (text.empty()) {
      Clear();
    } else {
      Show(text);
    }
  }
  // Erases the line before anything else is printed.
  void Clear() {
    if (!enabled_ || !shown_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
};

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
// kernels on AVX-512 CPUs it does not know by model (Intel Emerald Rapids: 87 GFLOP/s per core
// against 162 with skx), which would make the baseline, and mha's efficiency against it, the
// AVX2 one. Debian's libblis does not export the lookup of another configuration's context and
// reads BLIS_ARCH_TYPE once per process, so the skx baseline runs in a child process
// (`mha-bench --sgemm-probe N T` with BLIS_ARCH_TYPE set), right where the in-process one would.
// With MHA_TARGETS forcing AVX2 the baseline stays BLIS's own choice.
constexpr const char kSgemmProbeFlag[] = "--sgemm-probe";

struct SgemmBaseline {
  bool child = false;  // measured by a child process with BLIS's skx configuration
  std::string arch;
};

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

// Peak RSS per case on Linux: writing "5" to /proc/self/clear_refs resets the kernel's
// high-water mark (VmHWM) to the current RSS. getrusage's ru_maxrss cannot be reset (the kernel
// folds exited threads' peaks into it), so it is only the fallback.
class PeakRss {
 public:
  PeakRss() { per_case_ = Reset() && ReadVmHwmKib() >= 0; }
  const char* method() const {
    return per_case_ ? "VmHWM, reset per case" : "ru_maxrss, process lifetime";
  }
  // Also hands freed heap memory back to the OS first (glibc keeps freed blocks resident, e.g.
  // the sgemm baseline's or the reference's buffers), so the next peak is the case's own.
  bool Reset() {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
    if (f == nullptr) return false;
    const bool wrote = std::fputs("5", f) >= 0;
    return std::fclose(f) == 0 && wrote;
  }
  double PeakMib() const {
    if (per_case_) {
      const long kib = ReadVmHwmKib();
      if (kib >= 0) return static_cast<double>(kib) / 1024.0;
    }
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
  }
  bool per_case() const { return per_case_; }

 private:
  static long ReadVmHwmKib() {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
    }
    return -1;
  }
  bool per_case_ = false;
};

// Linear interpolation between closest ranks (numpy's default), p in [0, 1].
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

// ---- one case ------------------------------------------------------------------------------

struct TraceCapture {
  bool wanted = false;  // record the first measured run of this case
  std::vector<TraceEvent> events;
  int64_t origin_ns = 0;
  int64_t wall_ns = 0;
  bool captured = false;
};

// Measures one case in o.rounds rounds. Each round times the BLIS baseline (o.sgemm_size, with
// the same threads; 0: none, no efficiency) and then mha's forward for its share of
// --min-time and --min-runs, so each round's efficiency divides two figures taken within about
// a second of each other; the case's efficiency is the median over rounds. On the shared VMs
// this runs on the machine's speed moves by tens of percent within seconds (the baseline read
// 90 and 155 GFLOP/s for two consecutive cases of one run), which a single baseline per case
// turned straight into the efficiency.
CaseResult RunCase(Workload& w, size_t threads, const BenchOptions& o,
                   const SgemmBaseline& baseline, PeakRss* rss, TraceCapture* capture) {
  CaseResult r;
  r.shape = w.shape();
  r.threads = threads;
  ContextOptions context_options;
  context_options.num_threads = threads;
  std::unique_ptr<Context> context;
  Status st = Context::Create(context_options, &context);
  if (!st.ok()) {
    r.error = "Context::Create: " + st.ToString();
    return r;
  }
  size_t workspace = 0;
  st = w.layer().Plan(w.inputs(), w.outputs(), threads, &workspace);
  if (!st.ok()) {
    r.error = "Plan: " + st.ToString();
    return r;
  }
  r.workspace_bytes = workspace;
  st = ReserveArena(*context, workspace);
  if (!st.ok()) {
    r.error = "Context::Reserve: " + st.ToString();
    return r;
  }

  // Warm-up (untimed). When recording, it also counts the trace events of one forward, which
  // sizes the recorder so that the measured runs drop none.
  const bool record = o.breakdown || capture->wanted;
  TraceRecorder probe(1);
  if (record) SetTrace(*context, &probe);
  w.ClearOutputs();
  st = w.layer().Forward(*context, w.inputs(), w.outputs());
  SetTrace(*context, nullptr);
  if (!st.ok()) {
    r.error = "Forward: " + st.ToString();
    return r;
  }
  const CheckResult check = CheckAccuracy(w, threads);
  r.max_abs_err = check.max_abs_err;
  r.rows_checked = check.rows_checked;

  std::unique_ptr<TraceRecorder> recorder;
  if (record) recorder = std::make_unique<TraceRecorder>(2 * probe.count.load() + 1024);
  double stage_ns[kNumStages] = {};
  uint64_t dropped = 0;

  const double flops = AttentionFlops(r.shape);
  const int64_t rounds = o.rounds;
  // Each round's share of the case's minimum runs and time.
  const int64_t round_min_runs = (o.min_runs + rounds - 1) / rounds;
  const int64_t round_min_ns =
      static_cast<int64_t>(o.min_time_s * 1e9 / static_cast<double>(rounds));
  const int64_t round_max_runs = std::max<int64_t>(kMaxRuns / rounds, 1);
  std::vector<double> samples_ms, round_ms;
  samples_ms.reserve(static_cast<size_t>(o.min_runs));
  for (int64_t round = 0; round < rounds; ++round) {
    RoundResult rr;
    if (o.sgemm_size > 0) {
      rr.sgemm_gflops = MeasureBaseline(baseline, static_cast<size_t>(o.sgemm_size), threads);
    }
    rss->Reset();
    round_ms.clear();
    const int64_t start_ns = TraceRecorder::NowNs();
    for (;;) {
      const bool record_this = o.breakdown || (capture->wanted && !capture->captured);
      if (record_this) {
        recorder->Clear();
        SetTrace(*context, recorder.get());
      }
      const int64_t t0 = TraceRecorder::NowNs();
      st = w.layer().Forward(*context, w.inputs(), w.outputs());
      const int64_t t1 = TraceRecorder::NowNs();
      if (!st.ok()) {
        SetTrace(*context, nullptr);
        r.error = "Forward (measured run " + std::to_string(samples_ms.size() + 1) +
                  "): " + st.ToString();
        return r;
      }
      round_ms.push_back(static_cast<double>(t1 - t0) * 1e-6);
      samples_ms.push_back(round_ms.back());
      if (record_this) {
        SetTrace(*context, nullptr);
        const size_t n = recorder->size();
        dropped += recorder->dropped.load();
        for (size_t i = 0; i < n; ++i) {
          const TraceEvent& e = recorder->events[i];
          const int s = static_cast<int>(e.stage);
          if (s >= 0 && s < kNumStages) stage_ns[s] += static_cast<double>(e.end_ns - e.begin_ns);
        }
        if (capture->wanted && !capture->captured) {
          capture->events.assign(recorder->events.begin(), recorder->events.begin() + n);
          capture->origin_ns = t0;
          capture->wall_ns = t1 - t0;
          capture->captured = true;
        }
      }
      const int64_t runs = static_cast<int64_t>(round_ms.size());
      if ((runs >= round_min_runs && t1 - start_ns >= round_min_ns) || runs >= round_max_runs) {
        break;
      }
    }
    std::sort(round_ms.begin(), round_ms.end());
    rr.runs = static_cast<int64_t>(round_ms.size());
    rr.median_ms = Percentile(round_ms, 0.5);
    rr.gflops = flops / (rr.median_ms * 1e-3) * 1e-9;
    rr.efficiency = rr.sgemm_gflops > 0 ? rr.gflops / rr.sgemm_gflops : NAN;
    r.rounds.push_back(rr);
    r.peak_rss_mib = std::max(r.peak_rss_mib, rss->PeakMib());
  }
  r.arena_high_water = context->arena_high_water();

  r.runs = static_cast<int64_t>(samples_ms.size());
  double sum_ms = 0;
  for (double s : samples_ms) sum_ms += s;
  std::sort(samples_ms.begin(), samples_ms.end());
  r.median_ms = Percentile(samples_ms, 0.5);
  r.p10_ms = Percentile(samples_ms, 0.1);
  r.p90_ms = Percentile(samples_ms, 0.9);
  r.gflops = flops / (r.median_ms * 1e-3) * 1e-9;
  if (o.sgemm_size > 0) {
    std::vector<double> sgemm, eff;
    for (const RoundResult& rr : r.rounds) {
      sgemm.push_back(rr.sgemm_gflops);
      eff.push_back(rr.efficiency);
    }
    std::sort(sgemm.begin(), sgemm.end());
    std::sort(eff.begin(), eff.end());
    r.sgemm_gflops = Percentile(sgemm, 0.5);
    r.efficiency = Percentile(eff, 0.5);
  } else {
    r.efficiency = NAN;
  }
  if (o.breakdown) {
    r.has_breakdown = true;
    const double per_run_ms = 1e-6 / static_cast<double>(r.runs) / static_cast<double>(threads);
    double stages_ms = 0;
    for (int s = 0; s < kNumStages; ++s) {
      r.breakdown.stage_ms[s] = stage_ns[s] * per_run_ms;
      stages_ms += r.breakdown.stage_ms[s];
    }
    r.breakdown.wall_ms = sum_ms / static_cast<double>(r.runs);
    r.breakdown.overhead_ms = r.breakdown.wall_ms - stages_ms;
    r.breakdown.dropped_events = dropped;
  }
  return r;
}

// Opens an output file at start-up, so that a bad path fails before a long run, not after.
bool OpenOutput(const char* flag, const std::string& path, std::ofstream* out) {
  if (path.empty()) return true;
  out->open(path, std::ios::out | std::ios::trunc);
  if (!out->is_open()) {
    std::fprintf(stderr, "mha-bench: %s: expected a writable file, got '%s': %s\n", flag,
                 path.c_str(), std::strerror(errno));
    return false;
  }
  return true;
}

bool FinishOutput(const char* flag, const std::string& path, std::ofstream* out) {
  out->close();
  if (out->fail()) {
    std::fprintf(stderr, "mha-bench: %s: writing '%s' failed\n", flag, path.c_str());
    return false;
  }
  return true;
}

int Run(const BenchOptions& o) {
  std::ofstream json_out, csv_out, trace_out;
  if (!OpenOutput("--json", o.json_path, &json_out) || !OpenOutput("--csv", o.csv_path, &csv_out) ||
      !OpenOutput("--trace", o.trace_path, &trace_out)) {
    return kExitUsage;
  }
  const std::vector<Shape> cases = CasesToRun(o);
  Progress progress;
  PeakRss rss;

  RunHeader header;
  header.cpu = CpuModel();
  header.simd_target = OrUnknown(SimdTarget());
  header.blas_arch = OrUnknown(BlasArch());
  header.mha_version = OrUnknown(Version());
  header.date = IsoDateUtc();
  const unsigned hw = std::thread::hardware_concurrency();
  header.hardware_threads = hw == 0 ? 1 : hw;
  header.threads = o.threads;
  header.sgemm_size = o.sgemm_size;
  header.min_time_s = o.min_time_s;
  header.min_runs = o.min_runs;
  header.rounds = o.rounds;
  header.tolerance = o.tolerance;
  header.seed = o.seed;
  header.prepack = !o.no_prepack;
  header.strassen = o.strassen;
  header.peak_rss_method = rss.method();
  header.load_average = LoadAverage();
  header.breakdown = o.breakdown;
  header.compare = o.compare;

  PrintHeader(stdout, header);
  std::fflush(stdout);
  SgemmBaseline baseline;
  if (o.sgemm_size > 0) {
    progress.Show("choosing the BLIS configuration of the sgemm baseline...");
    baseline = ChooseSgemmBaseline(static_cast<size_t>(o.sgemm_size),
                                   *std::max_element(o.threads.begin(), o.threads.end()));
    header.sgemm_arch = baseline.arch;
    for (size_t t : o.threads) {
      progress.Show("measuring the BLIS sgemm baseline (" + std::to_string(o.sgemm_size) + "^3, " +
                    std::to_string(t) + " thread(s))...");
      // In process twice: the first call also initializes BLIS and its packing buffers (a child
      // probe warms up inside its own process).
      if (!baseline.child) MeasureSgemmGflops(static_cast<size_t>(o.sgemm_size), t);
      header.sgemm_gflops[t] = MeasureBaseline(baseline, static_cast<size_t>(o.sgemm_size), t);
    }
    progress.Clear();
  }
  std::unique_ptr<PeerComparison> peers;
  if (!o.compare.empty()) peers = std::make_unique<PeerComparison>(o);
  const auto show = [&progress](const std::string& text) { progress.ShowOrClear(text); };
  // The column titles name the peers' versions, known after the first comparison: printed
  // right before the first row.
  bool titles_printed = false;

  std::vector<CaseResult> results;
  bool failed = false, inaccurate = false;
  const size_t total = cases.size() * o.threads.size();
  for (size_t c = 0; c < cases.size(); ++c) {
    const Shape& shape = cases[c];
    progress.Show("[" + std::to_string(results.size() + 1) + "/" + std::to_string(total) + "] " +
                  ShapeLabel(shape) + ": preparing weights...");
    std::unique_ptr<Workload> workload;
    const Status st = Workload::Create(shape, o.seed, &workload);
    for (size_t t : o.threads) {
      progress.Show("[" + std::to_string(results.size() + 1) + "/" + std::to_string(total) + "] " +
                    ShapeLabel(shape) + ", " + std::to_string(t) + " thread(s)");
      TraceCapture capture;
      capture.wanted = !o.trace_path.empty() && results.empty();
      CaseResult r;
      if (!st.ok()) {
        r.shape = shape;
        r.threads = t;
        r.error = "MultiheadAttention::Create: " + st.ToString();
      } else {
        r = RunCase(*workload, t, o, baseline, &rss, &capture);
        // Right after mha's runs, on the same weights and inputs: the peers see the machine
        // in the state mha did.
        if (peers != nullptr && r.error.empty()) {
          peers->Run(*workload, t, show, &r);
          peers->Describe(&header);
        }
      }
      progress.Clear();
      if (!titles_printed) {
        PrintColumnTitles(stdout, header);
        titles_printed = true;
      }
      PrintRow(stdout, header, r);
      std::fflush(stdout);
      if (!r.error.empty()) {
        failed = true;
        std::fprintf(stderr, "mha-bench: %s, %zu thread(s): %s\n", ShapeLabel(shape).c_str(), t,
                     r.error.c_str());
      } else if (!(r.max_abs_err <= o.tolerance)) {
        inaccurate = true;
        std::fprintf(stderr,
                     "mha-bench: %s, %zu thread(s): max abs error %.3g exceeds the tolerance "
                     "%g\n",
                     ShapeLabel(shape).c_str(), t, r.max_abs_err, o.tolerance);
      }
      if (r.has_breakdown && r.breakdown.dropped_events > 0) {
        std::fprintf(
            stderr, "mha-bench: note: %s: %llu trace events dropped; breakdown incomplete\n",
            ShapeLabel(shape).c_str(), static_cast<unsigned long long>(r.breakdown.dropped_events));
      }
      if (capture.wanted) {
        if (capture.captured && capture.events.empty()) {
          std::fprintf(stderr,
                       "mha-bench: note: --trace: the operator recorded no events; the trace "
                       "has worker lanes only\n");
        }
        WriteChromeTrace(trace_out, shape, t, capture.events, capture.origin_ns, capture.wall_ns);
      }
      results.push_back(std::move(r));
    }
  }
  progress.Clear();
  if (o.breakdown) PrintBreakdownTable(stdout, results);
  std::fflush(stdout);

  bool io_ok = true;
  if (!o.json_path.empty()) {
    WriteJson(json_out, header, results);
    io_ok = FinishOutput("--json", o.json_path, &json_out) && io_ok;
  }
  if (!o.csv_path.empty()) {
    WriteCsv(csv_out, header, results);
    io_ok = FinishOutput("--csv", o.csv_path, &csv_out) && io_ok;
  }
  if (!o.trace_path.empty()) io_ok = FinishOutput("--trace", o.trace_path, &trace_out) && io_ok;
  if (failed || !io_ok) return kExitFailure;
  return inaccurate ? kExitInaccurate : kExitOk;
}

// ---- --decode -------------------------------------------------------------------------------

// The decode suite's fixed model: E 1024, 16 heads of 64.
constexpr int64_t kDecodeEmbed = 1024;
constexpr int64_t kDecodeHeads = 16;

struct DecodeResult {
  int64_t context = 0, batch = 0, kv_heads = 0;
  DType dtype = DType::kF32;    // cache storage
  DType weights = DType::kF32;  // the layer's weight storage
  size_t threads = 1;
  std::string error;
  int64_t runs = 0;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  double tokens_per_s = 0;
  double cache_bytes = 0;  // K+V read per step
  double weight_bytes = 0;
  double cache_gbs = 0, total_gbs = 0;
  double attn_ms = 0, attn_gbs = 0;  // the attention over the cache alone (trace events)
  double copy_gbs = 0;               // the machine's copy bandwidth at this thread count
  double read_gbs = 0;               // and its streaming read bandwidth: a step's limit
  // --compare: the peers' f32 decode step of this (context, batch, kv heads, threads), timed
  // right after mha's f32 row; rows of other cache types show the same peer times.
  std::map<std::string, PeerResult> peers;
};

// Bytes of one cache row of hd elements in `dtype` (int8: its codes and f32 scale).
double CacheRowBytes(DType dtype, int64_t hd) {
  return dtype == DType::kI8 ? static_cast<double>(hd + 4)
                             : static_cast<double>(hd) * static_cast<double>(DTypeSize(dtype));
}

// A layer with separate q/k/v weights (the GQA layout, kept for kv_heads = heads too) and random
// weights, plus random projected keys/values for the largest batch and context (none for the
// prefill rows), viewed per case.
struct DecodeModel {
  int64_t embed = 0, heads = 0, kv_heads = 0;
  // The weights as the layer holds them: a 16-bit layer's matrices rounded to its dtype (and
  // widened back), so that the peers get the very values mha multiplies.
  std::vector<float> wq, wk, wv, bias, wo, bo;
  std::unique_ptr<MultiheadAttention> layer;
  std::vector<float> kv;  // [2][max_batch, kv_heads, max_context, hd]
  int64_t max_batch = 0, max_context = 0;
};

// Rounds *w to `dtype` (bf16 or f16, nearest even, as a kCopy layer stores it) and back to f32.
void RoundWeights(DType dtype, std::vector<float>* w) {
  std::vector<uint16_t> bits(w->size());
  if (dtype == DType::kBF16) {
    kernels::F32ToBF16(w->data(), bits.data(), w->size());
    kernels::BF16ToF32(bits.data(), w->data(), w->size());
  } else {
    kernels::F32ToF16(w->data(), bits.data(), w->size());
    kernels::F16ToF32(bits.data(), w->data(), w->size());
  }
}

Status MakeDecodeModel(int64_t embed, int64_t heads, int64_t kv_heads, int64_t max_batch,
                       int64_t max_context, uint64_t seed, DType weights, DecodeModel* m) {
  const int64_t E = embed, hd = E / heads, kvE = kv_heads * hd;
  Random rng(seed + static_cast<uint64_t>(kv_heads));
  const float bound = 1.0f / std::sqrt(static_cast<float>(E));
  m->embed = embed;
  m->heads = heads;
  m->kv_heads = kv_heads;
  m->wq.resize(E * E);
  m->wk.resize(kvE * E);
  m->wv.resize(kvE * E);
  m->bias.resize(E + 2 * kvE);
  m->wo.resize(E * E);
  m->bo.resize(E);
  for (auto* w : {&m->wq, &m->wk, &m->wv, &m->bias, &m->wo, &m->bo}) rng.Fill(w, bound);
  if (weights != DType::kF32) {
    // Biases stay f32 in a 16-bit layer.
    for (auto* w : {&m->wq, &m->wk, &m->wv, &m->wo}) RoundWeights(weights, w);
  }
  AttentionConfig c;
  c.embed_dim = E;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.batch_first = true;
  c.weight_dtype = weights;
  AttentionWeights w;
  w.q_proj_weight = m->wq.data();
  w.k_proj_weight = m->wk.data();
  w.v_proj_weight = m->wv.data();
  w.in_proj_bias = m->bias.data();
  w.out_proj_weight = m->wo.data();
  w.out_proj_bias = m->bo.data();
  m->max_batch = max_batch;
  m->max_context = max_context;
  m->kv.resize(2 * static_cast<size_t>(max_batch * kv_heads * max_context * hd));
  rng.Fill(&m->kv, 1.0f);
  // kCopy: a 16-bit layer stores the (already rounded, so unchanged) weights in 16 bits.
  return MultiheadAttention::Create(c, w, WeightBinding::kCopy, &m->layer);
}

// Times KvCache::Step of one token per entry over `context` - 1 cached positions; with `peers`
// (an f32 cache only), then the peers' step on the same layer, cache contents and token.
DecodeResult RunDecodeCase(const DecodeModel& m, int64_t context, int64_t batch, DType dtype,
                           size_t threads, const BenchOptions& o, PeerComparison* peers,
                           const std::function<void(const std::string&)>& status) {
  DecodeResult r;
  r.context = context;
  r.batch = batch;
  r.kv_heads = m.kv_heads;
  r.dtype = dtype;
  r.weights = m.layer->config().weight_dtype;
  r.threads = threads;
  const int64_t E = m.embed, hd = E / m.heads, kvh = m.kv_heads;
  ContextOptions co;
  co.num_threads = threads;
  std::unique_ptr<Context> ctx;
  Status st = Context::Create(co, &ctx);
  std::unique_ptr<KvCache> cache;
  if (st.ok())
    st = KvCache::Create(KvCacheOptions::ForLayer(*m.layer, batch, context, dtype), &cache);
  // Fill context - 1 positions from the model's random keys/values (a strided view of them).
  const int64_t prior = context - 1;
  const int64_t batch_stride = kvh * m.max_context * hd, head_stride = m.max_context * hd;
  const float* keys = m.kv.data();
  const float* values = keys + m.kv.size() / 2;
  if (st.ok() && prior > 0) {
    const int64_t shape[4] = {batch, kvh, prior, hd};
    const int64_t strides[4] = {batch_stride, head_stride, hd, 1};
    float* k = const_cast<float*>(keys);
    float* v = const_cast<float*>(values);
    TensorView kt, vt;
    st = TensorView::Strided(k, DType::kF32, 4, shape, strides, &kt, "k");
    if (st.ok()) st = TensorView::Strided(v, DType::kF32, 4, shape, strides, &vt, "v");
    if (st.ok()) st = cache->AppendProjected(kt, vt);
  }
  std::vector<float> x(batch * E), out(batch * E);
  Random rng(o.seed);
  rng.Fill(&x, 1.0f);
  const int64_t xs[3] = {batch, 1, E};
  TensorView xv, ov;
  if (st.ok()) st = TensorView::Dense(x.data(), DType::kF32, 3, xs, &xv, "x");
  if (st.ok()) st = TensorView::Dense(out.data(), DType::kF32, 3, xs, &ov, "output");
  auto rewind = [&] {
    for (int64_t n = 0; n < batch && st.ok(); ++n) st = cache->Truncate(n, prior);
  };
  // Warm-up: the arena grows to the plan, caches and pages settle.
  for (int i = 0; i < 2 && st.ok(); ++i) {
    st = cache->Step(*ctx, *m.layer, xv, ov);
    rewind();
  }
  if (!st.ok()) {
    r.error = st.ToString();
    return r;
  }
  std::vector<double> samples_ms, attn_samples_ms;
  // The attention tasks of one step record events here (at most batch * kv_heads * chunks
  // + batch * heads of them; generously sized, never reallocated while timing).
  TraceRecorder recorder(static_cast<size_t>(4 * batch * m.heads * (context / 64 + 2)));
  SetTrace(*ctx, &recorder);
  const int64_t min_time_ns = static_cast<int64_t>(o.min_time_s * 1e9);
  const int64_t start_ns = TraceRecorder::NowNs();
  for (;;) {
    recorder.Clear();
    const int64_t t0 = TraceRecorder::NowNs();
    st = cache->Step(*ctx, *m.layer, xv, ov);
    const int64_t t1 = TraceRecorder::NowNs();
    if (st.ok()) rewind();
    if (!st.ok()) {
      r.error = "KvCache::Step: " + st.ToString();
      return r;
    }
    samples_ms.push_back(static_cast<double>(t1 - t0) * 1e-6);
    int64_t first = 0, last = 0;
    for (size_t i = 0; i < recorder.size(); ++i) {
      const TraceEvent& e = recorder.events[i];
      if (e.stage != Stage::kCacheAttention) continue;
      first = first == 0 ? e.begin_ns : std::min(first, e.begin_ns);
      last = std::max(last, e.end_ns);
    }
    attn_samples_ms.push_back(static_cast<double>(last - first) * 1e-6);
    const int64_t runs = static_cast<int64_t>(samples_ms.size());
    if ((runs >= o.min_runs && t1 - start_ns >= min_time_ns) || runs >= kMaxRuns) break;
  }
  r.runs = static_cast<int64_t>(samples_ms.size());
  std::sort(samples_ms.begin(), samples_ms.end());
  r.median_ms = Percentile(samples_ms, 0.5);
  r.p10_ms = Percentile(samples_ms, 0.1);
  r.p90_ms = Percentile(samples_ms, 0.9);
  std::sort(attn_samples_ms.begin(), attn_samples_ms.end());
  r.attn_ms = Percentile(attn_samples_ms, 0.5);
  const double sec = r.median_ms * 1e-3;
  r.tokens_per_s = static_cast<double>(batch) / sec;
  r.cache_bytes = 2.0 * static_cast<double>(batch * kvh * context) * CacheRowBytes(dtype, hd);
  r.weight_bytes = static_cast<double>(DTypeSize(m.layer->config().weight_dtype)) *
                   static_cast<double>(2 * E * E + 2 * kvh * hd * E);
  r.cache_gbs = r.cache_bytes / sec * 1e-9;
  r.attn_gbs = r.attn_ms > 0 ? r.cache_bytes / (r.attn_ms * 1e-3) * 1e-9 : 0.0;
  r.total_gbs = (r.cache_bytes + r.weight_bytes) / sec * 1e-9;
  if (peers != nullptr && dtype == DType::kF32) {
    // mha's threads and cache go first: the peers get the machine as mha had it.
    ctx.reset();
    cache.reset();
    // `out` holds the last timed step's output: every step attends the same cache and token.
    DecodePeerCase c;
    c.batch = batch;
    c.context = context;
    c.embed = E;
    c.heads = m.heads;
    c.kv_heads = kvh;
    c.q_weight = m.wq.data();
    c.k_weight = m.wk.data();
    c.v_weight = m.wv.data();
    c.in_bias = m.bias.data();
    c.out_weight = m.wo.data();
    c.out_bias = m.bo.data();
    c.keys = keys;
    c.values = values;
    c.batch_stride = batch_stride;
    c.head_stride = head_stride;
    c.x = x.data();
    c.output = out.data();
    peers->RunDecode(c, threads, status, &r.peers);
  }
  return r;
}

// ---- --decode: prefill rows ------------------------------------------------------------------

// One prefill row: KvCache::Step of `tokens` prompt tokens per entry into an empty f32 cache
// against MultiheadAttention::Forward with causal on the same layer, input and threads.
struct PrefillResult {
  int64_t tokens = 0, batch = 0, embed = 0, heads = 0, kv_heads = 0;
  size_t threads = 1;
  std::string error;
  int64_t runs = 0;  // timed runs of each
  double step_ms = 0, step_p10_ms = 0, step_p90_ms = 0;
  double forward_ms = 0, forward_p10_ms = 0, forward_p90_ms = 0;
  double max_abs_diff = 0;  // between the step's and the forward's outputs
};

// The prefill rows' layers and batch, for every prompt length of --prefill; the batch-8 row only
// up to kPrefillBatchedMaxTokens tokens (at 2048 tokens each of its calls takes about a second,
// over 10 s per thread count with the warm-up and 5 runs of each).
struct PrefillShape {
  int64_t embed, heads, kv_heads, batch;
};
constexpr PrefillShape kPrefillShapes[] = {{1024, 16, 16, 1}, {1024, 16, 4, 1}, {768, 12, 12, 8}};
constexpr int64_t kPrefillBatchedMaxTokens = 512;

PrefillResult RunPrefillCase(const DecodeModel& m, int64_t tokens, int64_t batch, size_t threads,
                             const BenchOptions& o) {
  PrefillResult r;
  r.tokens = tokens;
  r.batch = batch;
  r.embed = m.embed;
  r.heads = m.heads;
  r.kv_heads = m.kv_heads;
  r.threads = threads;
  const int64_t E = m.embed;
  ContextOptions co;
  co.num_threads = threads;
  std::unique_ptr<Context> ctx;
  Status st = Context::Create(co, &ctx);
  std::unique_ptr<KvCache> cache;
  if (st.ok()) {
    st = KvCache::Create(KvCacheOptions::ForLayer(*m.layer, batch, tokens, DType::kF32), &cache);
  }
  const size_t n = static_cast<size_t>(batch * tokens * E);
  std::vector<float> x(n), step_out(n), forward_out(n);
  Random rng(o.seed);
  rng.Fill(&x, 1.0f);
  const int64_t shape[3] = {batch, tokens, E};
  AttentionInputs in;
  in.causal = true;
  AttentionOutputs forward_outputs;
  TensorView step_view;
  if (st.ok()) st = TensorView::Dense(x.data(), DType::kF32, 3, shape, &in.query, "x");
  if (st.ok()) {
    st = TensorView::Dense(step_out.data(), DType::kF32, 3, shape, &step_view, "step output");
  }
  if (st.ok()) {
    st = TensorView::Dense(forward_out.data(), DType::kF32, 3, shape, &forward_outputs.output,
                           "forward output");
  }
  // One call of either; the step always starts from an empty cache.
  const char* op = "prefill";
  const auto call = [&](bool step) {
    op = step ? "KvCache::Step" : "MultiheadAttention::Forward";
    if (!step) return m.layer->Forward(*ctx, in, forward_outputs);
    cache->Reset();
    return cache->Step(*ctx, *m.layer, in.query, step_view);
  };
  // Warm-up, one of each: the arena grows to the larger plan, pages settle.
  if (st.ok()) st = call(true);
  if (st.ok()) st = call(false);
  std::vector<double> step_ms, forward_ms;
  const int64_t min_time_ns = static_cast<int64_t>(o.min_time_s * 1e9);
  const int64_t start_ns = TraceRecorder::NowNs();
  for (int64_t run = 0; st.ok(); ++run) {
    // A/B alternating: the step first on even runs, the forward first on odd ones, so that
    // neither always follows the other (warm caches, the machine's drift within seconds).
    for (int k = 0; k < 2 && st.ok(); ++k) {
      const bool step = (k == 0) == (run % 2 == 0);
      const int64_t t0 = TraceRecorder::NowNs();
      st = call(step);
      (step ? step_ms : forward_ms)
          .push_back(static_cast<double>(TraceRecorder::NowNs() - t0) * 1e-6);
    }
    const int64_t runs = run + 1;
    if ((runs >= o.min_runs && TraceRecorder::NowNs() - start_ns >= min_time_ns) ||
        runs >= kMaxRuns) {
      break;
    }
  }
  if (!st.ok()) {
    r.error = std::string(op) + ": " + st.ToString();
    return r;
  }
  r.runs = static_cast<int64_t>(step_ms.size());
  std::sort(step_ms.begin(), step_ms.end());
  std::sort(forward_ms.begin(), forward_ms.end());
  r.step_ms = Percentile(step_ms, 0.5);
  r.step_p10_ms = Percentile(step_ms, 0.1);
  r.step_p90_ms = Percentile(step_ms, 0.9);
  r.forward_ms = Percentile(forward_ms, 0.5);
  r.forward_p10_ms = Percentile(forward_ms, 0.1);
  r.forward_p90_ms = Percentile(forward_ms, 0.9);
  for (size_t i = 0; i < n; ++i) {
    r.max_abs_diff =
        std::max(r.max_abs_diff, static_cast<double>(std::fabs(step_out[i] - forward_out[i])));
  }
  return r;
}

// The prefill rows of --decode: prints their table, fills *results; false if any failed.
bool RunPrefill(const BenchOptions& o, Progress* progress, std::vector<PrefillResult>* results) {
  std::printf(
      "\nprefill: KvCache::Step of `tokens` prompt tokens per entry into an empty f32 cache "
      "against MultiheadAttention::Forward with causal of the same shape (same layer, input and "
      "threads; alternating, medians); step/fwd = step_ms / forward_ms, max_diff = max |step "
      "output - forward output|\n");
  std::printf("%7s %6s %5s %5s %4s %7s %10s %10s %8s %9s\n", "tokens", "batch", "embed", "heads",
              "kvh", "threads", "step_ms", "forward_ms", "step/fwd", "max_diff");
  std::fflush(stdout);
  bool ok = true;
  for (const PrefillShape& shape : kPrefillShapes) {
    DecodeModel model;
    Status st;
    bool made = false;
    for (int64_t tokens : o.prefill_tokens) {
      if (shape.batch > 1 && tokens > kPrefillBatchedMaxTokens) continue;
      if (!made) {
        progress->Show("preparing the prefill layer (E " + std::to_string(shape.embed) + ", " +
                       std::to_string(shape.heads) + " heads)...");
        st = MakeDecodeModel(shape.embed, shape.heads, shape.kv_heads, 0, 0, o.seed,
                             o.decode_weights, &model);
        made = true;
      }
      for (size_t t : o.threads) {
        progress->Show("prefill " + std::to_string(tokens) + " tokens, E " +
                       std::to_string(shape.embed) + ", batch " + std::to_string(shape.batch) +
                       ", " + std::to_string(t) + " thread(s)");
        PrefillResult r;
        if (st.ok()) {
          r = RunPrefillCase(model, tokens, shape.batch, t, o);
        } else {
          r.tokens = tokens;
          r.batch = shape.batch;
          r.embed = shape.embed;
          r.heads = shape.heads;
          r.kv_heads = shape.kv_heads;
          r.threads = t;
          r.error = "MultiheadAttention::Create: " + st.ToString();
        }
        progress->Clear();
        std::printf("%7lld %6lld %5lld %5lld %4lld %7zu ", static_cast<long long>(r.tokens),
                    static_cast<long long>(r.batch), static_cast<long long>(r.embed),
                    static_cast<long long>(r.heads), static_cast<long long>(r.kv_heads), t);
        if (!r.error.empty()) {
          ok = false;
          std::printf(" FAILED\n");
          std::fprintf(stderr, "mha-bench: prefill %lld tokens, E %lld, batch %lld: %s\n",
                       static_cast<long long>(r.tokens), static_cast<long long>(r.embed),
                       static_cast<long long>(r.batch), r.error.c_str());
        } else {
          std::printf("%10.3f %10.3f %8.3f %8.1e%s\n", r.step_ms, r.forward_ms,
                      r.step_ms / r.forward_ms, r.max_abs_diff,
                      r.max_abs_diff <= o.tolerance ? "" : "!");
        }
        std::fflush(stdout);
        results->push_back(std::move(r));
      }
    }
  }
  return ok;
}

// ---- --decode: the run ----------------------------------------------------------------------

// The peers' cells of a decode row: <peer>_ms and <peer>/mha ('!' when its output disagreed).
std::string PeerCells(const std::vector<std::string>& compare, const DecodeResult& r) {
  std::string cells;
  for (const std::string& p : compare) {
    const auto it = r.peers.find(p);
    char buf[64];
    if (it == r.peers.end() || !it->second.timed) {
      std::snprintf(buf, sizeof(buf), " %9s %9s", "-", "-");
    } else {
      std::snprintf(buf, sizeof(buf), " %9.3f %8.2f%s", it->second.median_ms,
                    PeerRatio(r.peers, p, r.median_ms),
                    it->second.max_abs_err <= it->second.tolerance ? " " : "!");
    }
    cells += buf;
  }
  return cells;
}

int RunDecode(const BenchOptions& o) {
  std::ofstream json_out, csv_out;
  if (!OpenOutput("--json", o.json_path, &json_out) || !OpenOutput("--csv", o.csv_path, &csv_out)) {
    return kExitUsage;
  }
  Progress progress;
  std::printf("mha-bench --decode: mha %s, SIMD target %s, CPU %s, %s\n",
              OrUnknown(Version()).c_str(), OrUnknown(SimdTarget()).c_str(), CpuModel().c_str(),
              IsoDateUtc().c_str());
  std::printf("model: E %lld, %lld heads of %lld; one new token per batch entry per step\n",
              static_cast<long long>(kDecodeEmbed), static_cast<long long>(kDecodeHeads),
              static_cast<long long>(kDecodeEmbed / kDecodeHeads));
  std::map<size_t, double> copy_gbs, read_gbs;
  progress.Show("allocating the read-bandwidth probe's buffer...");
  const ReadProbe read_probe;
  for (size_t t : o.threads) {
    progress.Show("measuring copy and read bandwidth (" + std::to_string(t) + " thread(s))...");
    copy_gbs[t] = MeasureCopyGbs(t);
    read_gbs[t] = read_probe.Measure(t, 8);
    progress.Clear();
    std::printf("copy bandwidth (memcpy 256 MiB, read + written), %zu thread(s): %.1f GB/s\n", t,
                copy_gbs[t]);
    std::printf("read bandwidth (streaming sum of %zu MiB), %zu thread(s): %.1f GB/s\n",
                ReadBufferBytes() >> 20, t, read_gbs[t]);
  }
  std::printf("weights: %s\n", DTypeName(o.decode_weights));
  std::unique_ptr<PeerComparison> peers;
  if (!o.compare.empty()) {
    peers = std::make_unique<PeerComparison>(o);
    std::printf(
        "peers: <peer>_ms = the peer's f32 decode step on the same layer, cache contents, token "
        "and threads, timed right after mha's f32 row (the bf16 and i8 rows repeat it); "
        "<peer>/mha = <peer>_ms / median_ms, above 1: mha is faster; '!': its output differs "
        "from mha's f32 step by more than --tolerance\n");
  }
  const auto status = [&progress](const std::string& text) { progress.ShowOrClear(text); };
  std::printf("\n%8s %6s %4s %5s %7s %10s %10s %10s %9s %10s %13s %6s %9s %8s %9s %6s", "context",
              "batch", "kvh", "cache", "threads", "median_ms", "p90_ms", "tokens/s", "cache_MiB",
              "cache_GB/s", "+weights_GB/s", "read%", "+weights%", "attn_ms", "attn_GB/s", "attn%");
  for (const std::string& p : o.compare) {
    std::printf(" %9s %9s", (p + "_ms").c_str(), (p + "/mha").c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
  const int64_t max_batch = *std::max_element(o.decode_batches.begin(), o.decode_batches.end());
  const int64_t max_context = *std::max_element(o.decode_contexts.begin(), o.decode_contexts.end());
  std::vector<DecodeResult> results;
  bool failed = false;
  for (int64_t kvh : {kDecodeHeads, int64_t{4}}) {
    progress.Show("preparing the " + std::string(kvh == kDecodeHeads ? "MHA" : "GQA") +
                  " layer and random keys/values...");
    DecodeModel model;
    const Status st = MakeDecodeModel(kDecodeEmbed, kDecodeHeads, kvh, max_batch, max_context,
                                      o.seed, o.decode_weights, &model);
    progress.Clear();
    for (int64_t context : o.decode_contexts) {
      for (int64_t batch : o.decode_batches) {
        // The peers' results of the f32 rows, by thread count, for the other cache types' rows.
        std::map<size_t, std::map<std::string, PeerResult>> f32_peers;
        for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8}) {
          for (size_t t : o.threads) {
            progress.Show("context " + std::to_string(context) + ", batch " +
                          std::to_string(batch) + ", " + DTypeName(dtype) + ", " +
                          std::to_string(t) + " thread(s)");
            DecodeResult r;
            if (!st.ok()) {
              r.context = context;
              r.batch = batch;
              r.kv_heads = kvh;
              r.dtype = dtype;
              r.threads = t;
              r.error = "MultiheadAttention::Create: " + st.ToString();
            } else {
              r = RunDecodeCase(model, context, batch, dtype, t, o, peers.get(), status);
            }
            if (dtype == DType::kF32) {
              f32_peers[t] = r.peers;
            } else {
              r.peers = f32_peers[t];
            }
            r.copy_gbs = copy_gbs[t];
            r.read_gbs = read_gbs[t];
            // A cache larger than the last-level cache is read from memory: its read% divides
            // by the read bandwidth probed again right after the case, two figures taken seconds
            // apart rather than minutes (a shared machine's bandwidth moves by tens of percent).
            const size_t llc = LastLevelCacheBytes();  // 0 if unknown: no second probe
            if (r.error.empty() && llc > 0 && r.cache_bytes > static_cast<double>(llc)) {
              const double gbs = read_probe.Measure(t, 3);
              if (gbs > 0) r.read_gbs = gbs;
            }
            progress.Clear();
            if (!r.error.empty()) {
              failed = true;
              std::printf("%8lld %6lld %4lld %5s %7zu  FAILED\n", static_cast<long long>(context),
                          static_cast<long long>(batch), static_cast<long long>(kvh),
                          DTypeName(dtype), t);
              std::fprintf(stderr, "mha-bench: decode context %lld batch %lld: %s\n",
                           static_cast<long long>(context), static_cast<long long>(batch),
                           r.error.c_str());
            } else {
              std::printf(
                  "%8lld %6lld %4lld %5s %7zu %10.3f %10.3f %10.1f %9.1f %10.2f %13.2f %6.1f "
                  "%9.1f %8.3f %9.2f %6.1f%s\n",
                  static_cast<long long>(context), static_cast<long long>(batch),
                  static_cast<long long>(kvh), DTypeName(dtype), t, r.median_ms, r.p90_ms,
                  r.tokens_per_s, r.cache_bytes / (1024.0 * 1024.0), r.cache_gbs, r.total_gbs,
                  r.read_gbs > 0 ? 100.0 * r.cache_gbs / r.read_gbs : NAN,
                  r.read_gbs > 0 ? 100.0 * r.total_gbs / r.read_gbs : NAN, r.attn_ms, r.attn_gbs,
                  r.read_gbs > 0 ? 100.0 * r.attn_gbs / r.read_gbs : NAN,
                  PeerCells(o.compare, r).c_str());
            }
            std::fflush(stdout);
            results.push_back(std::move(r));
          }
        }
      }
    }
  }
  RunHeader peer_header;  // the peers' versions, once they ran
  if (peers != nullptr) {
    peer_header.compare = o.compare;
    peers->Describe(&peer_header);
    std::string line;
    for (const std::string& p : o.compare) {
      const auto v = peer_header.peer_versions.find(p);
      line += (line.empty() ? "" : ", ") + p + " " +
              (v != peer_header.peer_versions.end() ? v->second : std::string("(not run)"));
    }
    std::printf("peers (%s): %s\n", peer_header.peer_python.c_str(), line.c_str());
  }
  std::vector<PrefillResult> prefill;
  bool prefill_ok = true;
  if (!o.prefill_tokens.empty()) prefill_ok = RunPrefill(o, &progress, &prefill);
  bool inaccurate = false;
  for (const PrefillResult& r : prefill) {
    if (r.error.empty() && !(r.max_abs_diff <= o.tolerance)) {
      inaccurate = true;
      std::fprintf(stderr,
                   "mha-bench: prefill %lld tokens, E %lld, batch %lld, %zu thread(s): the step's "
                   "output differs from the forward's by %.3g, above the tolerance %g\n",
                   static_cast<long long>(r.tokens), static_cast<long long>(r.embed),
                   static_cast<long long>(r.batch), r.threads, r.max_abs_diff, o.tolerance);
    }
  }
  bool io_ok = true;
  auto fields = [](const DecodeResult& r) {
    nlohmann::ordered_json j;
    j["context"] = r.context;
    j["batch"] = r.batch;
    j["embed"] = kDecodeEmbed;
    j["heads"] = kDecodeHeads;
    j["kv_heads"] = r.kv_heads;
    j["cache_dtype"] = DTypeName(r.dtype);
    j["weights_dtype"] = DTypeName(r.weights);
    j["threads"] = r.threads;
    j["error"] = r.error;
    j["runs"] = r.runs;
    j["median_ms"] = r.median_ms;
    j["p10_ms"] = r.p10_ms;
    j["p90_ms"] = r.p90_ms;
    j["tokens_per_s"] = r.tokens_per_s;
    j["cache_bytes"] = r.cache_bytes;
    j["weight_bytes"] = r.weight_bytes;
    j["cache_gbs"] = r.cache_gbs;
    j["total_gbs"] = r.total_gbs;
    j["copy_gbs"] = r.copy_gbs;
    j["copy_ratio"] = r.copy_gbs > 0 ? r.cache_gbs / r.copy_gbs : 0.0;
    j["total_copy_ratio"] = r.copy_gbs > 0 ? r.total_gbs / r.copy_gbs : 0.0;
    j["attn_ms"] = r.attn_ms;
    j["attn_gbs"] = r.attn_gbs;
    j["attn_copy_ratio"] = r.copy_gbs > 0 ? r.attn_gbs / r.copy_gbs : 0.0;
    j["read_gbs"] = r.read_gbs;
    j["read_ratio"] = r.read_gbs > 0 ? r.cache_gbs / r.read_gbs : 0.0;
    j["total_read_ratio"] = r.read_gbs > 0 ? r.total_gbs / r.read_gbs : 0.0;
    j["attn_read_ratio"] = r.read_gbs > 0 ? r.attn_gbs / r.read_gbs : 0.0;
    return j;
  };
  if (!o.json_path.empty()) {
    nlohmann::ordered_json doc;
    doc["header"]["mode"] = "decode";
    doc["header"]["mha_version"] = OrUnknown(Version());
    doc["header"]["simd_target"] = OrUnknown(SimdTarget());
    doc["header"]["cpu"] = CpuModel();
    doc["header"]["seed"] = o.seed;
    for (const auto& [t, g] : copy_gbs) doc["header"]["copy_gbs"][std::to_string(t)] = g;
    for (const auto& [t, g] : read_gbs) doc["header"]["read_gbs"][std::to_string(t)] = g;
    doc["header"]["tolerance"] = o.tolerance;
    AddPeersHeaderJson(peer_header, &doc["header"]);
    doc["results"] = nlohmann::ordered_json::array();
    for (const DecodeResult& r : results) {
      nlohmann::ordered_json j = fields(r);
      if (!o.compare.empty()) j["peers"] = PeerResultsJson(o.compare, r.peers, r.median_ms);
      doc["results"].push_back(std::move(j));
    }
    doc["prefill"] = nlohmann::ordered_json::array();
    for (const PrefillResult& r : prefill) {
      nlohmann::ordered_json j;
      j["tokens"] = r.tokens;
      j["batch"] = r.batch;
      j["embed"] = r.embed;
      j["heads"] = r.heads;
      j["kv_heads"] = r.kv_heads;
      j["threads"] = r.threads;
      j["error"] = r.error;
      j["runs"] = r.runs;
      j["step_ms"] = r.step_ms;
      j["step_p10_ms"] = r.step_p10_ms;
      j["step_p90_ms"] = r.step_p90_ms;
      j["forward_ms"] = r.forward_ms;
      j["forward_p10_ms"] = r.forward_p10_ms;
      j["forward_p90_ms"] = r.forward_p90_ms;
      j["ratio"] = r.forward_ms > 0 ? r.step_ms / r.forward_ms : 0.0;
      j["max_abs_diff"] = r.max_abs_diff;
      doc["prefill"].push_back(std::move(j));
    }
    json_out << doc.dump(2) << "\n";
    io_ok = FinishOutput("--json", o.json_path, &json_out) && io_ok;
  }
  if (!o.csv_path.empty()) {
    bool first = true;
    for (const DecodeResult& r : results) {
      nlohmann::ordered_json j = fields(r);
      // The peers flattened as the forward suite's CSV has them (empty when not timed).
      for (const std::string& p : o.compare) {
        const auto it = r.peers.find(p);
        const bool timed = it != r.peers.end() && it->second.timed;
        j[p + "_ms"] = timed ? nlohmann::ordered_json(it->second.median_ms) : nullptr;
        j[p + "_ratio"] =
            timed ? nlohmann::ordered_json(PeerRatio(r.peers, p, r.median_ms)) : nullptr;
        j[p + "_max_abs_err"] = timed ? nlohmann::ordered_json(it->second.max_abs_err) : nullptr;
      }
      if (first) {
        std::string line;
        for (auto it = j.begin(); it != j.end(); ++it) line += (line.empty() ? "" : ",") + it.key();
        csv_out << line << "\n";
        first = false;
      }
      std::string line;
      for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string v = it->is_string() ? it->get<std::string>()
                              : it->is_null() ? std::string()
                                              : it->dump();
        line += (it == j.begin() ? "" : ",") + v;
      }
      csv_out << line << "\n";
    }
    io_ok = FinishOutput("--csv", o.csv_path, &csv_out) && io_ok;
  }
  if (failed || !prefill_ok || !io_ok) return kExitFailure;
  return inaccurate ? kExitInaccurate : kExitOk;
}

}  // namespace

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
      std::printf("mha-bench (mha %s)\nSIMD target: %s\nBLIS arch: %s\n",
                  OrUnknown(Version()).c_str(), OrUnknown(SimdTarget()).c_str(),
                  OrUnknown(BlasArch()).c_str());
      return kExitOk;
    case ParseAction::kRun:
      break;
  }
  try {
    return options.decode ? RunDecode(options) : Run(options);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mha-bench: out of memory (reduce the shape or the thread count)\n");
    return kExitFailure;
  }
}

}  // namespace bench
}  // namespace mha

int main(int argc, char** argv) { return mha::bench::Main(argc, argv); }
