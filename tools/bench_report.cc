#include "tools/bench_report.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/bench_fma_peak.h"

namespace mha {
namespace bench {

namespace {

// Ordered: keys keep the order they are written in (the decode report's CSV follows it).
using json = nlohmann::ordered_json;

constexpr double kMiB = 1024.0 * 1024.0;

// Latency with 4 significant digits (0.01234, 1.234, 123.4), whole ms above 1000.
std::string FormatMs(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), ms >= 1000 ? "%.0f" : "%.4g", ms);
  return buf;
}

std::string FormatFixed(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

const char* YesNo(bool b) { return b ? "yes" : "no"; }

std::string StageKey(int s) { return std::string(StageName(static_cast<Stage>(s))) + "_ms"; }

// JSON number, or null for NaN/inf (JSON has no NaN).
json Number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// Rounds to `decimals` decimal places so files show 0.007217, not 0.0072169999999999995 (JSON
// numbers print in their shortest round-trip form, and dividing by an exact power of ten gives
// the double nearest the decimal). All roundings are far below the measurement noise.
json Rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::isfinite(v) ? json(std::round(v * scale) / scale) : json(nullptr);
}
constexpr int kMsDecimals = 6;  // 1 ns, in ms

double PeerRatio(const CaseResult& r, const std::string& peer) {
  return PeerRatio(r.peers, peer, r.median_ms);
}

// A peer's three table columns: <peer>_ms, <peer>/mha, <peer>_err, each at least 8 wide.
int PeerWidth(const std::string& peer) { return std::max(8, static_cast<int>(peer.size()) + 4); }

}  // namespace

double PeerRatio(const std::map<std::string, PeerResult>& peers, const std::string& peer,
                 double mha_median_ms) {
  const auto it = peers.find(peer);
  return it != peers.end() && it->second.timed && mha_median_ms > 0
             ? it->second.median_ms / mha_median_ms
             : NAN;
}

void AddPeersHeaderJson(const RunHeader& h, json* j) {
  if (h.compare.empty()) return;
  (*j)["compare"] = h.compare;
  (*j)["peer_python"] = h.peer_python;
  json peers = json::object();
  for (const std::string& p : h.compare) {
    const auto v = h.peer_versions.find(p);
    const auto prec = h.peer_precisions.find(p);
    peers[p] = {
        {"version", v != h.peer_versions.end() ? json(v->second) : json(nullptr)},
        {"precision", prec != h.peer_precisions.end() ? json(prec->second) : json(nullptr)}};
  }
  (*j)["peers"] = peers;
}

json PeerResultsJson(const std::vector<std::string>& compare,
                     const std::map<std::string, PeerResult>& results, double mha_median_ms,
                     const double* mha_peak_fraction) {
  json peers = json::object();
  for (const std::string& p : compare) {
    const auto it = results.find(p);
    const PeerResult pr = it != results.end() ? it->second : PeerResult{};
    const json none(nullptr);
    peers[p] = {{"median_ms", pr.timed ? Rounded(pr.median_ms, kMsDecimals) : none},
                {"p10_ms", pr.timed ? Rounded(pr.p10_ms, kMsDecimals) : none},
                {"p90_ms", pr.timed ? Rounded(pr.p90_ms, kMsDecimals) : none},
                {"runs", pr.timed ? json(pr.runs) : none},
                {"ratio", Rounded(PeerRatio(results, p, mha_median_ms), 4)},
                {"max_abs_err", pr.timed ? Number(pr.max_abs_err) : none},
                {"agrees", pr.timed ? json(pr.max_abs_err <= pr.tolerance) : none},
                {"precision", pr.timed ? json(pr.precision) : none},
                {"note", pr.note}};
    if (mha_peak_fraction != nullptr) {
      // The same flops in the peer's time: mha's fraction times mha's time over the peer's.
      const double f = *mha_peak_fraction * mha_median_ms / pr.median_ms;
      peers[p]["peak_fraction"] = pr.timed && std::isfinite(f) && f > 0 ? Rounded(f, 5) : none;
    }
  }
  return peers;
}

