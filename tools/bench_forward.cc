// mha-bench's forward suite (tools/bench_forward.h).
#include "tools/bench_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/gemm_route.h"
#include "mha/mha.hpp"
#include "runtime/context_internal.h"
#include "runtime/trace.h"
#include "tools/bench_check.h"
#include "tools/bench_fma_peak.h"
#include "tools/bench_hf.h"
#include "tools/bench_host.h"
#include "tools/bench_output.h"
#include "tools/bench_peers.h"
#include "tools/bench_report.h"
#include "tools/bench_workload.h"
#include "tools/weights_dtype.h"

namespace mha {
namespace bench {

namespace {

struct TraceCapture {
  bool wanted = false;  // record the first measured run of this case
  std::vector<TraceEvent> events;
  int64_t origin_ns = 0;
  int64_t wall_ns = 0;
  bool captured = false;
};

// Measures one case in o.rounds rounds. Each round times the BLIS baseline (o.sgemm_size, with
// the same threads; 0: none, no efficiency), with it the multiply-add peak (the flops no product
// can pass, so mha's and a peer's fractions of it show how much room is left), then mha's
// forward for its share of --min-time and --min-runs, so each round's efficiency divides two
// figures taken within about a second of each other; the case's efficiency is the median over
// rounds. A shared machine's speed moves by tens of percent within seconds, which one baseline
// per case would pass straight into the efficiency.
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
    r.error = "ReserveArena: " + st.ToString();
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
  if (w.has_weights()) {
    const CheckResult check = CheckAccuracy(w, threads);
    r.max_abs_err = check.max_abs_err;
    r.rows_checked = check.rows_checked;
  } else {
    // A checkpoint's layer: no weight arrays here for the double reference to read
    // (tests/hf_fixtures_test checks each family against transformers); a broken run still
    // shows as a NaN or an infinity.
    r.checked = false;
    for (float x : w.output()) {
      if (!std::isfinite(x)) {
        r.error = "Forward: the output holds NaN or infinity";
        return r;
      }
    }
  }

  std::unique_ptr<TraceRecorder> recorder;
  if (record) recorder = std::make_unique<TraceRecorder>(2 * probe.count.load() + 1024);
  double stage_ns[kNumStages] = {};
  uint64_t dropped = 0;

  const double flops = AttentionFlops(r.shape);
  const int64_t rounds = o.rounds;
  // Each round's share of the case's minimum runs and time.
  const RoundShare share = RoundShareOf(o, rounds);
  const int64_t round_min_runs = share.min_runs;
  const int64_t round_min_ns = static_cast<int64_t>(share.min_time_s * 1e9);
  const int64_t round_max_runs = std::max<int64_t>(kMaxRuns / rounds, 1);
  std::vector<double> samples_ms, round_ms;
  samples_ms.reserve(static_cast<size_t>(o.min_runs));
  for (int64_t round = 0; round < rounds; ++round) {
    RoundResult rr;
    if (o.sgemm_size > 0) {
      rr.sgemm_gflops = MeasureBaseline(baseline, static_cast<size_t>(o.sgemm_size), threads);
      rr.fma_peak_gflops = MeasureFmaPeakGflops(threads);
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
    rr.peak_fraction = rr.fma_peak_gflops > 0 ? rr.gflops / rr.fma_peak_gflops : NAN;
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
    std::vector<double> sgemm, eff, peak, frac;
    for (const RoundResult& rr : r.rounds) {
      sgemm.push_back(rr.sgemm_gflops);
      eff.push_back(rr.efficiency);
      peak.push_back(rr.fma_peak_gflops);
      frac.push_back(rr.peak_fraction);
    }
    for (std::vector<double>* v : {&sgemm, &eff, &peak, &frac}) std::sort(v->begin(), v->end());
    r.sgemm_gflops = Percentile(sgemm, 0.5);
    r.efficiency = Percentile(eff, 0.5);
    r.fma_peak_gflops = Percentile(peak, 0.5);
    r.peak_fraction = Percentile(frac, 0.5);
  } else {
    r.efficiency = NAN;
    r.peak_fraction = NAN;
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

}  // namespace

int RunForwardSuite(const BenchOptions& o) {
  std::ofstream json_out, csv_out, trace_out;
  if (!OpenOutput("--json", o.json_path, &json_out) || !OpenOutput("--csv", o.csv_path, &csv_out) ||
      !OpenOutput("--trace", o.trace_path, &trace_out)) {
    return kExitUsage;
  }
  Progress progress;
  PeakRss rss;
  // --hf: one case, the checkpoint's layer, loaded before anything is measured.
  std::unique_ptr<MultiheadAttention> hf_layer;
  HfModel hf_model;
  std::vector<Shape> cases;
  if (!o.hf_dir.empty()) {
    progress.Show("loading " + o.hf_dir + "...");
    const Status st = LoadHfLayer(o, &hf_layer, &hf_model);
    progress.Clear();
    if (!st.ok()) {
      std::fprintf(stderr, "mha-bench: %s\n", OneLine(st.message()).c_str());
      return kExitFailure;
    }
    Shape shape;
    std::string error;
    if (!HfShape(o, *hf_layer, hf_model, &shape, &error)) {
      std::fprintf(stderr, "mha-bench: %s\n", error.c_str());
      return kExitUsage;
    }
    cases.push_back(shape);
  } else {
    cases = CasesToRun(o);
  }

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
  header.f32_prepacking = kernels::WeightsPrepackable(DType::kF32);
  if (hf_layer != nullptr)
    header.weights = WeightsDtypeName(o.decode_weights, o.decode_weight_block);
  header.bf16_compute = o.bf16_compute;
  header.bf16_kernel = OrUnknown(Bf16Kernel());
  header.peak_rss_method = rss.method();
  header.load_average = LoadAverage();
  header.breakdown = o.breakdown;
  header.compare = o.compare;
  if (hf_layer != nullptr) {
    header.model = HfModelLine(hf_model);
    header.model_json = HfModelJson(hf_model);
  }

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
      progress.Show("measuring the multiply-add peak (" + std::to_string(t) + " thread(s))...");
      header.fma_peak_gflops[t] = MeasureFmaPeakGflops(t);
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
    const Status st = hf_layer != nullptr
                          ? Workload::FromLayer(shape, std::move(hf_layer), o.seed, &workload)
                          : Workload::Create(shape, o.seed, &workload);
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
      } else if (r.checked && !(r.max_abs_err <= o.tolerance)) {
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

}  // namespace bench
}  // namespace mha
