#include "tools/bench_peers.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/safetensors.h"

#ifndef MHA_SOURCE_DIR
#define MHA_SOURCE_DIR "."
#endif
#ifndef MHA_BUILD_DIR
#define MHA_BUILD_DIR "build"
#endif

namespace mha {
namespace bench {
namespace {

constexpr const char* kSystemPython = "/usr/bin/python3";
constexpr const char* kVenvPython = "/peers-venv/bin/python";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

bool Executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

// $MHA_BENCH_PEER_PYTHON, else the venv of tools/dev peers in this build directory or in the
// source tree's build/, else Debian's python3.
std::string FindPython() {
  const std::string env = Env("MHA_BENCH_PEER_PYTHON");
  if (!env.empty()) return env;
  for (const std::string& dir : {std::string(MHA_BUILD_DIR), std::string(MHA_SOURCE_DIR) + "/build"}) {
    if (Executable(dir + kVenvPython)) return dir + kVenvPython;
  }
  return kSystemPython;
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `cmd` through the shell; its stdout, and false when it could not be started.
bool Capture(const std::string& cmd, std::string* out, int* status) {
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return false;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out->append(buf, n);
  *status = pclose(pipe);
  return true;
}

double JsonDouble(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

std::string JsonString(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

PeerComparison::PeerComparison(const BenchOptions& options)
    : options_(options), python_(FindPython()) {
  script_ = Env("MHA_BENCH_PEER_SCRIPT");
  if (script_.empty()) script_ = std::string(MHA_SOURCE_DIR) + "/tools/peers.py";
  if (!Executable(python_)) {
    Note("--compare: " + python_ + " not found or not executable; continuing without peers");
    usable_ = false;
  } else if (access(script_.c_str(), R_OK) != 0) {
    Note("--compare: script " + script_ +
         " not found (set MHA_BENCH_PEER_SCRIPT); continuing without peers");
    usable_ = false;
  }
  const std::string tmp = Env("TMPDIR").empty() ? "/tmp" : Env("TMPDIR");
  std::vector<char> templ(tmp.begin(), tmp.end());
  const std::string suffix = "/mha-bench-peers-XXXXXX";
  templ.insert(templ.end(), suffix.begin(), suffix.end());
  templ.push_back('\0');
  if (usable_ && mkdtemp(templ.data()) == nullptr) {
    Note("--compare: cannot create a temporary directory in " + tmp + ": " +
         std::strerror(errno) + "; continuing without peers");
    usable_ = false;
  } else if (usable_) {
    dir_ = templ.data();
    data_path_ = dir_ + "/case.safetensors";
  }
}

PeerComparison::~PeerComparison() {
  if (dir_.empty()) return;
  std::remove(data_path_.c_str());
  rmdir(dir_.c_str());
}

void PeerComparison::Note(const std::string& text) {
  if (!notes_.insert(text).second) return;
  std::fprintf(stderr, "mha-bench: note: %s\n", text.c_str());
}

bool PeerComparison::WriteData(const std::vector<Tensor>& tensors) {
  SafeTensorsWriter writer;
  Status st;
  for (const Tensor& t : tensors) {
    if (st.ok()) st = writer.Add(t.name, DType::kF32, t.shape, t.data);
  }
  if (st.ok()) st = writer.WriteFile(data_path_);
  if (!st.ok()) Note("--compare: writing the peers' data file failed: " + st.ToString());
  return st.ok();
}

void PeerComparison::Run(const Workload& w, size_t threads,
                         const std::function<void(const std::string&)>& status,
                         CaseResult* result) {
  const Shape& s = w.shape();
  bool data_ok = usable_;
  if (data_ok) {
    const std::vector<int64_t> e = {s.embed}, ee = {s.embed, s.embed},
                               q = {s.batch, s.seq, s.embed}, kv = {s.batch, s.kv_seq, s.embed};
    const int64_t qkv = s.embed + 2 * s.kv_embed();  // 3E without grouped-query heads
    std::vector<Tensor> tensors = {{"in_proj_weight", {qkv, s.embed}, w.in_proj_weight().data()},
                                   {"in_proj_bias", {qkv}, w.in_proj_bias().data()},
                                   {"out_proj.weight", ee, w.out_proj_weight().data()},
                                   {"out_proj.bias", e, w.out_proj_bias().data()},
                                   {"query", q, w.query().data()},
                                   {"output", q, w.output().data()}};
    if (!s.self_attention()) {
      tensors.push_back({"key", kv, w.key().data()});
      tensors.push_back({"value", kv, w.value().data()});
    }
    if (!w.sinks().empty()) tensors.push_back({"sinks", {s.heads}, w.sinks().data()});
    const int64_t hd = s.embed / s.heads;
    if (!w.q_norm().empty()) {
      tensors.push_back({"q_norm.weight", {hd}, w.q_norm().data()});
      tensors.push_back({"k_norm.weight", {hd}, w.k_norm().data()});
    }
    data_ok = WriteData(tensors);
  }
  std::string args = " --case " + std::to_string(s.batch) + "," + std::to_string(s.seq) + "," +
                     std::to_string(s.kv_seq) + "," + std::to_string(s.embed) + "," +
                     std::to_string(s.heads) + "," + (s.causal ? "1" : "0") + "," +
                     (s.need_weights ? "1" : "0");
  // "kv_heads=8 rope=neox window=1024" as one argument: peers.py runs what it supports.
  if (s.variants.any()) args += " --variants " + ShellQuote(VariantsLabel(s).substr(1));
  RunPeers(data_ok, ShapeLabel(s), args, threads, /*rounds=*/1, status, &result->peers);
}

void PeerComparison::WriteDecode(const DecodePeerCase& c) {
  const int64_t E = c.embed, hd = c.embed / c.heads, kvE = c.kv_heads * hd, past = c.context - 1;
  decode_data_ok_ = usable_;
  if (!decode_data_ok_) return;
  // The cached positions, dense [batch, kv_heads, context - 1, head_dim].
  std::vector<float> k(static_cast<size_t>(c.batch * kvE * past)), v(k.size());
  size_t i = 0;
  for (int64_t n = 0; n < c.batch; ++n) {
    for (int64_t g = 0; g < c.kv_heads; ++g) {
      const int64_t at = n * c.batch_stride + g * c.head_stride;
      const size_t count = static_cast<size_t>(past * hd);
      std::copy(c.keys + at, c.keys + at + count, k.begin() + i);
      std::copy(c.values + at, c.values + at + count, v.begin() + i);
      i += count;
    }
  }
  const std::vector<int64_t> cache = {c.batch, c.kv_heads, past, hd}, token = {c.batch, 1, E};
  decode_data_ok_ = WriteData({{"q_proj_weight", {E, E}, c.q_weight},
                               {"k_proj_weight", {kvE, E}, c.k_weight},
                               {"v_proj_weight", {kvE, E}, c.v_weight},
                               {"in_proj_bias", {E + 2 * kvE}, c.in_bias},
                               {"out_proj.weight", {E, E}, c.out_weight},
                               {"out_proj.bias", {E}, c.out_bias},
                               {"past_key", cache, k.data()},
                               {"past_value", cache, v.data()},
                               {"query", token, c.x},
                               {"output", token, c.output}});
}

void PeerComparison::TimeDecode(const DecodePeerCase& c, size_t threads, int64_t rounds,
                                const std::function<void(const std::string&)>& status,
                                std::map<std::string, PeerResult>* peers) {
  const std::string args = " --decode " + std::to_string(c.batch) + "," +
                           std::to_string(c.context) + "," + std::to_string(c.embed) + "," +
                           std::to_string(c.heads) + "," + std::to_string(c.kv_heads) +
                           (c.quantized.empty() ? "" : " --weights " + c.quantized);
  const std::string label = "decode (context " + std::to_string(c.context) + ", batch " +
                            std::to_string(c.batch) + ", kv heads " + std::to_string(c.kv_heads) +
                            ")";
  RunPeers(decode_data_ok_, label, args, threads, rounds, status, peers);
}

void PeerComparison::RunPeers(bool data_ok, const std::string& label, const std::string& case_args,
                              size_t threads, int64_t rounds,
                              const std::function<void(const std::string&)>& status,
                              std::map<std::string, PeerResult>* peers) {
  // A round's share of --min-time and --min-runs, as mha's rounds take them.
  const RoundShare share = RoundShareOf(options_, rounds);
  char min_time[32];
  std::snprintf(min_time, sizeof(min_time), "%g", share.min_time_s);
  const std::string args = case_args + " --data " + ShellQuote(data_path_) + " --threads " +
                           std::to_string(threads) + " --min-time " + min_time + " --min-runs " +
                           std::to_string(share.min_runs);
  for (const std::string& peer : options_.compare) {
    PeerResult& p = (*peers)[peer];
    if (!data_ok) {
      p.note = "not run (see the note above)";
      continue;
    }
    if (unavailable_.count(peer) != 0) {
      p.note = "unavailable (see the note above)";
      continue;
    }
    status(label + ", " + std::to_string(threads) + " thread(s): timing " + peer + "...");
    std::string out;
    int exit_status = 0;
    const std::string cmd =
        ShellQuote(python_) + " " + ShellQuote(script_) + " --peer " + peer + args;
    const bool started = Capture(cmd, &out, &exit_status);
    status("");
    if (!started) {
      Note("--compare: cannot run " + python_ + ": " + std::strerror(errno));
      usable_ = false;
      p.note = "not run";
      continue;
    }
    // The result is the last line that parses as a JSON object naming this peer.
    nlohmann::json j;
    size_t start = 0;
    while (start < out.size()) {
      size_t end = out.find('\n', start);
      if (end == std::string::npos) end = out.size();
      nlohmann::json line = nlohmann::json::parse(out.substr(start, end - start), nullptr,
                                                  /*allow_exceptions=*/false);
      if (line.is_object() && JsonString(line, "peer") == peer) j = std::move(line);
      start = end + 1;
    }
    if (!j.is_object()) {
      p.note = script_ + " printed no result (exit status " +
               std::to_string(WIFEXITED(exit_status) ? WEXITSTATUS(exit_status) : exit_status) +
               ")";
      Note("--compare " + peer + ", " + label + ": " + p.note);
      continue;
    }
    if (j.contains("skipped")) {
      p.note = JsonString(j, "skipped");
      if (p.note.empty()) p.note = j["skipped"].dump();
      const bool unavailable = j.value("unavailable", false);
      if (unavailable) unavailable_.insert(peer);
      Note("--compare " + peer + (unavailable ? "" : ", " + label) + ": " + p.note);
      continue;
    }
    p.median_ms = JsonDouble(j, "median_ms");
    if (!(p.median_ms > 0)) {
      p.note = "no median_ms in " + j.dump();
      Note("--compare " + peer + ": " + p.note);
      continue;
    }
    p.timed = true;
    p.p10_ms = JsonDouble(j, "p10_ms");
    p.p90_ms = JsonDouble(j, "p90_ms");
    p.runs = j.value("runs", int64_t{0});
    p.max_abs_err = JsonDouble(j, "max_abs_err");
    p.precision = JsonString(j, "precision");
    p.tolerance =
        p.precision == "bf16" || p.precision == "int8" ? kBf16PeerTolerance : options_.tolerance;
    if (!(p.max_abs_err <= p.tolerance)) {
      char text[160];
      std::snprintf(text, sizeof(text),
                    "%s output differs from mha's by %.3g (bound %g); its time is reported, "
                    "marked '!'",
                    peer.c_str(), p.max_abs_err, p.tolerance);
      Note("--compare " + peer + ", " + label + ", " + std::to_string(threads) +
           " thread(s): " + text);
    }
    const std::string version = JsonString(j, "version");
    if (!version.empty()) versions_[peer] = version;
    if (!p.precision.empty()) precisions_[peer] = p.precision;
  }
}

void PeerComparison::Describe(RunHeader* header) const {
  header->peer_python = python_;
  header->peer_versions = versions_;
  header->peer_precisions = precisions_;
}

}  // namespace bench
}  // namespace mha
