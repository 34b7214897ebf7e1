// Google Benchmark of incremental decoding: KvCache::Step for one new token per batch entry over
// a cache that already holds context - 1 positions (the token attends to `context` positions),
// E 1024, 16 heads of 64 (MHA: 16 key/value heads), f32 and bf16 caches, contexts 512..8192,
// batch 1 and 8, on all hardware threads; the kernels' software prefetch of f32 rows on and off
// (BM_DecodePrefetch, 2 threads, also with 4 kv heads). Also the projections of a decode step
// alone: one [m, 1024] x W^T [1024, 1024] product on one thread, through the GEMV kernel and
// through the packed GEMM, m 1..16 (how kernels/gemv.h's kGemvMaxRows was chosen).
//
// Counters (rates over wall time): tokens/s = batch tokens per step; cache_bytes/s = K and V
// bytes a step reads (2 * batch * heads * context * head_dim * dtype size); weight_bytes/s for
// the projections (4 MiB of f32 weights per product).
//
//   build/bench/decode_bench --benchmark_min_time=0.2 --benchmark_filter='BM_DecodeStep/.*/8192'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/decode.h"
#include "kernels/gemm.h"
#include "kernels/gemv.h"
#include "mha/kv_cache.hpp"
#include "mha/mha.hpp"
#include "tools/bench_workload.h"

