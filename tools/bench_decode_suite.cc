// mha-bench --decode (tools/bench_decode.h): the decode rows over cache lengths, batches, key/
// value heads, cache types and thread counts, then the prefill rows.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/gemv_int8.h"
#include "mha/mha.hpp"
#include "tools/bench_bandwidth.h"
#include "tools/bench_decode.h"
#include "tools/bench_hf.h"
#include "tools/bench_host.h"
#include "tools/bench_output.h"
#include "tools/bench_report.h"
#include "tools/weights_dtype.h"

namespace mha {
namespace bench {

namespace {

Compute DecodeCompute(const BenchOptions& o) {
  return o.bf16_compute ? Compute::kBF16 : o.int8_compute ? Compute::kInt8 : Compute::kF32;
}

// The prefill rows of --decode: prints their table, fills *results; false if any failed. With
// `hf` (a checkpoint's layer), its rows at batch 1 instead of kPrefillShapes'.
bool RunPrefill(const BenchOptions& o, const DecodeModel* hf, Progress* progress,
                std::vector<PrefillResult>* results) {
  std::printf(
      "\nprefill: KvCache::Step of `tokens` prompt tokens per entry into an empty f32 cache "
      "against MultiheadAttention::Forward with causal of the same shape (same layer, input and "
      "threads; alternating, medians); step/fwd = step_ms / forward_ms, max_diff = max |step "
      "output - forward output|\n");
  std::printf("%7s %6s %5s %5s %4s %7s %10s %10s %8s %9s\n", "tokens", "batch", "embed", "heads",
              "kvh", "threads", "step_ms", "forward_ms", "step/fwd", "max_diff");
  std::fflush(stdout);
  bool ok = true;
  std::vector<PrefillShape> shapes(std::begin(kPrefillShapes), std::end(kPrefillShapes));
  if (hf != nullptr) {
    shapes = {{hf->embed, hf->heads, hf->kv_heads, 1}};
  } else if (!o.decode_shape.empty()) {
    shapes = {{o.decode_shape[0], o.decode_shape[1], o.decode_shape[2], 1}};
  }
  for (const PrefillShape& shape : shapes) {
    DecodeModel model;
    Status st;
    bool made = hf != nullptr;
    const DecodeModel& layer_model = hf != nullptr ? *hf : model;
    for (int64_t tokens : o.prefill_tokens) {
      if (shape.batch > 1 && tokens > kPrefillBatchedMaxTokens) continue;
      if (!made) {
        progress->Show("preparing the prefill layer (E " + std::to_string(shape.embed) + ", " +
                       std::to_string(shape.heads) + " heads)...");
        st = MakeDecodeModel(shape.embed, shape.heads, shape.kv_heads, 0, 0, o.seed,
                             o.decode_weights, o.decode_weight_block, DecodeCompute(o), &model);
        made = true;
      }
      for (size_t t : o.threads) {
        progress->Show("prefill " + std::to_string(tokens) + " tokens, E " +
                       std::to_string(shape.embed) + ", batch " + std::to_string(shape.batch) +
                       ", " + std::to_string(t) + " thread(s)");
        PrefillResult r;
        if (st.ok()) {
          r = RunPrefillCase(layer_model, tokens, shape.batch, t, o);
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

// The peers' cells of a decode row: <peer>_ms and <peer>/mha ('!' when its output disagreed).
// <peer>/mha of a row: where the peer ran after mha's rounds (the f32 row), the median over
// those rounds of its round median over mha's; elsewhere its median over the row's.
double DecodePeerRatio(const DecodeResult& r, const std::string& peer) {
  std::vector<double> ratios;
  for (const DecodeResult::Round& round : r.rounds) {
    const auto it = round.peer_ms.find(peer);
    if (it != round.peer_ms.end()) ratios.push_back(it->second / round.median_ms);
  }
  if (ratios.empty()) return PeerRatio(r.peers, peer, r.median_ms);
  std::sort(ratios.begin(), ratios.end());
  return Percentile(ratios, 0.5);
}

std::string PeerCells(const std::vector<std::string>& compare, const DecodeResult& r) {
  std::string cells;
  for (const std::string& p : compare) {
    const auto it = r.peers.find(p);
    char buf[64];
    if (it == r.peers.end() || !it->second.timed) {
      std::snprintf(buf, sizeof(buf), " %9s %9s", "-", "-");
    } else {
      std::snprintf(buf, sizeof(buf), " %9.3f %8.2f%s", it->second.median_ms,
                    DecodePeerRatio(r, p),
                    it->second.max_abs_err <= it->second.tolerance ? " " : "!");
    }
    cells += buf;
  }
  return cells;
}

}  // namespace

int RunDecodeSuite(const BenchOptions& o) {
  std::ofstream json_out, csv_out;
  if (!OpenOutput("--json", o.json_path, &json_out) || !OpenOutput("--csv", o.csv_path, &csv_out)) {
    return kExitUsage;
  }
  Progress progress;
  const int64_t max_batch = *std::max_element(o.decode_batches.begin(), o.decode_batches.end());
  const int64_t max_context = *std::max_element(o.decode_contexts.begin(), o.decode_contexts.end());
  // --hf: the checkpoint's layer is the only model, loaded before anything is measured.
  std::unique_ptr<DecodeModel> hf;
  HfModel hf_model;
  if (!o.hf_dir.empty()) {
    progress.Show("loading " + o.hf_dir + "...");
    std::unique_ptr<MultiheadAttention> layer;
    const Status st = LoadHfLayer(o, &layer, &hf_model);
    progress.Clear();
    if (!st.ok()) {
      std::fprintf(stderr, "mha-bench: %s\n", OneLine(st.message()).c_str());
      return kExitFailure;
    }
    std::string error;
    if (!HfCanDecode(hf_model, &error)) {
      std::fprintf(stderr, "mha-bench: %s\n", error.c_str());
      return kExitUsage;
    }
    progress.Show("preparing random keys/values...");
    hf = std::make_unique<DecodeModel>();
    MakeDecodeModelForLayer(std::move(layer), hf_model.hidden, max_batch, max_context, o.seed,
                            hf.get());
    progress.Clear();
  }
  std::printf("mha-bench --decode: mha %s, SIMD target %s, CPU %s, %s\n",
              OrUnknown(Version()).c_str(), OrUnknown(SimdTarget()).c_str(), CpuModel().c_str(),
              IsoDateUtc().c_str());
  // The layers: the suite's (MHA and GQA of E 1024, 16 heads), --decode-shape's one, or the
  // checkpoint's.
  const bool own_shape = !o.decode_shape.empty();
  const int64_t embed = own_shape ? o.decode_shape[0] : kDecodeEmbed;
  const int64_t heads = own_shape ? o.decode_shape[1] : kDecodeHeads;
  if (hf != nullptr) {
    std::printf("model: %s; one new token per batch entry per step\n",
                HfModelLine(hf_model).c_str());
  } else {
    std::printf("model: E %lld, %lld heads of %lld; one new token per batch entry per step\n",
                static_cast<long long>(embed), static_cast<long long>(heads),
                static_cast<long long>(embed / heads));
  }
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
  const std::string compute = o.bf16_compute ? "bf16 (" + OrUnknown(Bf16Kernel()) + ")"
                              : o.int8_compute
                                  ? std::string("int8 activations (") +
                                        kernels::Int8KernelName(kernels::Int8ActiveKernel()) + ")"
                                  : "f32";
  std::printf("weights: %s  |  compute: %s\n",
              WeightsDtypeName(o.decode_weights, o.decode_weight_block).c_str(), compute.c_str());
  std::unique_ptr<PeerComparison> peers;
  if (!o.compare.empty()) {
    peers = std::make_unique<PeerComparison>(o);
    std::printf(
        "peers: <peer>_ms = the peer's f32 decode step on the same layer, cache contents, token "
        "and threads, timed after each of the %lld round(s) of mha's f32 row (the bf16 and i8 "
        "rows repeat it), the median of its rounds; <peer>/mha = on the f32 row the median over "
        "rounds of the peer's round over mha's round just before it, on the others <peer>_ms / "
        "median_ms; above 1: mha is faster; '!': its output differs from mha's f32 step by more "
        "than --tolerance\n",
        static_cast<long long>(o.rounds_given ? o.rounds : 1));
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
  std::vector<DecodeResult> results;
  bool failed = false;
  std::vector<int64_t> kv_heads_list = {kDecodeHeads, 4};
  if (own_shape) kv_heads_list = {o.decode_shape[2]};
  if (hf != nullptr) kv_heads_list = {hf->kv_heads};
  for (int64_t kvh : kv_heads_list) {
    DecodeModel random_model;
    Status st;
    if (hf == nullptr) {
      progress.Show("preparing the " + std::string(kvh == heads ? "MHA" : "GQA") +
                    " layer and random keys/values...");
      st = MakeDecodeModel(embed, heads, kvh, max_batch, max_context, o.seed, o.decode_weights,
                           o.decode_weight_block, DecodeCompute(o), &random_model);
      progress.Clear();
    }
    const DecodeModel& model = hf != nullptr ? *hf : random_model;
    for (int64_t context : o.decode_contexts) {
      for (int64_t batch : o.decode_batches) {
        // The peers' results of the f32 rows, by thread count, for the other cache types' rows.
        std::map<size_t, std::map<std::string, PeerResult>> f32_peers;
        for (const CacheKind& kind : o.decode_caches) {
          const DType dtype = kind.dtype;
          for (size_t t : o.threads) {
            progress.Show("context " + std::to_string(context) + ", batch " +
                          std::to_string(batch) + ", " + CacheKindName(kind) + ", " +
                          std::to_string(t) + " thread(s)");
            DecodeResult r;
            if (!st.ok()) {
              r.context = context;
              r.batch = batch;
              r.kv_heads = kvh;
              r.embed = kDecodeEmbed;
              r.heads = kDecodeHeads;
              r.head_dim = kDecodeEmbed / kDecodeHeads;
              r.dtype = dtype;
              r.int8_attention = kind.int8_attention;
              r.threads = t;
              r.error = "MultiheadAttention::Create: " + st.ToString();
            } else {
              r = RunDecodeCase(model, context, batch, kind, t, o, peers.get(), status);
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
                          CacheKindName(kind), t);
              std::fprintf(stderr, "mha-bench: decode context %lld batch %lld: %s\n",
                           static_cast<long long>(context), static_cast<long long>(batch),
                           r.error.c_str());
            } else {
              std::printf(
                  "%8lld %6lld %4lld %5s %7zu %10.3f %10.3f %10.1f %9.1f %10.2f %13.2f %6.1f "
                  "%9.1f %8.3f %9.2f %6.1f%s\n",
                  static_cast<long long>(context), static_cast<long long>(batch),
                  static_cast<long long>(kvh), CacheKindName(kind), t, r.median_ms, r.p90_ms,
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
  if (!o.prefill_tokens.empty()) prefill_ok = RunPrefill(o, hf.get(), &progress, &prefill);
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
  auto fields = [embed, heads](const DecodeResult& r) {
    nlohmann::ordered_json j;
    j["context"] = r.context;
    j["batch"] = r.batch;
    j["embed"] = r.embed;
    j["heads"] = r.heads;
    j["kv_heads"] = r.kv_heads;
    j["head_dim"] = r.head_dim;
    j["cache_dtype"] = CacheKindName(CacheKind{r.dtype, r.int8_attention});
    j["weights_dtype"] = WeightsDtypeName(r.weights, r.weight_block);
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
    doc["header"]["compute"] = o.bf16_compute ? "bf16" : o.int8_compute ? "int8" : "f32";
    doc["header"]["bf16_kernel"] = OrUnknown(Bf16Kernel());
    doc["header"]["int8_kernel"] = kernels::Int8KernelName(kernels::Int8ActiveKernel());
    if (hf != nullptr) doc["header"]["hf"] = HfModelJson(hf_model);
    AddPeersHeaderJson(peer_header, &doc["header"]);
    doc["results"] = nlohmann::ordered_json::array();
    for (const DecodeResult& r : results) {
      nlohmann::ordered_json j = fields(r);
      j["rounds"] = nlohmann::ordered_json::array();
      for (const DecodeResult::Round& round : r.rounds) {
        nlohmann::ordered_json jr;
        jr["median_ms"] = round.median_ms;
        if (!round.peer_ms.empty()) jr["peers_ms"] = round.peer_ms;
        j["rounds"].push_back(std::move(jr));
      }
      if (!o.compare.empty()) {
        j["peers"] = PeerResultsJson(o.compare, r.peers, r.median_ms);
        for (const std::string& p : o.compare) {
          if (r.peers.count(p) != 0 && r.peers.at(p).timed) {
            j["peers"][p]["ratio"] = std::round(DecodePeerRatio(r, p) * 1e4) / 1e4;  // 4 places
          }
        }
      }
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
            timed ? nlohmann::ordered_json(DecodePeerRatio(r, p)) : nullptr;
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

}  // namespace bench
}  // namespace mha
