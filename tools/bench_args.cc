#include "tools/bench_args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "runtime/layer_weights.h"
#include "tools/bench_peers.h"
#include "tools/weights_dtype.h"

namespace mha {
namespace bench {

namespace {

// Bounds that keep every buffer size and index within int64/size_t arithmetic and each tensor
// below 2^31 elements (8 GiB of f32): larger cases are not what a profiler run is for.
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxThreads = 1024;
constexpr double kMaxTensorElements = 2147483648.0;  // 2^31
constexpr double kMaxMinTime = 3600.0;               // seconds
constexpr int64_t kMaxMinRuns = 1000000;
constexpr int64_t kMaxRounds = 100;
constexpr int64_t kMaxSgemmSize = 16384;

// --decode bounds: a cache of 8 entries x 65536 positions x E 1024 in f32 is 4 GiB.
constexpr int64_t kMaxDecodeContext = 65536;
constexpr int64_t kMaxDecodeBatch = 64;

// Defaults of a custom shape for the shape flags not given.
constexpr int64_t kDefaultBatch = 1, kDefaultSeq = 128, kDefaultEmbed = 512, kDefaultHeads = 8;
// --hf: query tokens when --seq is not given (a prompt's length rather than the custom shape's).
constexpr int64_t kHfDefaultSeq = 512;

// Flags that restate what a checkpoint's config.json decides: refused with --hf.
bool IsConfigFlag(const std::string& flag) {
  static const char* const kFlags[] = {
      "--embed",      "--heads",      "--kv-heads",    "--rope",   "--rope-theta",
      "--rotary-dim", "--rope-scale", "--alibi",       "--window", "--softcap",
      "--sinks",      "--qk-norm",    "--qk-norm-eps", "--causal", "--decode-shape"};
  for (const char* f : kFlags) {
    if (flag == f) return true;
  }
  return false;
}

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// Parses a decimal integer in [lo, hi]: digits only, no sign, no spaces, no suffix.
bool ParseInt(const std::string& flag, const std::string& text, int64_t lo, int64_t hi,
              int64_t* out, std::string* error) {
  const std::string expected =
      "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  bool digits = !text.empty();
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  if (!digits) {
    *error = flag + ": " + expected + ", got " + Quoted(text);
    return false;
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || v < lo || v > hi) {
    *error = flag + ": " + expected + ", got " + text;
    return false;
  }
  *out = static_cast<int64_t>(v);
  return true;
}

// Parses a finite decimal number in [lo, hi]; `unit` ("of seconds ") completes the message.
bool ParseDouble(const std::string& flag, const std::string& text, double lo, double hi,
                 const char* unit, double* out, std::string* error) {
  const std::string expected = "expected a number " + std::string(unit) + "in [" +
                               FormatNumber(lo) + ", " + FormatNumber(hi) + "]";
  char* end = nullptr;
  errno = 0;
  const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) {
    *error = flag + ": " + expected + ", got " + Quoted(text);
    return false;
  }
  if (v < lo || v > hi) {
    *error = flag + ": " + expected + ", got " + text;
    return false;
  }
  *out = v;
  return true;
}

// The items of a comma-separated list, empty ones kept ("1,,2" has three) so that the
// parsers below name them in their errors.
std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    items.push_back(
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

// "1,2,4": a comma-separated list of thread counts.
bool ParseThreadList(const std::string& flag, const std::string& text, std::vector<size_t>* out,
                     std::string* error) {
  out->clear();
  for (const std::string& item : SplitCommas(text)) {
    int64_t v = 0;
    if (!ParseInt(flag, item, 1, kMaxThreads, &v, error)) {
      *error = flag + ": expected a comma-separated list of thread counts in [1, " +
               std::to_string(kMaxThreads) + "], got " + Quoted(text);
      return false;
    }
    for (size_t t : *out) {
      if (t == static_cast<size_t>(v)) {
        *error = flag + ": expected distinct thread counts, got " + std::to_string(v) +
                 " twice in " + Quoted(text);
        return false;
      }
    }
    out->push_back(static_cast<size_t>(v));
  }
  return true;
}

// "512,4096": a comma-separated list of distinct integers in [lo, hi] (`what` names them).
bool ParseIntList(const std::string& flag, const std::string& text, int64_t lo, int64_t hi,
                  const char* what, std::vector<int64_t>* out, std::string* error) {
  out->clear();
  for (const std::string& item : SplitCommas(text)) {
    int64_t v = 0;
    if (!ParseInt(flag, item, lo, hi, &v, error)) {
      *error = flag + ": expected a comma-separated list of " + what + " in [" +
               std::to_string(lo) + ", " + std::to_string(hi) + "], got " + Quoted(text);
      return false;
    }
    for (int64_t x : *out) {
      if (x == v) {
        *error = flag + ": expected distinct " + what + ", got " + std::to_string(v) +
                 " twice in " + Quoted(text);
        return false;
      }
    }
    out->push_back(v);
  }
  return true;
}

}  // namespace

const char* CacheKindName(const CacheKind& kind) {
  return kind.int8_attention ? "i8dot" : DTypeName(kind.dtype);
}

namespace {

// "f32,i8": distinct KV-cache kinds, sorted f32 first (the peers are timed with the f32 rows
// and shown on the others).
bool ParseCacheTypes(const std::string& flag, const std::string& text, std::vector<CacheKind>* out,
                     std::string* error) {
  out->clear();
  for (const std::string& item : SplitCommas(text)) {
    CacheKind t;
    if (item == "f32") {
      t.dtype = DType::kF32;
    } else if (item == "bf16") {
      t.dtype = DType::kBF16;
    } else if (item == "f16") {
      t.dtype = DType::kF16;
    } else if (item == "i8" || item == "int8") {
      t.dtype = DType::kI8;
    } else if (item == "i8dot") {
      t.dtype = DType::kI8;
      t.int8_attention = true;
    } else {
      *error = flag + ": expected a comma-separated list of f32, bf16, f16, i8, i8dot, got " +
               Quoted(text);
      return false;
    }
    if (std::find(out->begin(), out->end(), t) != out->end()) {
      *error = flag + ": expected distinct cache types, got " + Quoted(item) + " twice in " +
               Quoted(text);
      return false;
    }
    out->push_back(t);
  }
  std::sort(out->begin(), out->end());
  return true;
}

// "torch,ort" or "all": peer names from PeerNames() and the decode-only ones, added to *out,
// which keeps that order ("all": every PeerNames() peer; with --decode the caller takes every
// decode peer); *all_given is set when "all" is one of them.
bool ParsePeerList(const std::string& flag, const std::string& text, std::vector<std::string>* out,
                   bool* all_given, std::string* error) {
  std::vector<std::string> peers = PeerNames();
  for (const std::string& p : DecodePeerNames()) {
    if (std::find(peers.begin(), peers.end(), p) == peers.end()) peers.push_back(p);
  }
  std::string names;
  for (const std::string& p : peers) names += p + ", ";
  const std::string expected =
      flag + ": expected a comma-separated list of " + names + "or all, got ";
  // Names already chosen (--compare-torch and --compare together) stay chosen.
  std::vector<bool> chosen(peers.size(), false);
  for (size_t i = 0; i < peers.size(); ++i) {
    chosen[i] = std::find(out->begin(), out->end(), peers[i]) != out->end();
  }
  const size_t forward_peers = PeerNames().size();
  for (const std::string& item : SplitCommas(text)) {
    bool known = false;
    if (item == "all") *all_given = true;
    for (size_t i = 0; i < peers.size(); ++i) {
      if ((item == "all" && i < forward_peers) || item == peers[i]) {
        chosen[i] = true;
        known = true;
      }
    }
    if (!known) {
      *error = expected + Quoted(item) + (item == text ? "" : " in " + Quoted(text));
      return false;
    }
  }
  out->clear();
  for (size_t i = 0; i < peers.size(); ++i) {
    if (chosen[i]) out->push_back(peers[i]);
  }
  return true;
}

size_t HardwareThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;  // 0 means "unknown"
}

// Cross-flag checks of a custom shape, after all flags are read.
bool ValidateShape(const Shape& s, std::string* error) {
  if (s.embed % s.heads != 0) {
    *error = "--embed/--heads: expected embed divisible by heads, got embed " +
             std::to_string(s.embed) + " and heads " + std::to_string(s.heads) + " (remainder " +
             std::to_string(s.embed % s.heads) + ")";
    return false;
  }
  const Variants& v = s.variants;
  if (v.kv_heads > 0 && s.heads % v.kv_heads != 0) {
    *error = "--kv-heads: expected a divisor of heads (" + std::to_string(s.heads) + "), got " +
             std::to_string(v.kv_heads);
    return false;
  }
  const int64_t hd = s.embed / s.heads;
  if (v.rotary_dim > 0 && (v.rotary_dim % 2 != 0 || v.rotary_dim > hd)) {
    *error = "--rotary-dim: expected an even number <= head_dim (" + std::to_string(hd) +
             "), got " + std::to_string(v.rotary_dim);
    return false;
  }
  if (!tools::CheckVariantFlags(v, error)) return false;
  if (v.qk_norm_eps > 0 && !v.qk_norm) {
    *error = "--qk-norm-eps: expected --qk-norm as well, got no --qk-norm";
    return false;
  }
  const double n = static_cast<double>(s.batch), l = static_cast<double>(s.seq),
               kv = static_cast<double>(s.kv_seq), e = static_cast<double>(s.embed);
  struct Tensor {
    const char* name;
    double elements;
  };
  const Tensor tensors[] = {{"query [batch, seq, embed]", n * l * e},
                            {"key/value [batch, kv_seq, embed]", n * kv * e},
                            {"in_proj_weight [3*embed, embed]", 3.0 * e * e},
                            {"attn_weights [batch, seq, kv_seq]", s.need_weights ? n * l * kv : 0}};
  for (const Tensor& t : tensors) {
    if (t.elements > kMaxTensorElements) {
      *error = "shape: expected at most 2^31 elements per tensor, got " + FormatNumber(t.elements) +
               " in " + t.name;
      return false;
    }
  }
  return true;
}

// A peer that quantizes the activations to int8: it needs quantized weights ("ort-int8").
bool Int8Peer(const std::string& peer) {
  const std::string suffix = "-int8";
  return peer.size() > suffix.size() &&
         peer.compare(peer.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The first of `peers` that times only a decode step (a decode peer without a forward), or null.
const std::string* DecodeOnlyPeer(const std::vector<std::string>& peers) {
  for (const std::string& p : peers) {
    if (std::find(PeerNames().begin(), PeerNames().end(), p) == PeerNames().end()) return &p;
  }
  return nullptr;
}

}  // namespace

const std::vector<std::string>& PeerNames() {
  static const std::vector<std::string>* const kNames =
      new std::vector<std::string>{"torch", "sdpa", "ort", "openvino", "openvino-bf16"};
  return *kNames;
}

const std::vector<std::string>& DecodePeerNames() {
  static const std::vector<std::string>* const kNames =
      new std::vector<std::string>{"ort", "ort-int8", "sdpa", "openvino", "openvino-int8", "ggml"};
  return *kNames;
}

ParseResult ParseArgs(int argc, const char* const* argv, BenchOptions* o) {
  ParseResult r;
  r.action = ParseAction::kError;
  bool kv_seq_given = false;
  bool compare_all = false;  // "all" in --compare: with --decode, every decode peer
  bool tolerance_given = false;
  bool seq_given = false;
  bool binding_given = false;
  std::string compare_flag;               // --compare or --compare-torch, the first given
  std::vector<std::string> config_flags;  // IsConfigFlag flags, in the order given
  o->shape.batch = kDefaultBatch;
  o->shape.seq = kDefaultSeq;
  o->shape.embed = kDefaultEmbed;
  o->shape.heads = kDefaultHeads;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_inline_value = true;
      }
    }
    if (IsConfigFlag(arg)) config_flags.push_back(arg);
    if ((arg == "--compare" || arg == "--compare-torch") && compare_flag.empty()) {
      compare_flag = arg;
    }
    // Flags without a value.
    if (arg == "--help" || arg == "-h" || arg == "--version" || arg == "--causal" ||
        arg == "--need-weights" || arg == "--breakdown" || arg == "--compare-torch" ||
        arg == "--decode" || arg == "--no-prepack" || arg == "--strassen" || arg == "--sinks" ||
        arg == "--qk-norm" || tools::VariantFlagKindOf(arg) == tools::VariantFlagKind::kSwitch) {
      if (has_inline_value) {
        r.error = arg + ": expected no value, got " + Quoted(value);
        return r;
      }
      if (arg == "--help" || arg == "-h") {
        r.action = ParseAction::kHelp;
        return r;
      }
      if (arg == "--version") {
        r.action = ParseAction::kVersion;
        return r;
      }
      if (arg == "--causal") o->causal = true;
      if (arg == "--need-weights") o->need_weights = true;
      if (arg == "--breakdown") o->breakdown = true;
      if (arg == "--compare-torch") {
        ParsePeerList(arg, "torch", &o->compare, &compare_all, &r.error);
      }
      if (arg == "--decode") o->decode = true;
      if (arg == "--no-prepack") o->no_prepack = true;
      if (arg == "--strassen") o->strassen = true;
      // The variant flags make a custom case, like the shape flags.
      if (tools::VariantFlagKindOf(arg) == tools::VariantFlagKind::kSwitch) {
        tools::ParseVariantFlag(arg, value, &o->shape.variants, &r.error);
        o->custom_shape = true;
      }
      if (arg == "--sinks") o->shape.variants.sinks = o->custom_shape = true;
      if (arg == "--qk-norm") o->shape.variants.qk_norm = o->custom_shape = true;
      continue;
    }
    static const char* const kValueFlags[] = {
        "--batch",      "--seq",           "--kv-seq",      "--embed",
        "--heads",      "--threads",       "--min-time",    "--min-runs",
        "--sgemm-size", "--tolerance",     "--seed",        "--json",
        "--csv",        "--trace",         "--contexts",    "--batches",
        "--kv-dtypes",  "--weights-dtype", "--rounds",      "--compare",
        "--prefill",    "--compute",       "--hf",          "--layer",
        "--prefix",     "--binding",       "--decode-shape"};
    const bool variant = tools::VariantFlagKindOf(arg) == tools::VariantFlagKind::kTakesValue;
    bool known = variant;
    for (const char* f : kValueFlags) known = known || arg == f;
    if (!known) {
      r.error = arg.rfind("-", 0) == 0
                    ? "unknown flag " + Quoted(arg) + " (see --help)"
                    : "unexpected argument " + Quoted(arg) + ": expected a flag (see --help)";
      return r;
    }
    if (!has_inline_value) {
      if (i + 1 >= argc) {
        r.error = arg + ": expected a value, got none";
        return r;
      }
      value = argv[++i];
    }
    std::string& e = r.error;
    int64_t v = 0;
    if (arg == "--batch" || arg == "--seq" || arg == "--kv-seq" || arg == "--embed" ||
        arg == "--heads") {
      if (!ParseInt(arg, value, 1, kMaxDim, &v, &e)) return r;
      o->custom_shape = true;
      if (arg == "--batch") o->shape.batch = v;
      if (arg == "--seq") {
        o->shape.seq = v;
        seq_given = true;
      }
      if (arg == "--kv-seq") {
        o->shape.kv_seq = v;
        kv_seq_given = true;
      }
      if (arg == "--embed") o->shape.embed = v;
      if (arg == "--heads") o->shape.heads = v;
    } else if (variant) {
      if (!tools::ParseVariantFlag(arg, value, &o->shape.variants, &e)) return r;
      o->custom_shape = true;
    } else if (arg == "--contexts") {
      if (!ParseIntList(arg, value, 1, kMaxDecodeContext, "contexts", &o->decode_contexts, &e)) {
        return r;
      }
    } else if (arg == "--batches") {
      if (!ParseIntList(arg, value, 1, kMaxDecodeBatch, "batch sizes", &o->decode_batches, &e)) {
        return r;
      }
    } else if (arg == "--prefill") {
      o->prefill_given = true;
      if (value == "none") {
        o->prefill_tokens.clear();
      } else if (!ParseIntList(arg, value, 1, kMaxDecodeContext, "prompt lengths (or none)",
                               &o->prefill_tokens, &e)) {
        return r;
      }
    } else if (arg == "--kv-dtypes") {
      if (!ParseCacheTypes(arg, value, &o->decode_caches, &e)) return r;
    } else if (arg == "--weights-dtype") {
      if (!ParseWeightsDtype(value, &o->decode_weights, &o->decode_weight_block)) {
        e = std::string("--weights-dtype: expected ") + WeightsDtypeNames() + ", got " +
            Quoted(value);
        return r;
      }
      o->decode_weights_given = true;
    } else if (arg == "--decode-shape") {
      if (!ParseIntList(arg, value, 1, int64_t{1} << 16, "E,H,KVH", &o->decode_shape, &e)) {
        return r;
      }
      const std::vector<int64_t>& d = o->decode_shape;
      if (d.size() != 3 || d[0] % d[1] != 0 || d[1] % d[2] != 0) {
        e = "--decode-shape: expected E,H,KVH with H dividing E and KVH dividing H, got " +
            Quoted(value);
        return r;
      }
    } else if (arg == "--compute") {
      if (value == "f32" || value == "bf16" || value == "int8") {
        o->bf16_compute = value == "bf16";
        o->int8_compute = value == "int8";
      } else {
        e = "--compute: expected f32, bf16 or int8, got " + Quoted(value);
        return r;
      }
    } else if (arg == "--compare") {
      if (!ParsePeerList(arg, value, &o->compare, &compare_all, &e)) return r;
    } else if (arg == "--threads") {
      if (!ParseThreadList(arg, value, &o->threads, &e)) return r;
    } else if (arg == "--min-time") {
      if (!ParseDouble(arg, value, 0.0, kMaxMinTime, "of seconds ", &o->min_time_s, &e)) return r;
    } else if (arg == "--min-runs") {
      if (!ParseInt(arg, value, 1, kMaxMinRuns, &o->min_runs, &e)) return r;
    } else if (arg == "--rounds") {
      if (!ParseInt(arg, value, 1, kMaxRounds, &o->rounds, &e)) return r;
      o->rounds_given = true;
    } else if (arg == "--sgemm-size") {
      if (!ParseInt(arg, value, 0, kMaxSgemmSize, &o->sgemm_size, &e)) return r;
    } else if (arg == "--tolerance") {
      if (!ParseDouble(arg, value, 0.0, 1e6, "", &o->tolerance, &e)) return r;
      tolerance_given = true;
    } else if (arg == "--seed") {
      if (!ParseInt(arg, value, 0, std::numeric_limits<int64_t>::max(), &v, &e)) return r;
      o->seed = static_cast<uint64_t>(v);
    } else if (arg == "--hf") {
      if (value.empty()) {
        e = "--hf: expected a checkpoint folder, got ''";
        return r;
      }
      o->hf_dir = value;
    } else if (arg == "--binding") {
      if (value != "copy" && value != "view") {
        e = "--binding: expected copy or view, got " + Quoted(value);
        return r;
      }
      o->hf_view = value == "view";
      binding_given = true;
    } else if (arg == "--layer") {
      if (!ParseInt(arg, value, 0, kMaxDim, &o->hf_layer, &e)) return r;
    } else if (arg == "--prefix") {
      if (value.empty()) {
        e = "--prefix: expected a state_dict prefix such as 'model.layers.0.self_attn.', got ''";
        return r;
      }
      o->hf_prefix = value;
      o->hf_prefix_given = true;
    } else if (arg == "--json" || arg == "--csv" || arg == "--trace") {
      if (value.empty()) {
        e = arg + ": expected a file name, got ''";
        return r;
      }
      (arg == "--json" ? o->json_path : arg == "--csv" ? o->csv_path : o->trace_path) = value;
    }
  }
  const bool hf = !o->hf_dir.empty();
  if (hf) {
    if (!config_flags.empty()) {
      r.error = config_flags[0] + ": not with --hf (the checkpoint's config.json decides it)";
      return r;
    }
    if (!compare_flag.empty()) {
      r.error = compare_flag +
                ": not with --hf (the peers are given the suite's random-weight layers, not a "
                "checkpoint's; --hf times mha alone)";
      return r;
    }
    if ((o->hf_layer >= 0) == o->hf_prefix_given) {
      r.error = std::string("--layer, --prefix: expected exactly one with --hf, got ") +
                (o->hf_prefix_given ? "both" : "neither");
      return r;
    }
  } else if (o->hf_layer >= 0 || o->hf_prefix_given || binding_given) {
    r.error = std::string(o->hf_layer >= 0     ? "--layer"
                          : o->hf_prefix_given ? "--prefix"
                                               : "--binding") +
              ": needs --hf DIR";
    return r;
  }
  o->kv_seq_given = kv_seq_given;
  if (o->decode) {
    // The decode suite has its own shapes and reports; the forward-pass options do not apply.
    const struct {
      bool given;
      const char* flag;
    } conflicts[] = {{o->custom_shape, "--batch/--seq/--kv-seq/--embed/--heads or a variant flag"},
                     {o->causal, "--causal"},
                     {o->need_weights, "--need-weights"},
                     {o->no_prepack, "--no-prepack"},
                     {o->strassen, "--strassen"},
                     {o->breakdown, "--breakdown"},
                     {!o->trace_path.empty(), "--trace"}};
    for (const auto& c : conflicts) {
      if (c.given) {
        r.error = std::string("--decode: expected no ") + c.flag +
                  " (the decode suite has fixed shapes and its own measurement; see --help), "
                  "got " +
                  c.flag;
        return r;
      }
    }
    // Only the decode peers time a decode step; "all" means all of them.
    // The -int8 peers multiply quantized weights only: "all" takes them with such weights,
    // naming one without them is an error.
    const bool quantized = IsQuantized(o->decode_weights);
    for (const std::string& p : o->compare) {
      if (Int8Peer(p) && !quantized) {
        r.error = "--compare: " + p +
                  " multiplies quantized weights: expected --weights-dtype i8, i4 or i4-128, "
                  "got " +
                  DTypeName(o->decode_weights) + " weights";
        return r;
      }
    }
    std::string decode_names;
    std::vector<std::string> decode_peers;
    for (const std::string& p : DecodePeerNames()) {
      decode_names += p + ", ";
      if (Int8Peer(p) && !quantized) continue;
      if (compare_all || std::find(o->compare.begin(), o->compare.end(), p) != o->compare.end()) {
        decode_peers.push_back(p);
      }
    }
    for (const std::string& p : o->compare) {
      if (!compare_all &&
          std::find(decode_peers.begin(), decode_peers.end(), p) == decode_peers.end()) {
        r.error = "--decode: expected --compare peers among " + decode_names +
                  "or all (the peers that time a decode step), got " + Quoted(p);
        return r;
      }
    }
    o->compare = decode_peers;
    if (o->decode_contexts.empty()) o->decode_contexts = {512, 1024, 2048, 4096, 8192};
    if (o->decode_batches.empty()) o->decode_batches = {1, 4, 8};
    if (o->decode_caches.empty()) {
      o->decode_caches = {CacheKind{DType::kF32}, CacheKind{DType::kBF16}, CacheKind{DType::kI8}};
    }
    if (!o->prefill_given) o->prefill_tokens = {512, 2048};
  } else if (const std::string* only = DecodeOnlyPeer(o->compare)) {
    r.error = "--compare: " + *only + " times only a decode step: expected --decode as well, got " +
              *only + " without --decode";
    return r;
  } else if (o->decode_weights_given && !hf) {
    r.error =
        "--weights-dtype: expected --decode or --hf as well, got --weights-dtype without either";
    return r;
  } else if (!o->decode_shape.empty()) {
    r.error = "--decode-shape: expected --decode as well, got --decode-shape without --decode";
    return r;
  } else if (o->prefill_given) {
    r.error = "--prefill: expected --decode as well, got --prefill without --decode";
    return r;
  } else if (!o->decode_caches.empty()) {
    r.error = "--kv-dtypes: expected --decode as well, got --kv-dtypes without --decode";
    return r;
  } else if (!o->decode_contexts.empty() || !o->decode_batches.empty()) {
    r.error = std::string("--contexts/--batches: expected --decode as well, got ") +
              (o->decode_contexts.empty() ? "--batches" : "--contexts") + " without --decode";
    return r;
  }
  if (hf && !o->decode) {
    // One case: N and L from the shape flags, everything else from the checkpoint once loaded.
    o->custom_shape = true;
    if (!seq_given) o->shape.seq = kHfDefaultSeq;
  }
  if (!kv_seq_given) o->shape.kv_seq = o->shape.seq;
  o->shape.causal = o->causal;
  o->shape.need_weights = o->need_weights;
  if (o->no_prepack && o->strassen) {
    r.error =
        "--strassen: expected prepacked weights, got --no-prepack as well (the "
        "Strassen operands are part of the prepacking)";
    return r;
  }
  if (o->int8_compute && !IsQuantized(o->decode_weights)) {
    r.error = std::string(
                  "--compute: int8 multiplies quantized weights: expected --weights-dtype "
                  "i8, i4 or i4-128 (with --decode or --hf), got ") +
              DTypeName(o->decode_weights) + " weights";
    return r;
  }
  o->shape.prepack = !o->no_prepack;
  o->shape.strassen = o->strassen;
  o->shape.bf16 = o->bf16_compute;
  // bf16 products round every operand to 8 significant bits: the default tolerance becomes the
  // one the bf16 peers are held to.
  if (o->bf16_compute && !tolerance_given) o->tolerance = kBf16PeerTolerance;
  // A checkpoint's shape is checked once it is loaded (HfShape).
  if (o->custom_shape && !hf && !ValidateShape(o->shape, &r.error)) return r;
  if (o->threads.empty()) o->threads.push_back(HardwareThreads());
  r.action = ParseAction::kRun;
  return r;
}