namespace {

// How the run's layers hold their projection weights, as the configuration resolves it.
std::string WeightsPhrase(const RunHeader& h) {
  if (h.bf16_compute) return "packed as bf16 at creation (--compute bf16)";
  if (h.weights != "f32") return "stored as " + h.weights + " (never prepacked)";
  if (!h.prepack) return "not prepacked (--no-prepack)";
  if (!h.f32_prepacking) return "kept as stored (no f32 prepacking on this build and CPU)";
  return h.strassen ? "prepacked at creation, with Strassen operands (--strassen)"
                    : "prepacked at creation";
}

}  // namespace

void PrintHeader(std::FILE* out, const RunHeader& h) {
  std::fprintf(out, "mha-bench  mha %s  |  CPU: %s  |  SIMD: %s  |  BLIS: %s\n",
               h.mha_version.c_str(), h.cpu.c_str(), h.simd_target.c_str(), h.blas_arch.c_str());
  std::string threads;
  for (size_t t : h.threads) threads += (threads.empty() ? "" : ",") + std::to_string(t);
  std::fprintf(out,
               "threads: %s (hardware: %zu)  |  min-time %g s, min-runs %lld in %lld rounds"
               "  |  seed %llu  |  tolerance %g\n",
               threads.c_str(), h.hardware_threads, h.min_time_s,
               static_cast<long long>(h.min_runs), static_cast<long long>(h.rounds),
               static_cast<unsigned long long>(h.seed), h.tolerance);
  std::fprintf(out, "weights: %s  |  peak RSS: %s", WeightsPhrase(h).c_str(),
               h.peak_rss_method.c_str());
  if (h.bf16_compute) std::fprintf(out, "  |  compute: bf16 (%s)", h.bf16_kernel.c_str());
  if (h.load_average >= 0) {
    std::fprintf(out, "  |  load average %.2f", h.load_average);
    // Other processes competing for the cores make every figure, the baseline included, noisy.
    if (h.load_average > 0.5 * static_cast<double>(h.hardware_threads)) {
      std::fprintf(out, " (busy machine: timings are noisy)");
    }
  }
  std::fprintf(out, "\n");
  if (!h.model.empty()) std::fprintf(out, "%s\n", h.model.c_str());
}

// "  1 thread X GFLOP/s  2 threads Y GFLOP/s" and the line's end.
static void PrintPerThread(std::FILE* out, const std::map<size_t, double>& gflops) {
  for (const auto& [t, g] : gflops) {
    std::fprintf(out, "  %zu thread%s %.1f GFLOP/s", t, t == 1 ? "" : "s", g);
  }
  std::fprintf(out, "\n");
}