namespace mha {
namespace bench {
namespace {

constexpr int64_t kEmbed = 1024;
constexpr int64_t kHeads = 16;
constexpr int64_t kHeadDim = kEmbed / kHeads;
// Positions of random projected keys/values appended repeatedly to fill a cache: the source
// stays small (batch 8: 8 MiB) while the cache reaches any context.
constexpr int64_t kFillChunk = 256;

// The layer with random weights (nn.MultiheadAttention scale, separate q/k/v weights), built once
// per kv-head count and shared by every case.
struct DecodeLayer {
  std::vector<float> wq, wk, wv, bias, wo, bo;
  std::unique_ptr<MultiheadAttention> layer;
  Status status;
};

DecodeLayer* MakeLayer(int64_t kv_heads) {
  auto* m = new DecodeLayer;
  Random rng(kDefaultSeed);
  const float bound = 1.0f / 32.0f;  // 1 / sqrt(E)
  const int64_t kv_e = kv_heads * kHeadDim;
  for (auto* w : {&m->wq, &m->wo}) w->resize(kEmbed * kEmbed);
  for (auto* w : {&m->wk, &m->wv}) w->resize(static_cast<size_t>(kv_e * kEmbed));
  m->bias.resize(static_cast<size_t>(kEmbed + 2 * kv_e));
  m->bo.resize(kEmbed);
  for (auto* w : {&m->wq, &m->wk, &m->wv, &m->bias, &m->wo, &m->bo}) rng.Fill(w, bound);
  AttentionConfig c;
  c.embed_dim = kEmbed;
  c.num_heads = kHeads;
  c.num_kv_heads = kv_heads;
  c.batch_first = true;
  AttentionWeights w;
  w.q_proj_weight = m->wq.data();
  w.k_proj_weight = m->wk.data();
  w.v_proj_weight = m->wv.data();
  w.in_proj_bias = m->bias.data();
  w.out_proj_weight = m->wo.data();
  w.out_proj_bias = m->bo.data();
  m->status = MultiheadAttention::Create(c, w, WeightBinding::kView, &m->layer);
  return m;
}

// kv_heads: kHeads (multi-head) or kGqaKvHeads (grouped-query, 4 query heads per kv head).
constexpr int64_t kGqaKvHeads = 4;
const DecodeLayer& GetLayer(int64_t kv_heads = kHeads) {
  static const DecodeLayer* const mha = MakeLayer(kHeads);
  static const DecodeLayer* const gqa = MakeLayer(kGqaKvHeads);
  return kv_heads == kHeads ? *mha : *gqa;
}

// Appends `count` positions per entry to `cache` from random projected k/v [batch, kv_heads,
// kFillChunk, head_dim], kFillChunk positions per call.
Status FillCache(KvCache& cache, int64_t batch, int64_t kv_heads, int64_t count) {
  std::vector<float> kv(2 * static_cast<size_t>(batch * kv_heads * kFillChunk * kHeadDim));
  Random rng(kDefaultSeed + 1);
  rng.Fill(&kv, 1.0f);
  const int64_t shape[4] = {batch, kv_heads, kFillChunk, kHeadDim};
  TensorView k, v;
  Status st = TensorView::Dense(kv.data(), DType::kF32, 4, shape, &k, "k");
  if (st.ok()) st = TensorView::Dense(kv.data() + kv.size() / 2, DType::kF32, 4, shape, &v, "v");
  std::vector<int64_t> counts(static_cast<size_t>(batch));
  for (int64_t done = 0; st.ok() && done < count; done += kFillChunk) {
    std::fill(counts.begin(), counts.end(), std::min(kFillChunk, count - done));
    st = cache.AppendProjected(k, v, counts.data());
  }
  return st;
}

// One KvCache::Step per iteration: `context` positions attended by each of `batch` tokens, a
// cache of `dtype`, `threads` (0: all hardware threads), the layer with `kv_heads`.
void RunDecodeStep(benchmark::State& state, int64_t context, int64_t batch, DType dtype,
                   size_t threads, int64_t kv_heads) {
  const DecodeLayer& m = GetLayer(kv_heads);
  Status st = m.status;
  std::unique_ptr<Context> ctx;
  ContextOptions options;
  options.num_threads = threads;
  if (st.ok()) st = Context::Create(options, &ctx);
  std::unique_ptr<KvCache> cache;
  if (st.ok()) {
    st = KvCache::Create(KvCacheOptions::ForLayer(*m.layer, batch, context, dtype), &cache);
  }
  const int64_t prior = context - 1;
  if (st.ok()) st = FillCache(*cache, batch, kv_heads, prior);
  std::vector<float> x(static_cast<size_t>(batch * kEmbed)), out(x.size());
  Random rng(kDefaultSeed + 2);
  rng.Fill(&x, 1.0f);
  const int64_t shape[3] = {batch, 1, kEmbed};
  TensorView xv, ov;
  if (st.ok()) st = TensorView::Dense(x.data(), DType::kF32, 3, shape, &xv, "x");
  if (st.ok()) st = TensorView::Dense(out.data(), DType::kF32, 3, shape, &ov, "output");
  // Each step appends the token at position context - 1; Truncate drops it again (a length
  // update) so every iteration attends to exactly `context` positions.
  auto step = [&] {
    st = cache->Step(*ctx, *m.layer, xv, ov);
    for (int64_t n = 0; n < batch && st.ok(); ++n) st = cache->Truncate(n, prior);
  };
  // Warm-up: the context's arena grows to the plan and the pages fault in.
  for (int i = 0; i < 2 && st.ok(); ++i) step();
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    step();
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
  }
  // Bytes per cached element: int8 rows carry a 4-byte scale per head_dim codes.
  const double elem = dtype == DType::kF32  ? 4.0
                      : dtype == DType::kI8 ? 1.0 + 4.0 / static_cast<double>(kHeadDim)
                                            : 2.0;
  const double cache_bytes =
      2.0 * static_cast<double>(batch * kv_heads * context * kHeadDim) * elem;
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(batch), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["cache_bytes/s"] = benchmark::Counter(
      cache_bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1024);
  state.SetLabel(std::string(DTypeName(dtype)) + " cache, " + std::to_string(kv_heads) +
                 " kv heads, " + std::to_string(ctx->num_threads()) + " threads");
}

// range(0): context, range(1): batch, range(2): cache dtype (DType value), range(3): threads
// (0: all hardware threads; 1: the whole step on the benchmark's thread, whose CPU time is then
// the step's, robust to other jobs on the machine: the per-call overhead A/B of bench/README.md).
void BM_DecodeStep(benchmark::State& state) {
  RunDecodeStep(state, state.range(0), state.range(1), static_cast<DType>(state.range(2)),
                static_cast<size_t>(state.range(3)), kHeads);
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"context", "batch", "dtype", "threads"});
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t batch : {1, 8}) {
      for (int64_t context = 512; context <= 8192; context *= 2) {
        b->Args({context, batch, static_cast<int64_t>(dtype), 0});
      }
    }
  }
  b->Args({512, 1, static_cast<int64_t>(DType::kF32), 1});
}

// Real time: the work runs on the pool's threads, not only the benchmark's.
BENCHMARK(BM_DecodeStep)->Apply(DecodeArgs)->UseRealTime()->Unit(benchmark::kMillisecond);