std::vector<Shape> CasesToRun(const BenchOptions& o) {
  if (o.custom_shape) return {o.shape};
  std::vector<Shape> cases;
  std::vector<Shape> suite = DefaultSuite();
  for (const Shape& s : VariantSuite()) suite.push_back(s);
  for (Shape s : suite) {
    if (o.causal && !s.causal) continue;
    s.need_weights = o.need_weights;
    s.prepack = !o.no_prepack;
    s.strassen = o.strassen;
    s.bf16 = o.bf16_compute;
    cases.push_back(s);
  }
  return cases;
}

std::string HelpText() {
  return R"(Usage: mha-bench [options]

Profiles mha's multi-head attention forward pass on this CPU: latency, GFLOP/s, efficiency
relative to BLIS sgemm, memory, accuracy against a double-precision reference, and optionally a
per-stage breakdown, a Chrome trace and a comparison with PyTorch, ONNX Runtime and OpenVINO.

Default suite (batch, seq, embed, heads), each without and with --causal; self-attention
(kv_seq = seq), batch-first inputs, random weights (fixed seed), need_weights off:
  (1,16,256,4) (1,128,512,8) (32,64,512,8) (8,512,768,12) (1,2048,1024,16) (4,1024,512,8)
and two causal variant cases: Llama-style (1,1024,4096,32) with 8 kv heads (head_dim 128) and
RoPE neox (theta 500000); gpt-oss-style windowed (1,4096,1024,16) with window 1024 and sinks.

Shape (any of --batch --seq --kv-seq --embed --heads runs that one shape instead of the suite;
flags not given default to batch 1, seq 128, kv-seq = seq, embed 512, heads 8):
  --batch N          batch size N
  --seq L            query tokens L
  --kv-seq S         key/value tokens S (default L; S != L runs cross-attention)
  --embed E          embedding width E (divisible by --heads)
  --heads H          attention heads H
  --causal           causal mask (key j > query i masked). Without a custom shape: run only
                     the causal cases of the suite
  --need-weights     also return the head-averaged attention weights [N, L, S] (suite too)
  --no-prepack       create the layers with AttentionConfig::prepack = kOff: projection weights
                     kept only in nn.Linear layout and packed per forward (default: prepacked
                     once at creation, kOn; suite too)
  --strassen         create the layers with AttentionConfig::prepack = kStrassen: prepacked
                     with the Strassen operands of the large matrices (opt-in; suite too)
  --compute f32|bf16|int8 the layers' AttentionConfig::compute (default f32; suite too). bf16
                     runs the kernel --version names (MHA_BF16_KERNEL=amx|avx512_bf16|neon_bf16|
                     emulated picks another available one); its default --tolerance is 5e-2.
                     int8 (quantized --weights-dtype only): int8 activations, integer dots

Attention variants (any of them runs one custom case, with the shape flags' defaults; README
"Attention variants" gives each formula):
  --kv-heads K       grouped-query attention: K key/value heads (a divisor of --heads)
  --rope S           rotary embedding of q and k: neox (HF rotate_half) or gptj (interleaved)
  --rope-theta F     RoPE base (default 10000)
  --rotary-dim N     rotated components per head, even, <= head_dim (default head_dim)
  --rope-scale F     linear position interpolation: angles use p / F (default 1)
  --alibi            ALiBi with the paper's slopes
  --window W         sliding window of W positions (with --causal: p_i - W < p_j <= p_i)
  --softcap F        scores = F * tanh(scores / F)
  --sinks            random per-head sink logits in U(-1, 1)
  --qk-norm          QK-norm with random per-head weights in 1 + U(-0.25, 0.25)
  --qk-norm-eps F    QK-norm epsilon (default 1e-6)
Variant cases are checked against the double reference with the same variants. With --compare,
ort runs causal variant cases through com.microsoft GroupQueryAttention (grouped-query heads,
RoPE, window, softcap, sinks as head_sink); the other peers, and ort for ALiBi, QK-norm or
non-causal cases, skip them with a note.

Hugging Face checkpoint (--hf: one case, a real layer instead of random weights):
  --hf DIR           a checkpoint folder as transformers writes it: config.json and
                     model.safetensors, or shards named by model.safetensors.index.json (only
                     the layer's tensors are read; the header says how long loading took)
  --layer I          layer I's self-attention (the decoder's in an encoder-decoder model)
  --prefix P         or the attention module by state_dict prefix, with its trailing dot, e.g.
                     model.decoder.layers.0.encoder_attn. (cross-attention: keys and values
                     are random [N, S, hidden] with S = --kv-seq, default --seq)
  --binding B        copy (default) or view: HfOptions::binding; view keeps the checkpoint
                     mapped and the layer reads the stored tensors in place (needs
                     --weights-dtype equal to their dtype, e.g. bf16, and no fused or
                     transposed layout; else the load fails naming the tensor)
  Everything else comes from config.json: heads, kv heads, head_dim, biases, RoPE and its
  scaling, window, softcap, scale, causal or bidirectional. Inputs are random [N, L, hidden] in
  U(-1, 1), N = --batch (default 1), L = --seq (default 512). --weights-dtype f32|bf16|f16
  stores the layer's matrices in that type (default f32; a bf16 checkpoint's tensors are kept
  as stored with bf16), and --compute, --no-prepack, --strassen and --need-weights apply. The
  header names the model_type, the module, its heads, kv heads and head_dim; the FLOPs use the
  layer's widths (A = heads * head_dim may differ from hidden). max_err shows '-': there is no
  double reference of a checkpoint's layer here (tests/hf_fixtures_test checks every family
  against transformers); a NaN or infinity in the output fails the case. With --decode: the
  decode rows (--contexts, --batches, --kv-dtypes) and the prefill rows (batch 1) on that layer,
  which must be causal self-attention. Refused with --hf: --embed, --heads, --causal and the
  variant flags (config.json decides them), and --compare (the peers are given the suite's
  random-weight layers).

