// mha-bench's decode cases: one KvCache::Step of a token per entry over a filled cache (against
// the machine's read bandwidth and, optionally, peers), and one prefill (KvCache::Step of a
// prompt against the causal forward). The suite that runs them is RunDecodeSuite.
#ifndef MHA_TOOLS_BENCH_DECODE_H_
#define MHA_TOOLS_BENCH_DECODE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mha/mha.hpp"
#include "tools/bench_args.h"
#include "tools/bench_peers.h"

namespace mha {
namespace bench {

// The decode suite's fixed model: E 1024, 16 heads of 64.
inline constexpr int64_t kDecodeEmbed = 1024;
inline constexpr int64_t kDecodeHeads = 16;

struct DecodeResult {
  int64_t context = 0, batch = 0, kv_heads = 0;
  int64_t embed = 0, heads = 0, head_dim = 0;  // the layer's
  DType dtype = DType::kF32;    // cache storage
  bool int8_attention = false;  // and its KvCacheOptions::int8_attention
  DType weights = DType::kF32;  // the layer's weight storage
  int64_t weight_block = 0;     // its kI4 block (AttentionConfig::weight_block, resolved)
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
  // after each round of mha's f32 row; rows of other cache types show the same peer times.
  std::map<std::string, PeerResult> peers;
  // --rounds: mha's median in each round and, on a row the peers ran for, each timed peer's
  // median in the same round, right after it.
  struct Round {
    double median_ms = 0;
    std::map<std::string, double> peer_ms;
  };
  std::vector<Round> rounds;
};

// Bytes of one cache row of hd elements in `dtype` (int8: its codes and f32 scale).
double CacheRowBytes(DType dtype, int64_t hd);

// A layer with separate q/k/v weights (the GQA layout, kept for kv_heads = heads too) and random
// weights, plus random projected keys/values for the largest batch and context (none for the
// prefill rows), viewed per case. A checkpoint's layer (--hf) has no weight arrays here.
struct DecodeModel {
  int64_t embed = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // The weights as the layer holds them: a 16-bit layer's matrices rounded to its dtype (and
  // widened back), a quantized layer's dequantized, so that the peers get the very values mha
  // multiplies. Empty with --hf.
  std::vector<float> wq, wk, wv, bias, wo, bo;
  std::unique_ptr<MultiheadAttention> layer;
  std::vector<float> kv;  // [2][max_batch, kv_heads, max_context, hd]
  int64_t max_batch = 0, max_context = 0;
};

// A model of `heads` heads of embed / heads (kv_heads of them for keys and values) with random
// weights stored as `weights` (kI4: weight_block inputs per scale), computing in `compute`, and
// random projected keys/values for max_batch x max_context.
Status MakeDecodeModel(int64_t embed, int64_t heads, int64_t kv_heads, int64_t max_batch,
                       int64_t max_context, uint64_t seed, DType weights, int64_t weight_block,
                       Compute compute, DecodeModel* m);

// A model around a layer made elsewhere (a checkpoint's, of input width `embed`), with random
// projected keys/values for max_batch x max_context.
void MakeDecodeModelForLayer(std::unique_ptr<MultiheadAttention> layer, int64_t embed,
                             int64_t max_batch, int64_t max_context, uint64_t seed, DecodeModel* m);

// Times KvCache::Step of one token per entry over `context` - 1 cached positions in --rounds
// rounds (default 1); with `peers` (an f32 cache only), each round then times the peers' step on
// the same layer, cache contents and token.
DecodeResult RunDecodeCase(const DecodeModel& m, int64_t context, int64_t batch, CacheKind kind,
                           size_t threads, const BenchOptions& o, PeerComparison* peers,
                           const std::function<void(const std::string&)>& status);

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
inline constexpr PrefillShape kPrefillShapes[] = {
    {1024, 16, 16, 1}, {1024, 16, 4, 1}, {768, 12, 12, 8}};
inline constexpr int64_t kPrefillBatchedMaxTokens = 512;

// Times KvCache::Step of `tokens` prompt tokens per entry into an empty f32 cache against
// MultiheadAttention::Forward with causal, alternating, on m's layer.
PrefillResult RunPrefillCase(const DecodeModel& m, int64_t tokens, int64_t batch, size_t threads,
                             const BenchOptions& o);

// --decode: the decode rows, then the prefill rows; prints the tables, writes --json/--csv;
// returns the exit code.
int RunDecodeSuite(const BenchOptions& o);

}  // namespace bench
}  // namespace mha

#endif  // MHA_TOOLS_BENCH_DECODE_H_
