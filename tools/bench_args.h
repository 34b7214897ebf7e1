// mha-bench's command line: options, parsing with one-line error messages, and the --help text.
#ifndef MHA_TOOLS_BENCH_ARGS_H_
#define MHA_TOOLS_BENCH_ARGS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench_workload.h"

namespace mha {
namespace bench {

// A decode row's cache: its storage type and, for i8, whether the step's attention takes
// integer dot products (KvCacheOptions::int8_attention; spelled "i8dot").
struct CacheKind {
  DType dtype = DType::kF32;
  bool int8_attention = false;
  bool operator==(const CacheKind& o) const {
    return dtype == o.dtype && int8_attention == o.int8_attention;
  }
  bool operator<(const CacheKind& o) const {
    return dtype != o.dtype ? dtype < o.dtype : int8_attention < o.int8_attention;
  }
};
// "f32", "bf16", "f16", "i8" or "i8dot".
const char* CacheKindName(const CacheKind& kind);

struct BenchOptions {
  // A custom shape (any of --batch --seq --kv-seq --embed --heads given) replaces the suite.
  bool custom_shape = false;
  Shape shape;  // the custom shape, with defaults for the flags not given
  // --causal / --need-weights without a custom shape filter or modify the default suite.
  bool causal = false;
  bool need_weights = false;
  bool no_prepack = false;  // --no-prepack: layers without prepacked weights
  bool strassen = false;  // --strassen: prepacked with Strassen operands (kStrassen)
  bool bf16_compute = false;  // --compute bf16: layers with AttentionConfig::compute = kBF16
  bool int8_compute = false;  // --compute int8: kInt8 (quantized --weights-dtype only)

  std::vector<size_t> threads;  // default: {hardware threads}
  double min_time_s = 0.5;      // measured time per case, seconds
  int64_t min_runs = 5;         // measured runs per case, at least
  // Measurement rounds per case: each times the sgemm baseline, then mha for its share of
  // min_time and min_runs; efficiency is the median of the rounds' ratios.
  int64_t rounds = 3;
  bool rounds_given = false;
  int64_t sgemm_size = 2048;  // BLIS baseline is an sgemm_size^3 product; 0 = no baseline
  double tolerance = 1e-3;    // max absolute error vs the double reference
  uint64_t seed = kDefaultSeed;

  // --decode: the incremental-decoding suite (KvCache::Step of one token per entry over a cache
  // of `context` positions) instead of the forward-pass suite.
  bool decode = false;
  std::vector<int64_t> decode_contexts;  // default {512, 1024, 2048, 4096, 8192}
  std::vector<int64_t> decode_batches;   // default {1, 4, 8}
  std::vector<CacheKind> decode_caches;  // --kv-dtypes; default {f32, bf16, i8}
  DType decode_weights = DType::kF32;    // --weights-dtype: the layer's weight storage (--decode,
                                         // or a checkpoint's layer with --hf)
  int64_t decode_weight_block = 0;       // and its kI4 block (0: 32)
  bool decode_weights_given = false;
  // --decode-shape E,H,KVH: the one layer of the decode and prefill rows instead of the suite's
  // (empty: E 1024, 16 heads, 16 and 4 kv heads; the prefill's three layers).
  std::vector<int64_t> decode_shape;
  // --prefill: prompt lengths T of the prefill rows (KvCache::Step of T tokens into an empty
  // cache against the causal Forward); default {512, 2048}, empty after --prefill none.
  std::vector<int64_t> prefill_tokens;
  bool prefill_given = false;

  // --hf DIR with --layer I or --prefix P: time that attention layer of a Hugging Face
  // checkpoint (MultiheadAttention::CreateFromHuggingFace) instead of random-weight layers;
  // the shape flags give N and L (and S of a cross-attention module), config.json the rest.
  std::string hf_dir;
  int64_t hf_layer = -1;
  std::string hf_prefix;
  bool hf_prefix_given = false;
  bool hf_view = false;       // --binding view: the layer views the mapped checkpoint (kView)
  bool kv_seq_given = false;  // --kv-seq (with --hf: only for a cross-attention module)

  bool breakdown = false;
  // --compare LIST (--compare-torch = --compare torch): peers timed after each case, in the
  // order of PeerNames(); with --decode, peers of DecodePeerNames() in that order.
  std::vector<std::string> compare;
  std::string json_path;
  std::string csv_path;
  std::string trace_path;
};

// One round's share of --min-time and --min-runs when a case is measured in `rounds` rounds
// (mha's forward and decode rounds, and each peer's decode round, take the same share).
struct RoundShare {
  double min_time_s;
  int64_t min_runs;
};
inline RoundShare RoundShareOf(const BenchOptions& o, int64_t rounds) {
  return {o.min_time_s / static_cast<double>(rounds), (o.min_runs + rounds - 1) / rounds};
}

// The peers --compare knows (tools/peers.py), in the order of the table's columns.
const std::vector<std::string>& PeerNames();
// The peers that time a decode step (--decode --compare), in the order of its columns.
const std::vector<std::string>& DecodePeerNames();

enum class ParseAction { kRun, kHelp, kVersion, kError };

struct ParseResult {
  ParseAction action = ParseAction::kRun;
  std::string error;  // one line, names the flag, the expected and the actual value
};

// Parses argv[1..argc). Accepts "--flag value" and "--flag=value".
ParseResult ParseArgs(int argc, const char* const* argv, BenchOptions* options);

// The shapes to run: the custom shape, or the default suite filtered/modified by --causal and
// --need-weights.
std::vector<Shape> CasesToRun(const BenchOptions& options);

std::string HelpText();

// Exit codes, documented in --help.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;     // an operator call or an output file failed
inline constexpr int kExitUsage = 2;       // bad command line
inline constexpr int kExitInaccurate = 3;  // an output differs from the reference by > tolerance

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_ARGS_H_