Measurement:
  --threads LIST     comma-separated thread counts, e.g. 1,2,4 (default: all hardware threads)
  --min-time SEC     measure each case for at least SEC seconds (default 0.5)
  --min-runs N       and at least N runs (default 5); one untimed warm-up run precedes them
  --rounds N         measure each case in N rounds (default 3, at most 100): each round times
                     the BLIS baseline, then mha for 1/N of --min-time and of --min-runs.
                     With --decode (default 1): each round times mha's step for that share,
                     then each --compare peer's for the same share (its process started
                     again), so mha and the peers alternate on a machine whose bandwidth
                     drifts; <peer>/mha is the median of the rounds' paired ratios
  --sgemm-size M     BLIS baseline: the fastest of 3 M x M x M sgemm products with the same
                     threads, at the start of every round, and once at the start of the run for
                     the header (default 2048; 0 skips it and the multiply-add peak, and leaves
                     eff% and peak% empty). On an
                     AVX-512 target it uses BLIS's skx kernels when they are faster than the
                     configuration BLIS selects (BLIS 0.9.0 picks its AVX2 kernels on AVX-512
                     CPUs it does not know), measured in a child process; the header names it
  --tolerance X      max absolute error accepted against the reference (default 1e-3)
  --seed N           random seed of weights and inputs (default 42)
  --breakdown        record per-task trace events and report time per stage (see below)
  --compare LIST     also time peer libraries on the same weights and inputs, each right
                     after the case with the same threads, --min-time and --min-runs:
                     a comma-separated list of (or all)
                       torch          torch.nn.MultiheadAttention, eval, need_weights as the
                                      case asks; causal: attn_mask + is_causal=True
                       sdpa           F.linear + F.scaled_dot_product_attention + F.linear
                       ort            ONNX Runtime com.microsoft Attention (unidirectional for
                                      causal) + MatMul/Add, intra_op_num_threads = threads
                       openvino       OpenVINO MatMul/Add -> ScaledDotProductAttention ->
                                      MatMul/Add, INFERENCE_PRECISION_HINT f32,
                                      INFERENCE_NUM_THREADS = threads
                       openvino-bf16  the same with INFERENCE_PRECISION_HINT bf16
                     Each peer runs in its own process of tools/peers.py, given a temporary
                     safetensors file with mha's weights, inputs and output. Its first output is
                     compared with mha's: max_err, marked '!' (and a note) above --tolerance
                     for f32 peers, above 5e-2 for bf16 ones. Columns per peer: <peer>_ms (its
                     median) and <peer>/mha = <peer>_ms / median_ms (above 1: mha is faster).
                     A peer that cannot be imported, or lacks a feature the case needs
                     (need_weights, cross-attention), prints a note and leaves its cells empty.
                     Python: $MHA_BENCH_PEER_PYTHON, else the venv tools/dev peers creates
                     (build/peers-venv), else /usr/bin/python3 (Debian's torch 1.13 only).
                     Script: $MHA_BENCH_PEER_SCRIPT, else tools/peers.py of the source tree.
                     With --decode: the decode peers ort, ort-int8, sdpa, openvino,
                     openvino-int8 and ggml (below)
  --compare-torch    the same as --compare torch

Incremental decoding (--decode runs this suite instead of the one above):
  --decode           time KvCache::Step for one new token per batch entry over a cache that
                     already holds `context` - 1 positions (so the token attends to `context`):
                     E 1024, 16 heads (head_dim 64), as MHA (16 kv heads) and GQA (4 kv heads),
                     f32, bf16 and int8 caches, for every context x batch. The cache is filled with
                     random projected keys/values (KvCache::AppendProjected) and truncated back
                     after each timed step, so every run sees the same context
  --contexts LIST    contexts to run, e.g. 512,4096 (default 512,1024,2048,4096,8192)
  --batches LIST     batch sizes to run, e.g. 1,8 (default 1,4,8)
  --kv-dtypes LIST   cache storage types to run, of f32, bf16, f16, i8, i8dot (default
                     f32,bf16,i8; i8dot: int8 storage with integer dot products,
                     KvCacheOptions::int8_attention; the peers run with the f32 rows, so without
                     f32 they are not timed)
  --weights-dtype T  the layer's weight storage: f32 (default), bf16 or f16 (halves the
                     weight bytes each step streams; the peers get the rounded weights in f32),
                     or quantized i8, i4 or i4-128 (1/4, 5/32 or 9/64 of the f32 bytes; the
                     peers get the dequantized weights in f32); also for a checkpoint's layer
                     without --decode (--hf)
  --decode-shape E,H,KVH  one layer of E features, H heads and KVH kv heads for the decode
                     and prefill rows (batch 1) instead of the suite's, e.g. 4096,32,8 (Llama 3
                     8B's attention); not with --hf (the checkpoint's layer has its own)
  --compare LIST     also time the peers' decode step for every f32 row (context, batch, kv
                     heads, threads), after each round of mha's (--rounds), with the same
                     threads, weights, cache contents and token, and each round's share of
                     --min-time and --min-runs: ort, ort-int8, sdpa,
                     openvino, openvino-int8, ggml or all
                       ort   ONNX Runtime com.microsoft GroupQueryAttention (its generative
                             decoders' op): one MatMul+Add for packed q|k|v, GroupQueryAttention
                             with past_key/past_value [batch, kv_heads, context, head_dim] bound
                             through IOBinding to its present_key/present_value outputs (one
                             shared buffer, nothing copied per step), seqlens_k = context - 1,
                             total_sequence_length = context, MatMul+Add;
                             intra_op_num_threads = threads. With --weights-dtype i8/i4/i4-128
                             the two products are com.microsoft MatMulNBits (bits 8 / 4, blocks
                             of 128 / 32 / 128 inputs) holding mha's codes and scales,
                             accuracy_level 0: f32 activations, mha's arithmetic
                       ort-int8  the same with accuracy_level 4: ONNX Runtime quantizes the
                             activations to int8 per block and multiplies integers (its fastest
                             CPU mode, what onnxruntime-genai's builder emits for CPU); only with
                             quantized weights; its output is checked at 5e-2
                       sdpa  F.linear (packed q|k|v), the new key/value written into a
                             preallocated cache tensor, F.scaled_dot_product_attention
                             (enable_gqa where torch has it, else repeat_interleave), F.linear
                       openvino  the stateful graph OpenVINO's LLM exports run (ReadValue ->
                             Gather(beam_idx) -> Concat -> ScaledDotProductAttention, Assign),
                             which its CPU plugin fuses into its in-place KV-cache attention
                             (KV_CACHE_PRECISION f32), MatMul+Add around it;
                             INFERENCE_NUM_THREADS = threads. A call appends a position, so the
                             cache is reset untimed every 15 calls: the timed calls attend up to
                             14 positions fewer than `context`. With --weights-dtype i8/i4/i4-128
                             the products are NNCF's compressed-weight pattern (i8 per row, i4
                             per 32 / 128 inputs) holding mha's codes and scales, on f32
                             activations (DYNAMIC_QUANTIZATION_GROUP_SIZE 0)
                       openvino-int8  the same with the plugin's default dynamic quantization of
                             the activations to int8; only with quantized weights; checked at
                             5e-2
                       ggml  llama.cpp's graph for one token of the layer with flash attention,
                             from ggml's operators (llama-cpp-python's libraries, through
                             ctypes): mul_mat+add for packed q|k|v, the new key/value copied
                             into f32 caches [head_dim, context, kv_heads, batch],
                             flash_attn_ext, mul_mat+add; the CPU backend on `threads`
                             threads. With --weights-dtype i8 / i4 / i4-128 the weights are
                             ggml's q8_0 / q4_0 / q4_0 (quantized by ggml from mha's
                             dequantized weights; int8 activations, checked at 5e-2), in the
                             CPU_REPACK buffer where ggml takes them (as llama.cpp)
                     Columns <peer>_ms (its median) and <peer>/mha = <peer>_ms / median_ms
                     (above 1: mha is faster), '!' when its first output differs from mha's f32
                     step by more than --tolerance (with a note). The bf16 and i8 rows repeat
                     the f32 row's peer time against their own median. Without the peers (no
                     venv, tools/dev peers creates it), a note is printed and the run goes on
  --prefill LIST     prompt lengths T of the prefill rows (default 512,2048; none skips them):
                     for each T, KvCache::Step of T tokens per entry into an empty f32 cache
                     against MultiheadAttention::Forward with causal of the same input, same
                     layer and threads, alternating (step first, then forward first), medians
                     over --min-time/--min-runs; layers (E, heads, kv heads, batch):
                     (1024, 16, 16, 1), (1024, 16, 4, 1), and for T <= 512 (768, 12, 12, 8).
                     Columns step_ms, forward_ms, step/fwd = step_ms / forward_ms, max_diff =
                     max |step output - forward output| ('!' above --tolerance: exit status 3)
  Columns: median_ms (latency of one step: projections of the new token, cache append,
  attention over the cache, output projection), tokens/s = batch / median, cache_MiB (K+V bytes
  read per step: batch * kv_heads * context * 2 * (head_dim * dtype size, or head_dim + 4 for
  int8's codes and row scale)), cache_GB/s = those bytes / median (1 GB = 1e9 bytes),
  +weights_GB/s = (cache bytes + the four E x E / kv x E projection weights in their storage
  dtype) / median, read% = cache_GB/s / read bandwidth, +weights% = +weights_GB/s / read
  bandwidth (every byte a step must read); attn_ms = median time of the attention over the
  cache alone (first start to last end of its tasks, from trace events), attn_GB/s = cache
  bytes / attn_ms, attn% = attn_GB/s / read bandwidth: how close reading the cache comes to
  the machine's limit. The read bandwidth, a decode step's limit, is a streaming sum of
  max(512 MiB, 4 x the last-level cache) split evenly over the same threads: best of 8 after a
  warm-up once per thread count before the cases (the header, and every row's divisor), and for
  a row whose cache exceeds the last-level cache (read from memory) best of 3 again right after
  the case, which that row's read% and attn% divide by (the probe's buffer stays allocated for
  the run); the copy bandwidth beside it, once per thread count: memcpy
  of a 256 MiB buffer into another, best of 5, counting bytes read + written (STREAM's
  convention); JSON has both (read_* and copy_* fields). --json/--csv write these fields (JSON:
  "peers" per row as in the forward suite, the prefill rows under "prefill"; CSV: the decode
  rows with <peer>_ms, <peer>_ratio, <peer>_max_abs_err); --min-time/--min-runs/--threads/--seed
  and --rounds apply; --decode cannot be combined with shape flags, --causal, --need-weights,
  --breakdown or --trace.

Output (a table on stdout always; progress on stderr when it is a terminal):
  --json FILE        results as JSON: {"header": {...}, "results": [{...}, ...]}
  --csv FILE         the same result fields, flattened, one header row
  --trace FILE       Chrome trace-event JSON of one forward (the first measured run of the first
                     case and thread count): one lane per worker, one event per task. Open it in
                     https://ui.perfetto.dev or chrome://tracing

  --help, -h         this text
  --version          mha version, SIMD target, BLIS architecture, the bf16 and int8-activation
                     kernels (--compute bf16 / int8), and whether f32 weights are prepacked
                     here ("f32 prepacking: yes|no"; the grouped forward of short sequences
                     needs it)

Columns:
  median_ms p10_ms p90_ms  latency of one forward, milliseconds (10th/50th/90th percentile)
  GFLOP/s      flops / median, with
                 flops = 2*N*(L*q_dim*A + S*kdim*kvE + S*vdim*kvE + L*A*E)  projections
                       + 4*N*L*S*A, halved when causal                      attention core
                 (A = heads * head_dim, which is E except for some checkpoints' layers
                 (--hf: Gemma, Qwen3); kvE = kv heads * head_dim; with --window, or a
                 checkpoint's window, the core counts the visible query-key pairs instead of
                 L*S)
               (q_dim = kdim = vdim = E here; softmax not counted; FlashAttention's convention)
  eff%         efficiency in percent: the median over the case's rounds of (the round's mha
               GFLOP/s, from the median of its runs) / (the sgemm measured at the round's
               start). On a shared machine the speed drifts by tens of percent within seconds,
               so each ratio divides two figures taken about a second apart
  sgemm        BLIS sgemm GFLOP/s (--sgemm-size) with the same threads: the median of the
               rounds' baselines (the header shows the run's first measurement)
  peak%        mha GFLOP/s in percent of the multiply-add peak: the CPU's f32 multiply-adds
               per second on the dispatched SIMD target (MHA_TARGETS applies) with the same
               threads, 12 independent chains in registers, measured after each round's sgemm;
               the median over the rounds. No f32 product can pass 100: a peer's fraction
               (JSON peers.<peer>.peak_fraction) says how much room it leaves
  wksp_MiB     workspace bytes returned by MultiheadAttention::Plan
  arena_MiB    the context arena's high-water mark
  rss_MiB      peak resident set size during the case's measured runs (Linux: VmHWM, reset per
               case through /proc/self/clear_refs); elsewhere the process's peak (ru_maxrss)
  max_err      max |mha - reference| over the output (and weights) of the warm-up run; the
               reference is double precision: the full one for small cases, a subset of query
               rows (0, L/2, L-1 of the first and last batch) for large ones

--breakdown: per stage (qkv_projection, scores, softmax, pv, out_projection, average_weights),
the sum of its task durations divided by the thread count, in ms per forward (mean over the
measured runs), so the stages add up to about the wall time; overhead = wall - sum of stages
(dispatch, idle workers, imbalance). Tracing adds a little time to the measured runs.

Exit status: 0 success; 1 an operator call or an output file failed; 2 bad command line;
3 a result exceeded --tolerance.
)";
}

}  // namespace bench
}  // namespace mha