void PrintColumnTitles(std::FILE* out, const RunHeader& h) {
  if (h.sgemm_size > 0) {
    std::fprintf(out, "BLIS sgemm %lld^3 (%s kernels, best of 3) at the start:",
                 static_cast<long long>(h.sgemm_size), h.sgemm_arch.c_str());
    PrintPerThread(out, h.sgemm_gflops);
    std::fprintf(out,
                 "(eff%% = median over each case's rounds of mha GFLOP/s / the sgemm measured "
                 "right before it in the same round; sgemm = the rounds' median)\n");
    std::fprintf(out, "multiply-add peak (%s, %zu chains in registers, best of 5) at the start:",
                 h.simd_target.c_str(), kFmaChains);
    PrintPerThread(out, h.fma_peak_gflops);
    std::fprintf(out,
                 "(peak%% = median over the rounds of mha GFLOP/s / the peak measured after the "
                 "round's sgemm: no f32 product passes 100)\n");
  } else {
    std::fprintf(out,
                 "BLIS sgemm baseline: skipped (--sgemm-size 0), no efficiency or peak column\n");
  }
  if (!h.compare.empty()) {
    std::string peers;
    for (const std::string& p : h.compare) {
      const auto v = h.peer_versions.find(p);
      const auto prec = h.peer_precisions.find(p);
      peers += (peers.empty() ? "" : ", ") + p + " " +
               (v != h.peer_versions.end() ? v->second : std::string("(not run)"));
      if (prec != h.peer_precisions.end() && prec->second != "f32") {
        peers += " [" + prec->second + "]";
      }
    }
    std::fprintf(out, "peers (%s): %s\n", h.peer_python.c_str(), peers.c_str());
    std::fprintf(out,
                 "(<peer>/mha = <peer>_ms / median_ms, above 1: mha is faster; <peer>_err = max "
                 "|peer - mha| of its first output, '!' above its bound)\n");
  }
  std::fprintf(out, "\n");
  std::fprintf(out, "%5s %6s %6s %5s %5s %6s %7s %4s %9s %9s %9s %8s %6s %6s %6s %8s %9s %8s %8s",
               "batch", "seq", "kv_seq", "embed", "heads", "causal", "weights", "thr", "median_ms",
               "p10_ms", "p90_ms", "GFLOP/s", "eff%", "sgemm", "peak%", "wksp_MiB", "arena_MiB",
               "rss_MiB", "max_err");
  for (const std::string& p : h.compare) {
    const int w = PeerWidth(p);
    std::fprintf(out, " %*s %*s %*s", w, (p + "_ms").c_str(), w, (p + "/mha").c_str(), w,
                 (p + "_err").c_str());
  }
  std::fprintf(out, "\n");
}

void PrintRow(std::FILE* out, const RunHeader& h, const CaseResult& r) {
  const Shape& s = r.shape;
  std::fprintf(out, "%5lld %6lld %6lld %5lld %5lld %6s %7s %4zu ", static_cast<long long>(s.batch),
               static_cast<long long>(s.seq), static_cast<long long>(s.kv_seq),
               static_cast<long long>(s.embed), static_cast<long long>(s.heads), YesNo(s.causal),
               YesNo(s.need_weights), r.threads);
  if (!r.error.empty()) {
    std::fprintf(out, "error: %s\n", r.error.c_str());
    return;
  }
  const std::string eff =
      std::isfinite(r.efficiency) ? FormatFixed(100.0 * r.efficiency, 1) : std::string("-");
  char err[32];
  std::snprintf(err, sizeof(err), "%.1e", r.max_abs_err);
  if (!r.checked) std::snprintf(err, sizeof(err), "-");
  const std::string sgemm =
      r.sgemm_gflops > 0 ? FormatFixed(r.sgemm_gflops, 1) : std::string("-");
  const std::string peak =
      std::isfinite(r.peak_fraction) ? FormatFixed(100.0 * r.peak_fraction, 1) : std::string("-");
  std::fprintf(out, "%9s %9s %9s %8.1f %6s %6s %6s %8.2f %9.2f %8.1f %8s",
               FormatMs(r.median_ms).c_str(), FormatMs(r.p10_ms).c_str(),
               FormatMs(r.p90_ms).c_str(), r.gflops, eff.c_str(), sgemm.c_str(), peak.c_str(),
               static_cast<double>(r.workspace_bytes) / kMiB,
               static_cast<double>(r.arena_high_water) / kMiB, r.peak_rss_mib, err);
  for (const std::string& p : h.compare) {
    const int w = PeerWidth(p);
    const auto it = r.peers.find(p);
    if (it == r.peers.end() || !it->second.timed) {
      std::fprintf(out, " %*s %*s %*s", w, "-", w, "-", w, "-");
      continue;
    }
    const PeerResult& pr = it->second;
    char e[32];
    std::snprintf(e, sizeof(e), "%.1e%s", pr.max_abs_err,
                  pr.max_abs_err <= pr.tolerance ? "" : "!");
    std::fprintf(out, " %*s %*s %*s", w, FormatMs(pr.median_ms).c_str(), w,
                 FormatFixed(PeerRatio(r, p), 2).c_str(), w, e);
  }
  std::fprintf(out, "%s\n", VariantsLabel(s).c_str());
}

