// mha-bench's results and their renderings: the aligned table, JSON, CSV and the Chrome trace.
#ifndef MHA_TOOLS_BENCH_REPORT_H_
#define MHA_TOOLS_BENCH_REPORT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/trace.h"
#include "tools/bench_workload.h"

namespace mha {
namespace bench {

inline constexpr int kNumStages = static_cast<int>(Stage::kNumStages);

// What the header shows: the machine, the library, and the BLIS baseline.
struct RunHeader {
  std::string cpu;          // /proc/cpuinfo "model name", or "unknown"
  std::string simd_target;  // mha::SimdTarget()
  std::string blas_arch;    // mha::BlasArch()
  std::string mha_version;  // mha::Version()
  std::string date;         // ISO 8601, UTC
  size_t hardware_threads = 1;
  double load_average = -1;  // 1-minute load average at start (/proc/loadavg); < 0 unknown
  std::vector<size_t> threads;
  int64_t sgemm_size = 0;                 // 0: no baseline measured
  std::string sgemm_arch;                 // BLIS configuration of the baseline (e.g. "skx")
  std::map<size_t, double> sgemm_gflops;  // by thread count
  // The multiply-add peak of the dispatched target (MeasureFmaPeakGflops), by thread count;
  // measured with the sgemm baseline, empty without one.
  std::map<size_t, double> fma_peak_gflops;
  double min_time_s = 0;
  int64_t min_runs = 0;
  int64_t rounds = 0;  // measurement rounds per case (each: baseline, then mha runs)
  double tolerance = 0;
  uint64_t seed = 0;
  bool prepack = true;   // layers created with AttentionConfig::prepack kOn (--no-prepack: off)
  bool strassen = false;  // with prepack: kStrassen (--strassen) or kOn
  // Whether kOn has effect on this build and CPU (kernels::WeightsPrepackable(kF32), the
  // "f32 prepacking" of --version): where not, f32 layers keep their weights as stored.
  bool f32_prepacking = true;
  std::string weights = "f32";  // the layers' weight storage (--hf --weights-dtype; else f32)
  bool bf16_compute = false;    // --compute bf16
  std::string bf16_kernel;      // the kernel bf16 products run on (mha::Bf16Kernel())
  std::string peak_rss_method;  // "VmHWM, reset per case" or "ru_maxrss, process lifetime"
  bool breakdown = false;
  // --hf: the checkpoint's layer, one line for the table (HfModelLine) and the JSON header's
  // "hf" object (null without --hf).
  std::string model;
  nlohmann::ordered_json model_json;
  std::vector<std::string> compare;  // --compare: the peers, in column order
  std::string peer_python;           // the interpreter that ran them
  // By peer name, as the peers reported them (a peer that never ran has no entry).
  std::map<std::string, std::string> peer_versions, peer_precisions;
};

// Per-stage time of one forward, ms: sum of task durations of the stage / threads, averaged
// over the measured runs; overhead = wall - sum of the stages.
struct Breakdown {
  double stage_ms[kNumStages] = {};
  double overhead_ms = 0;
  double wall_ms = 0;  // mean wall time of the traced runs
  uint64_t dropped_events = 0;
};

// One round of a case's measurement (mha-bench --rounds): the BLIS baseline, then mha's runs.
struct RoundResult {
  double sgemm_gflops = 0;  // best of 3 products at the round's start; 0 without a baseline
  int64_t runs = 0;
  double median_ms = 0;   // of this round's runs
  double gflops = 0;      // flops / median_ms
  double efficiency = 0;  // gflops / sgemm_gflops; NaN without a baseline
  double fma_peak_gflops = 0;  // right after the sgemm; 0 without a baseline
  double peak_fraction = 0;    // gflops / fma_peak_gflops; NaN without a baseline
};

// One peer's figures for one case (--compare). Not timed: `note` says why, the cells stay
// empty.
struct PeerResult {
  bool timed = false;
  std::string note;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  int64_t runs = 0;
  double max_abs_err = 0;  // of its first output against mha's
  double tolerance = 0;    // max_abs_err above it: the peer disagrees with mha
  std::string precision;   // "f32", "bf16": what the peer ran
};

struct CaseResult {
  Shape shape;
  size_t threads = 1;
  std::string error;  // non-empty: the case failed; only shape and threads are meaningful
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  int64_t runs = 0;
  double gflops = 0;
  // The median over rounds of the BLIS sgemm baseline (GFLOP/s with the same threads; 0 without
  // one) and of the rounds' efficiencies (NaN without a baseline). Each round pairs a baseline
  // with the mha runs right after it: on a shared machine the speed drifts by tens of percent
  // within seconds, so only figures taken close together make a meaningful ratio.
  double sgemm_gflops = 0;
  double efficiency = 0;
  // Likewise the medians of the rounds' multiply-add peaks and of mha's fractions of them.
  double fma_peak_gflops = 0;
  double peak_fraction = 0;
  std::vector<RoundResult> rounds;
  uint64_t workspace_bytes = 0;
  uint64_t arena_high_water = 0;
  double peak_rss_mib = 0;
  double max_abs_err = 0;
  int64_t rows_checked = 0;
  // Whether max_abs_err was measured: a checkpoint's layer (--hf) has no double reference here
  // (max_err shows "-", JSON null).
  bool checked = true;
  bool has_breakdown = false;
  Breakdown breakdown;
  std::map<std::string, PeerResult> peers;  // by peer name, for every --compare peer
};

// A peer's time over mha's median (above 1: mha is faster); NaN when the peer did not run.
double PeerRatio(const std::map<std::string, PeerResult>& peers, const std::string& peer,
                 double mha_median_ms);
// --compare in a JSON header: "compare", "peer_python" and "peers" (each peer's version and
// precision) added to *j; nothing without --compare.
void AddPeersHeaderJson(const RunHeader& header, nlohmann::ordered_json* j);
// One result's "peers" object: for each peer of `compare` its times, runs, ratio (its median
// over mha_median_ms), max_abs_err, agrees, precision and note (null figures when not run);
// given mha's fraction of the multiply-add peak (the forward's cases), also the peer's
// "peak_fraction" at its median time (null when either is unknown).
nlohmann::ordered_json PeerResultsJson(const std::vector<std::string>& compare,
                                       const std::map<std::string, PeerResult>& results,
                                       double mha_median_ms,
                                       const double* mha_peak_fraction = nullptr);

// The aligned table on stdout, printed as the run goes: PrintHeader (machine, library, options)
// first; PrintColumnTitles (the sgemm baseline and peer lines, then the titles) once those are
// measured; then one row per case as it completes.
void PrintHeader(std::FILE* out, const RunHeader& header);
void PrintColumnTitles(std::FILE* out, const RunHeader& header);
void PrintRow(std::FILE* out, const RunHeader& header, const CaseResult& result);
void PrintBreakdownTable(std::FILE* out, const std::vector<CaseResult>& results);

void WriteJson(std::ostream& out, const RunHeader& header, const std::vector<CaseResult>& results);
void WriteCsv(std::ostream& out, const RunHeader& header, const std::vector<CaseResult>& results);

// Chrome trace-event JSON of one traced forward: "X" events (ts/dur in microseconds from
// `origin_ns`), one "thread_name" metadata lane per worker 0..threads-1.
void WriteChromeTrace(std::ostream& out, const Shape& shape, size_t threads,
                      const std::vector<TraceEvent>& events, int64_t origin_ns, int64_t wall_ns);

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_REPORT_H_
