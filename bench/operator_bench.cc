// Google Benchmark of MultiheadAttention::Forward at the shapes issue 8's targets name:
// mha-bench's default suite without and with causal, on 1..hardware threads (efficiency, 1 -> 2
// thread speed-up); the same shapes with S <= 1024 with need_weights (its cost ratio); and the
// long-sequence shape (1, 8192, 1024, 16) (workspace and efficiency of the chunked path). The
// FLOPS counter uses mha-bench's formula (tools/bench_workload.h: AttentionFlops), so
// "FLOPS=25G/s" here is mha-bench's 25 GFLOP/s.
//
//   build/bench/operator_bench --benchmark_min_time=0.2 --benchmark_filter='/threads:1$'
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <thread>

#include "mha/mha.hpp"
#include "runtime/context_internal.h"
#include "tools/bench_workload.h"

namespace mha {
namespace bench {
namespace {

// Times Forward of `shape` on `threads` threads.
void RunForward(benchmark::State& state, const Shape& shape, size_t threads) {
  std::unique_ptr<Workload> workload;
  Status st = Workload::Create(shape, kDefaultSeed, &workload);
  ContextOptions options;
  options.num_threads = threads;
  std::unique_ptr<Context> context;
  if (st.ok()) st = Context::Create(options, &context);
  size_t workspace = 0;
  if (st.ok()) {
    st = workload->layer().Plan(workload->inputs(), workload->outputs(), threads, &workspace);
  }
  if (st.ok()) st = ReserveArena(*context, workspace);
  // Warm-up: faults in the arena and BLIS's packing buffers before timing.
  if (st.ok()) st = workload->layer().Forward(*context, workload->inputs(), workload->outputs());
  if (!st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    st = workload->layer().Forward(*context, workload->inputs(), workload->outputs());
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
  }
  state.counters["FLOPS"] =
      benchmark::Counter(AttentionFlops(shape), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["workspace_MiB"] = static_cast<double>(workspace) / (1024.0 * 1024.0);
}

// The self-attention shape (batch, seq, embed, heads) of the first four arguments.
Shape ShapeOf(const benchmark::State& state) {
  Shape shape;
  shape.batch = state.range(0);
  shape.seq = state.range(1);
  shape.kv_seq = shape.seq;
  shape.embed = state.range(2);
  shape.heads = state.range(3);
  return shape;
}

void BM_Forward(benchmark::State& state) {
  Shape shape = ShapeOf(state);
  shape.causal = state.range(4) != 0;
  shape.need_weights = state.range(6) != 0;
  RunForward(state, shape, static_cast<size_t>(state.range(5)));
}

// AttentionConfig::prepack off / on at the suite's shapes of 128 tokens or fewer (where packing
// the weights per forward costs most), all hardware threads. Interleave the repetitions so that
// the machine's slow spells hit both alike:
//   build/bench/operator_bench --benchmark_filter=Prepack --benchmark_repetitions=10
//     --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2
void BM_Prepack(benchmark::State& state) {
  Shape shape = ShapeOf(state);
  shape.prepack = state.range(4) != 0;
  const unsigned hw = std::thread::hardware_concurrency();
  RunForward(state, shape, hw == 0 ? 1 : hw);
}

void PrepackArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"batch", "seq", "embed", "heads", "prepack"});
  for (const Shape& s : DefaultSuite()) {
    if (s.seq > 128 || s.causal) continue;
    for (int64_t prepack : {0, 1}) b->Args({s.batch, s.seq, s.embed, s.heads, prepack});
  }
}

void SuiteArgs(benchmark::internal::Benchmark* b) {
  const unsigned hw = std::thread::hardware_concurrency();
  const int64_t max_threads = hw == 0 ? 1 : static_cast<int64_t>(hw);
  b->ArgNames({"batch", "seq", "embed", "heads", "causal", "threads", "weights"});
  for (const Shape& s : DefaultSuite()) {
    for (int64_t t = 1; t <= max_threads; ++t) {
      b->Args({s.batch, s.seq, s.embed, s.heads, s.causal ? 1 : 0, t, 0});
    }
  }
  // need_weights (averaged) for S <= 1024, all threads.
  for (const Shape& s : DefaultSuite()) {
    if (s.seq <= 1024 && !s.causal) b->Args({s.batch, s.seq, s.embed, s.heads, 0, max_threads, 1});
  }
  // The long-sequence target: chunked path, no weights.
  b->Args({1, 8192, 1024, 16, 0, max_threads, 0});
}

// Real time: the work runs on the pool's threads, not only the benchmark's.
BENCHMARK(BM_Forward)->Apply(SuiteArgs)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Prepack)->Apply(PrepackArgs)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace bench
}  // namespace mha

BENCHMARK_MAIN();