void PrintBreakdownTable(std::FILE* out, const std::vector<CaseResult>& results) {
  std::fprintf(out,
               "\nBreakdown, ms per forward (task time per stage / threads; overhead = wall - "
               "stages):\n");
  // One column per Stage, in its order (the attention stages scores, softmax and pv apart from
  // the projections), then overhead and wall.
  static const char* const kStageColumns[] = {"qkv_proj", "scores",  "softmax",  "pv",
                                              "out_proj", "avg_wts", "cache_att"};
  static_assert(sizeof(kStageColumns) / sizeof(kStageColumns[0]) == kNumStages,
                "one breakdown column label per Stage");
  std::fprintf(out, "%5s %6s %6s %5s %5s %6s %4s", "batch", "seq", "kv_seq", "embed", "heads",
               "causal", "thr");
  for (const char* name : kStageColumns) std::fprintf(out, " %9s", name);
  std::fprintf(out, " %9s %9s\n", "overhead", "wall");
  for (const CaseResult& r : results) {
    if (!r.has_breakdown) continue;
    const Shape& s = r.shape;
    std::fprintf(out, "%5lld %6lld %6lld %5lld %5lld %6s %4zu", static_cast<long long>(s.batch),
                 static_cast<long long>(s.seq), static_cast<long long>(s.kv_seq),
                 static_cast<long long>(s.embed), static_cast<long long>(s.heads), YesNo(s.causal),
                 r.threads);
    for (int st = 0; st < kNumStages; ++st) {
      std::fprintf(out, " %9s", FormatMs(r.breakdown.stage_ms[st]).c_str());
    }
    std::fprintf(out, " %9s %9s", FormatMs(r.breakdown.overhead_ms).c_str(),
                 FormatMs(r.breakdown.wall_ms).c_str());
    if (r.breakdown.dropped_events > 0) {
      std::fprintf(out, "  (%llu events dropped: incomplete)",
                   static_cast<unsigned long long>(r.breakdown.dropped_events));
    }
    std::fprintf(out, "%s\n", VariantsLabel(s).c_str());
  }
}

