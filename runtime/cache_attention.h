// Decode attention over a KV cache: the workspace plan of a KvCache call and the attention
// tasks that read the cache's K and V in its storage type (kernels/decode.h), in one of two
// schedules chosen from the shapes only:
//   - split (T <= kSplitMaxTokens, decoding): tasks over (entry, kv head, span of kSpan
//     positions), each computing the partial online-softmax state of its span (row max, row
//     sum, unnormalized P*V) into its own slot of the workspace; then tasks over (entry, head)
//     merge the spans in increasing order (flash-decoding). One token gives only N * kv_heads
//     (entry, head) pairs, often fewer than threads; the spans supply the parallelism.
//   - blocked (prefill): tasks over (entry, head, block of kQueryBlock query rows), the
//     online-softmax recurrence over the spans in order, accumulating in place.
// Both apply the causal limit through the softmax kernels' causal_offset, and the layer's
// variants through the same SoftmaxMasks terms as the forward (softcap, ALiBi slope, window, with
// index positions: a cache position is the token's position). A window skips the spans wholly
// below the band of the entry's first query (the span grid stays the global one, multiples of
// kSpan, so the partition depends on lengths only) and starts reading at the band. Sinks seed
// the merge (split) or the recurrence (blocked) with (row_max = sink_h, row_sum = 1). A ring
// cache (CacheStorage::ring) reads position p at slot p mod capacity; a key range that wraps is
// read by two kernel calls. Internal: not installed.
#ifndef MHA_RUNTIME_CACHE_ATTENTION_H_
#define MHA_RUNTIME_CACHE_ATTENTION_H_

#include <cstddef>
#include <cstdint>

#include "runtime/layer_weights.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"

namespace mha {

// Cache positions per key block of the blocked schedule, and the shortest span of the split
// schedule (SplitSpan): its scores of kQueryBlock rows (64 KiB) stay in L2.
inline constexpr int64_t kSpan = 256;
// The split schedule's span grows (in powers of two) up to this many bytes of one head's keys:
// each task then reads one long run of K and of V. On an Intel Xeon VM with AVX-512 (2 threads,
// context 32768, batch 8, 16 kv heads) steps ran 13% (f32), 12% (bf16) and 9% (int8) faster
// with spans of 1024 f32 positions (256 KiB at hd 64) than with 256, and bf16 a further 9% at
// 2048 (mha-bench --decode; runtime/README.md).
inline constexpr int64_t kMaxSpanBytes = int64_t{256} << 10;
// ... and while an entry keeps at least this many tasks (kv heads x spans), so a step of one
// sequence still spreads over up to 32 threads.
inline constexpr int64_t kMinSplitTasks = 32;
// ... and while a task's scores (query rows x span floats) stay within 32 KiB, in L1 (64 KiB of
// them, int8 spans of 4096 with 4 query rows, ran 40% slower).
inline constexpr int64_t kMaxSpanScores = 8192;

// The split schedule's span for an entry of `length` positions: the longest power of two from
// kSpan on within the three bounds above, for a cache of kv_heads heads of hd elements of
// `elem_bytes` bytes and `rows` query rows per (entry, kv head) task. From shapes and the
// entry's own length only (never threads, nor the other entries' lengths), so the attention has
// the same bits for any thread count.
int64_t SplitSpan(int64_t length, int64_t kv_heads, int64_t hd, size_t elem_bytes, int64_t rows);

// Up to this many query tokens per entry use the split schedule; its workspace grows with
// tokens x spans, so longer inputs (prefill) use the blocked schedule.
inline constexpr int64_t kSplitMaxTokens = 4;
// Query rows per task of the blocked schedule.
inline constexpr int64_t kQueryBlock = 64;

// Byte offsets of a KV-cache call's workspace: Q and concat [N*T, E] (forward), the split
// schedule's per-span partial states (sized for a full cache, so the arena reaches its final
// size on the first decode step and never grows as the sequences get longer), new K and V
// [N*T, kvE] (append), then per-worker scratch (GEMM packing, or the attention's scores). With
// QK-norm or RoPE also the int32 positions of the query and new key rows [N*T] each and the
// scratch of RunQkTransform (qk_transform.h).
struct StepWorkspace {
  size_t q = 0, concat = 0, acc = 0, stats = 0, k = 0, v = 0, scratch = 0;
  size_t q_pos = 0, k_pos = 0, qk_scratch = 0;
  size_t per_worker = 0, total = 0;
};

// Span slots per (entry, kv head) of the split schedule: the spans of kSpan a full cache holds
// (the most any SplitSpan gives), one more for a ring (its band of at most `capacity` positions
// may start inside a span).
int64_t MaxSpans(int64_t capacity, bool ring);

// From shapes alone: N entries, T tokens each, the cache's capacity and ring flag, which parts
// run, threads.
StepWorkspace PlanStep(const LayerWeights& m, int64_t N, int64_t T, int64_t capacity, bool ring,
                       bool append, bool forward, size_t threads);

// A cache's storage as the attention reads it: K and V [N, kv_heads, capacity, head_dim] of
// `dtype` (int8: a scale per row in k_scales / v_scales, else null), `lengths` [N] the cached
// positions of each entry (the new tokens included). ring: position p sits in slot p mod
// capacity (lengths may exceed the capacity), else in slot p.
struct CacheStorage {
  const void* k = nullptr;
  const void* v = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  DType dtype = DType::kF32;
  int64_t capacity = 0;
  bool ring = false;
  const int64_t* lengths = nullptr;
};

// Attention of the queries q_buf [N*T, E] (row n * T + i: entry n's token i, at position
// lengths[n] - counts[n] + i; counts null = T each) over the cache into concat [N*T, E] (rows
// past counts[n] zero). With a window the queries of entry n read positions from
// max(0, lengths[n] - counts[n] - window + 1) on; a ring needs them still in the ring
// (counts[n] + window - 1 <= capacity, checked by the caller). Workspace: ws at base.
void RunCacheAttention(ThreadPool& pool, TraceRecorder* trace, const LayerWeights& m,
                       const CacheStorage& cache, int64_t N, int64_t T, const int64_t* counts,
                       const StepWorkspace& ws, uint8_t* base);

}  // namespace mha

#endif  // MHA_RUNTIME_CACHE_ATTENTION_H_