// The decode kernels' software prefetch of f32 cache rows on and off (kernels::SetDecodePrefetch,
// whose kAuto choice differs by CPU family): steps over f32 caches of 8-32 MiB (context 512) and
// beyond the last-level cache (64-512 MiB), batch 8, 2 threads, multi-head and grouped-query.
// range(0): context, range(1): batch, range(2): cache dtype, range(3): kv heads, range(4): 1
// prefetch on, 0 off. Alternate the two on a shared machine, whose bandwidth moves between runs:
//
//   build/bench/decode_bench --benchmark_filter=BM_DecodePrefetch --benchmark_repetitions=6
//       --benchmark_enable_random_interleaving=true --benchmark_min_time=0.3  (one line)
void BM_DecodePrefetch(benchmark::State& state) {
  kernels::SetDecodePrefetch(state.range(4) != 0 ? kernels::DecodePrefetch::kOn
                                                 : kernels::DecodePrefetch::kOff);
  RunDecodeStep(state, state.range(0), state.range(1), static_cast<DType>(state.range(2)), 2,
                state.range(3));
  kernels::SetDecodePrefetch(kernels::DecodePrefetch::kAuto);
}

void PrefetchArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"context", "batch", "dtype", "kv_heads", "prefetch"});
  for (const int64_t kv_heads : {kHeads, kGqaKvHeads}) {
    for (const int64_t context : {512, 4096, 8192}) {
      for (const int64_t prefetch : {1, 0}) {
        b->Args({context, 8, static_cast<int64_t>(DType::kF32), kv_heads, prefetch});
      }
    }
  }
}

BENCHMARK(BM_DecodePrefetch)->Apply(PrefetchArgs)->UseRealTime()->Unit(benchmark::kMillisecond);

// One projection of a decode step: x [m, E] times W^T with W [E, E] row-major (nn.Linear),
// single-threaded, on a fresh copy of W per iteration set (4 MiB, more than L2: read from L3 or
// memory as in a real step, where four such matrices and the cache pass through the caches).
// range(0): m; range(1): 1 = GEMV kernel, 0 = packed GEMM (x given as a column-major view, so
// Gemm cannot take the GEMV path and packs W^T as it did before the GEMV path existed).
void BM_Projection(benchmark::State& state) {
  const size_t m = static_cast<size_t>(state.range(0));
  const bool gemv = state.range(1) != 0;
  const size_t e = static_cast<size_t>(kEmbed);
  // Several weight matrices, used in turn, so consecutive iterations do not find W in cache.
  constexpr size_t kCopies = 8;
  std::vector<float> w(kCopies * e * e), x(m * e), y(m * e);
  Random rng(kDefaultSeed + 3);
  rng.Fill(&w, 1.0f / 32.0f);
  rng.Fill(&x, 1.0f);
  // Row-major x for the GEMV path; for the packed path the same values as a column-major
  // [m, E] view with leading dimension m + 1 (never a unit column stride, also for m = 1),
  // which only changes how the small A is packed.
  const size_t ld = m + 1;
  std::vector<float> x_cm(ld * e);
  for (size_t i = 0; i < m; ++i) {
    for (size_t p = 0; p < e; ++p) x_cm[p * ld + i] = x[i * e + p];
  }
  const kernels::MatrixView a =
      gemv ? kernels::MatrixView{x.data(), m, e, static_cast<ptrdiff_t>(e), 1}
           : kernels::MatrixView{x_cm.data(), m, e, 1, static_cast<ptrdiff_t>(ld)};
  const kernels::MatrixView c{y.data(), m, e, static_cast<ptrdiff_t>(e), 1};
  kernels::GemmInit();
  const size_t align = kernels::kGemmScratchAlignment;
  std::vector<uint8_t> scratch_buf(kernels::GemmScratchBytes() + align);
  void* scratch = scratch_buf.data() +
                  (align - reinterpret_cast<uintptr_t>(scratch_buf.data()) % align) % align;
  size_t copy = 0;
  for (auto _ : state) {
    // b = W^T: column j of b is row j of W.
    const kernels::MatrixView b{w.data() + copy * e * e, e, e, 1, static_cast<ptrdiff_t>(e)};
    if (gemv) {
      kernels::Gemv(1.0f, a, b, 0.0f, c);
    } else {
      kernels::Gemm(1.0f, a, b, 0.0f, c, scratch);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    copy = (copy + 1) % kCopies;
  }
  state.counters["weight_bytes/s"] = benchmark::Counter(
      static_cast<double>(e * e * sizeof(float)), benchmark::Counter::kIsIterationInvariantRate,
      benchmark::Counter::kIs1024);
  state.SetLabel(gemv ? "gemv" : "packed gemm");
}

void ProjectionArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "gemv"});
  for (const int64_t m : {1, 2, 3, 4, 6, 8, 12, 16}) {
    b->Args({m, 1});
    b->Args({m, 0});
  }
}

BENCHMARK(BM_Projection)->Apply(ProjectionArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace bench
}  // namespace mha

BENCHMARK_MAIN();