namespace {

json HeaderJson(const RunHeader& h) {
  json sgemm = json::object(), fma_peak = json::object();
  for (const auto& [t, g] : h.sgemm_gflops) sgemm[std::to_string(t)] = Rounded(g, 3);
  for (const auto& [t, g] : h.fma_peak_gflops) fma_peak[std::to_string(t)] = Rounded(g, 3);
  json j = {{"cpu", h.cpu},
            {"simd_target", h.simd_target},
            {"blas_arch", h.blas_arch},
            {"threads", h.threads},
            {"hardware_threads", h.hardware_threads},
            {"mha_version", h.mha_version},
            {"sgemm_size", h.sgemm_size},
            {"sgemm_gflops", sgemm},
            {"sgemm_arch", h.sgemm_arch},
            {"fma_peak_gflops", fma_peak},
            {"date", h.date},
            {"min_time_s", h.min_time_s},
            {"min_runs", h.min_runs},
            {"rounds", h.rounds},
            {"tolerance", h.tolerance},
            {"seed", h.seed},
            {"prepack", h.prepack},
            {"strassen", h.prepack && h.strassen},
            {"f32_prepacking", h.f32_prepacking},
            {"weights_dtype", h.weights},
            {"compute", h.bf16_compute ? "bf16" : "f32"},
            {"bf16_kernel", h.bf16_kernel},
            {"peak_rss_method", h.peak_rss_method},
            {"load_average", Number(h.load_average)}};
  if (!h.model_json.is_null()) j["hf"] = h.model_json;
  AddPeersHeaderJson(h, &j);
  return j;
}

json BreakdownJson(const Breakdown& b) {
  json j = json::object();
  for (int st = 0; st < kNumStages; ++st) j[StageKey(st)] = Rounded(b.stage_ms[st], kMsDecimals);
  j["scheduling_overhead_ms"] = Rounded(b.overhead_ms, kMsDecimals);
  j["wall_ms"] = Rounded(b.wall_ms, kMsDecimals);
  j["dropped_events"] = b.dropped_events;
  return j;
}

json ResultJson(const RunHeader& h, const CaseResult& r) {
  const Shape& s = r.shape;
  json j = {{"batch", s.batch},
            {"seq", s.seq},
            {"kv_seq", s.kv_seq},
            {"embed", s.embed},
            {"heads", s.heads},
            {"causal", s.causal},
            {"need_weights", s.need_weights},
            {"kv_heads", s.kv_heads()},
            {"head_dim", s.hd()},
            {"variants", VariantsLabel(s).empty() ? "" : VariantsLabel(s).substr(1)},
            {"threads", r.threads}};
  if (!r.error.empty()) {
    j["error"] = r.error;
    return j;
  }
  j["median_ms"] = Rounded(r.median_ms, kMsDecimals);
  j["p10_ms"] = Rounded(r.p10_ms, kMsDecimals);
  j["p90_ms"] = Rounded(r.p90_ms, kMsDecimals);
  j["runs"] = r.runs;
  j["gflops"] = Rounded(r.gflops, 3);
  j["efficiency"] = Rounded(r.efficiency, 5);
  j["sgemm_gflops"] = r.sgemm_gflops > 0 ? Rounded(r.sgemm_gflops, 3) : json(nullptr);
  j["fma_peak_gflops"] = r.fma_peak_gflops > 0 ? Rounded(r.fma_peak_gflops, 3) : json(nullptr);
  j["peak_fraction"] = Rounded(r.peak_fraction, 5);
  j["rounds"] = json::array();
  for (const RoundResult& rr : r.rounds) {
    j["rounds"].push_back(
        {{"sgemm_gflops", rr.sgemm_gflops > 0 ? Rounded(rr.sgemm_gflops, 3) : json(nullptr)},
         {"runs", rr.runs},
         {"median_ms", Rounded(rr.median_ms, kMsDecimals)},
         {"gflops", Rounded(rr.gflops, 3)},
         {"efficiency", Rounded(rr.efficiency, 5)},
         {"fma_peak_gflops",
          rr.fma_peak_gflops > 0 ? Rounded(rr.fma_peak_gflops, 3) : json(nullptr)},
         {"peak_fraction", Rounded(rr.peak_fraction, 5)}});
  }
  j["workspace_bytes"] = r.workspace_bytes;
  j["arena_high_water"] = r.arena_high_water;
  j["peak_rss_mib"] = Rounded(r.peak_rss_mib, 3);
  j["max_abs_err"] = r.checked ? Number(r.max_abs_err) : json(nullptr);
  j["rows_checked"] = r.rows_checked;
  if (r.has_breakdown) j["breakdown"] = BreakdownJson(r.breakdown);
  if (!h.compare.empty()) {
    j["peers"] = PeerResultsJson(h.compare, r.peers, r.median_ms, &r.peak_fraction);
  }
  return j;
}

// A CSV field: numbers as JSON prints them, NaN as empty, text quoted when needed.
std::string CsvField(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  return v.dump();
}

}  // namespace

void WriteJson(std::ostream& out, const RunHeader& header, const std::vector<CaseResult>& results) {
  json doc = {{"header", HeaderJson(header)}, {"results", json::array()}};
  for (const CaseResult& r : results) doc["results"].push_back(ResultJson(header, r));
  out << doc.dump(2) << "\n";
}

