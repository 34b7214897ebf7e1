// Google Benchmark of quantized weights (AttentionConfig::weight_dtype) against bf16 weights on a
// Llama-shaped layer: E 4096, 32 heads of 128, 8 kv heads, RoPE (Llama 3 8B's attention), on 1
// and 2 threads:
// - BM_QuantPrefill/<dtype>/<threads>: the causal forward of 512 tokens (the prefill's products
//   run on panels of dequantized or widened weights);
// - BM_QuantDecodeStep/<dtype>/<context>/<threads>: KvCache::Step of one token over context - 1
//   cached positions (bf16 cache, batch 1; the step streams every weight once).
// dtype: 0 bf16, 1 i8, 2 i4 (block 32), 3 i4 (block 128). One layer per dtype, created once from
// the same random weights. Run the cases interleaved, so that a machine shared with other work
// loads them alike:
//
//   build/bench/quant_bench --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//       --benchmark_min_time=0.5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "tools/bench_workload.h"

namespace mha {
namespace bench {
namespace {

constexpr int64_t kEmbed = 4096, kHeads = 32, kKvHeads = 8, kHeadDim = 128;
constexpr int64_t kKvEmbed = kKvHeads * kHeadDim;
constexpr int64_t kPrefillTokens = 512;
constexpr int64_t kMaxContext = 4096;

struct Storage {
  DType dtype;
  int64_t block;
};
constexpr Storage kStorages[] = {
    {DType::kBF16, 0}, {DType::kI8, 0}, {DType::kI4, 0}, {DType::kI4, 128}};

// The four layers (kStorages' order) and random projected keys/values for the cache; built once.
struct Layers {
  std::unique_ptr<MultiheadAttention> layer[4];
  std::vector<float> kv;  // [2][kKvHeads, kMaxContext, kHeadDim]
  Status status;
};

const Layers& GetLayers() {
  static const Layers* const layers = [] {
    auto* l = new Layers;
    Random rng(kDefaultSeed);
    std::vector<float> wq(kEmbed * kEmbed), wk(kKvEmbed * kEmbed), wv(kKvEmbed * kEmbed),
        wo(kEmbed * kEmbed);
    for (auto* w : {&wq, &wk, &wv, &wo}) rng.Fill(w, 1.0f / 64.0f);  // 1 / sqrt(E)
    AttentionConfig c;
    c.embed_dim = kEmbed;
    c.num_heads = kHeads;
    c.num_kv_heads = kKvHeads;
    c.bias = false;
    c.batch_first = true;
    c.rope = RopeStyle::kNeox;
    c.rope_theta = 500000.0f;
    AttentionWeights w;
    w.q_proj_weight = wq.data();
    w.k_proj_weight = wk.data();
    w.v_proj_weight = wv.data();
    w.out_proj_weight = wo.data();
    for (int i = 0; i < 4 && l->status.ok(); ++i) {
      c.weight_dtype = kStorages[i].dtype;
      c.weight_block = kStorages[i].block;
      l->status = MultiheadAttention::Create(c, w, WeightBinding::kCopy, &l->layer[i]);
    }
    l->kv.resize(2 * static_cast<size_t>(kKvEmbed * kMaxContext));
    rng.Fill(&l->kv, 1.0f);
    return l;
  }();
  return *layers;
}

std::unique_ptr<Context> MakeContext(int64_t threads) {
  ContextOptions o;
  o.num_threads = static_cast<size_t>(threads);
  std::unique_ptr<Context> ctx;
  if (!Context::Create(o, &ctx).ok()) ctx.reset();  // the callers skip without a context
  return ctx;
}

void BM_QuantPrefill(benchmark::State& state) {
  const Layers& l = GetLayers();
  if (!l.status.ok()) return state.SkipWithError(l.status.ToString().c_str());
  const MultiheadAttention& layer = *l.layer[state.range(0)];
  std::unique_ptr<Context> ctx = MakeContext(state.range(1));
  if (ctx == nullptr) return state.SkipWithError("Context::Create failed");
  std::vector<float> x(kPrefillTokens * kEmbed), y(x.size());
  Random(kDefaultSeed + 2).Fill(&x, 1.0f);
  const int64_t shape[3] = {1, kPrefillTokens, kEmbed};
  AttentionInputs in;
  AttentionOutputs out;
  Status st = TensorView::Dense(x.data(), DType::kF32, 3, shape, &in.query);
  if (st.ok()) st = TensorView::Dense(y.data(), DType::kF32, 3, shape, &out.output);
  if (!st.ok()) return state.SkipWithError(st.ToString().c_str());
  in.causal = true;
  for (auto _ : state) {
    const Status s = layer.Forward(*ctx, in, out);
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(kPrefillTokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_QuantPrefill)
    ->ArgNames({"dtype", "threads"})
    ->ArgsProduct({{0, 1, 2, 3}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_QuantDecodeStep(benchmark::State& state) {
  const Layers& l = GetLayers();
  if (!l.status.ok()) return state.SkipWithError(l.status.ToString().c_str());
  const MultiheadAttention& layer = *l.layer[state.range(0)];
  const int64_t context = state.range(1), prior = context - 1;
  std::unique_ptr<Context> ctx = MakeContext(state.range(2));
  if (ctx == nullptr) return state.SkipWithError("Context::Create failed");
  std::unique_ptr<KvCache> cache;
  Status s = KvCache::Create(KvCacheOptions::ForLayer(layer, 1, context, DType::kBF16), &cache);
  const int64_t shape[4] = {1, kKvHeads, prior, kHeadDim};
  const int64_t strides[4] = {kKvEmbed * kMaxContext, kMaxContext * kHeadDim, kHeadDim, 1};
  TensorView k, v;
  float* keys = const_cast<float*>(l.kv.data());
  if (s.ok()) s = TensorView::Strided(keys, DType::kF32, 4, shape, strides, &k, "k");
  if (s.ok()) s = TensorView::Strided(keys + l.kv.size() / 2, DType::kF32, 4, shape, strides, &v);
  if (s.ok()) s = cache->AppendProjected(k, v);
  std::vector<float> x(kEmbed), y(kEmbed);
  Random(kDefaultSeed + 3).Fill(&x, 1.0f);
  const int64_t xs[3] = {1, 1, kEmbed};
  TensorView xv, yv;
  if (s.ok()) s = TensorView::Dense(x.data(), DType::kF32, 3, xs, &xv);
  if (s.ok()) s = TensorView::Dense(y.data(), DType::kF32, 3, xs, &yv);
  if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  for (auto _ : state) {
    s = cache->Step(*ctx, layer, xv, yv);
    state.PauseTiming();
    if (s.ok()) s = cache->Truncate(0, prior);
    state.ResumeTiming();
    if (!s.ok()) return state.SkipWithError(s.ToString().c_str());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(1.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_QuantDecodeStep)
    ->ArgNames({"dtype", "context", "threads"})
    ->ArgsProduct({{0, 1, 2, 3}, {512, 2048, 4096}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace bench
}  // namespace mha

BENCHMARK_MAIN();
