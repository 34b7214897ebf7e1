// Decode attention over a KV cache: the attention tasks that read the cache's K and V in its
// storage type (kernels/decode.h), in one of two schedules the step's plan chose from the
// shapes (step_plan.h):
//   - split (T <= kSplitMaxTokens, decoding): tasks over (entry, kv head, span of positions),
//     each computing the partial online-softmax state of its span (row max, row sum,
//     unnormalized P*V) into its own slot of the workspace; then tasks over (entry, head) merge
//     the spans in increasing order (flash-decoding). One token gives only N * kv_heads
//     (entry, head) pairs, often fewer than threads; the spans supply the parallelism.
//   - blocked (prefill): tasks over (entry, head, block of kQueryBlock query rows), the
//     online-softmax recurrence over key blocks of kSpan positions in order, accumulating in
//     place.
// Both apply the causal limit through the softmax kernels' causal_offset, and the layer's
// variants through the same SoftmaxMasks terms as the forward (softcap, ALiBi slope, window, with
// index positions: a cache position is the token's position). A window skips the spans wholly
// below the band of the entry's first query (the span grid stays the global one, multiples of
// the span, so the partition depends on lengths only) and starts reading at the band. Sinks seed
// the merge (split) or the recurrence (blocked) (kernels::SinkSeededState). A ring cache reads
// position p at slot p mod capacity; a key range that wraps is read by two kernel calls.
// Internal: not installed.
#ifndef MHA_RUNTIME_CACHE_ATTENTION_H_
#define MHA_RUNTIME_CACHE_ATTENTION_H_

#include <cstddef>
#include <cstdint>

#include "runtime/kv_storage.h"
#include "runtime/layer_weights.h"
#include "runtime/step_plan.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"

namespace mha {

// Attention of the queries at plan.q in the workspace at `base` ([N*T, E]; row n * T + i: entry
// n's token i, at position lengths[n] - counts[n] + i; counts null = T each) over the cache,
// whose entry n holds positions [0, lengths[n]) (the new tokens included), into plan.concat
// [N*T, E] (rows past counts[n] zero). With a window the queries of entry n read positions from
// WindowBandStart(lengths[n] - counts[n], window) on; a ring needs them still in the ring
// (ValidateCacheCall checks it). Scratch: the plan's per-worker slices.
void RunCacheAttention(ThreadPool& pool, TraceRecorder* trace, const LayerWeights& m,
                       const CacheStorage& cache, const int64_t* lengths, int64_t N, int64_t T,
                       const int64_t* counts, const StepPlan& plan, uint8_t* base);

}  // namespace mha

#endif  // MHA_RUNTIME_CACHE_ATTENTION_H_