void WriteCsv(std::ostream& out, const RunHeader& header, const std::vector<CaseResult>& results) {
  // Each column and where its value sits in ResultJson: a top-level field, or a field of an
  // object in it (breakdown, peers/<peer>).
  struct Column {
    std::string name;
    std::vector<std::string> path;
  };
  std::vector<Column> columns;
  static const char* const kFields[] = {"batch",
                                        "seq",
                                        "kv_seq",
                                        "embed",
                                        "heads",
                                        "causal",
                                        "need_weights",
                                        "kv_heads",
                                        "head_dim",
                                        "variants",
                                        "threads",
                                        "median_ms",
                                        "p10_ms",
                                        "p90_ms",
                                        "runs",
                                        "gflops",
                                        "efficiency",
                                        "sgemm_gflops",
                                        "fma_peak_gflops",
                                        "peak_fraction",
                                        "workspace_bytes",
                                        "arena_high_water",
                                        "peak_rss_mib",
                                        "max_abs_err",
                                        "rows_checked"};
  for (const char* name : kFields) columns.push_back({name, {name}});
  if (header.breakdown) {
    std::vector<std::string> keys;
    for (int st = 0; st < kNumStages; ++st) keys.push_back(StageKey(st));
    keys.push_back("scheduling_overhead_ms");
    keys.push_back("wall_ms");
    for (const std::string& k : keys) columns.push_back({"breakdown_" + k, {"breakdown", k}});
  }
  for (const std::string& p : header.compare) {
    columns.push_back({p + "_ms", {"peers", p, "median_ms"}});
    columns.push_back({p + "_ratio", {"peers", p, "ratio"}});
    columns.push_back({p + "_max_abs_err", {"peers", p, "max_abs_err"}});
    columns.push_back({p + "_peak_fraction", {"peers", p, "peak_fraction"}});
  }
  columns.push_back({"error", {"error"}});
  for (size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << columns[c].name;
  out << "\n";
  for (const CaseResult& r : results) {
    const json j = ResultJson(header, r);
    for (size_t c = 0; c < columns.size(); ++c) {
      const json* v = &j;
      for (const std::string& key : columns[c].path) {
        const auto it = v->is_object() ? v->find(key) : v->end();
        v = it != v->end() ? &*it : nullptr;
        if (v == nullptr) break;
      }
      out << (c ? "," : "") << CsvField(v != nullptr ? *v : json(nullptr));
    }
    out << "\n";
  }
}

void WriteChromeTrace(std::ostream& out, const Shape& shape, size_t threads,
                      const std::vector<TraceEvent>& events, int64_t origin_ns, int64_t wall_ns) {
  json trace_events = json::array();
  trace_events.push_back({{"ph", "M"},
                          {"name", "process_name"},
                          {"pid", 1},
                          {"args", {{"name", "mha-bench " + ShapeLabel(shape)}}}});
  // One named lane per worker, including workers that ran no task.
  for (size_t w = 0; w < threads; ++w) {
    trace_events.push_back({{"ph", "M"},
                            {"name", "thread_name"},
                            {"pid", 1},
                            {"tid", w},
                            {"args", {{"name", "worker " + std::to_string(w)}}}});
    trace_events.push_back({{"ph", "M"},
                            {"name", "thread_sort_index"},
                            {"pid", 1},
                            {"tid", w},
                            {"args", {{"sort_index", w}}}});
  }
  for (const TraceEvent& e : events) {
    trace_events.push_back(
        {{"ph", "X"},
         {"name", StageName(e.stage)},
         {"cat", "mha"},
         {"pid", 1},
         {"tid", e.worker},
         {"ts", static_cast<double>(e.begin_ns - origin_ns) / 1e3},  // microseconds
         {"dur", static_cast<double>(e.end_ns - e.begin_ns) / 1e3},
         {"args", {{"batch", e.batch}, {"head", e.head}, {"block", e.block}}}});
  }
  const json doc = {{"traceEvents", trace_events},
                    {"displayTimeUnit", "ms"},
                    {"otherData",
                     {{"shape", ShapeLabel(shape)},
                      {"threads", threads},
                      {"wall_us", static_cast<double>(wall_ns) / 1e3}}}};
  out << doc.dump() << "\n";
}

}  // namespace bench
}  // namespace mha
