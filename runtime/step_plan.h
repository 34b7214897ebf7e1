// The plan of a KV-cache call (Append, Forward or Step; XNNPACK's reshape step): from the call's
// shapes alone (entries, tokens, the cache's capacity and ring flag, which parts run, threads),
// which attention schedule runs and the workspace layout as named byte offsets. The step's run
// (decode_step.h) binds a workspace to it. Every tuning constant of the decode attention lives
// here. Internal: not installed.
#ifndef MHA_RUNTIME_STEP_PLAN_H_
#define MHA_RUNTIME_STEP_PLAN_H_

#include <cstddef>
#include <cstdint>

#include "mha/mha.hpp"
#include "runtime/layer_weights.h"

namespace mha {

// A Step of at least this many tokens into an empty cache (every entry, no padding) is a
// prompt: it runs MultiheadAttention's causal forward (its tiled GEMM/softmax path) and stores
// the keys and values the forward projects, instead of the decode kernels' blocked schedule.
inline constexpr int64_t kPrefillForwardMinTokens = 64;

// Cache positions per key block of the blocked schedule, and the shortest span of the split
// schedule (SplitSpan): its scores of kQueryBlock rows (64 KiB) stay in L2.
inline constexpr int64_t kSpan = 256;
// The split schedule's span grows (in powers of two) up to this many bytes of one head's keys:
// each task then reads one long run of K and of V. On an Intel Xeon VM with AVX-512 (2 threads,
// context 32768, batch 8, 16 kv heads) steps ran 13% (f32), 12% (bf16) and 9% (int8) faster
// with spans of 1024 f32 positions (256 KiB at hd 64) than with 256, and bf16 a further 9% at
// 2048 (mha-bench --decode; bench/README.md).
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

// Span slots per (entry, kv head) of the split schedule: the spans of kSpan a full cache holds
// (the most any SplitSpan gives), one more for a ring (its band of at most `capacity` positions
// may start inside a span).
int64_t MaxSpans(int64_t capacity, bool ring);

// What a KV-cache call's plan reads: N entries of T tokens each, the cache's capacity and ring
// flag, and which parts run (append: new keys and values are projected and stored; forward:
// queries attend the cache, then the output projection).
struct StepShapes {
  int64_t N = 0, T = 0, capacity = 0;
  bool ring = false, append = false, forward = false;
};

// A KV-cache call's plan. Offsets are bytes from the workspace's base (64-byte aligned each; 0
// and no bytes for a part that does not run): Q and concat [N*T, E] (forward), the split
// schedule's per-span partial states acc [N, kv_heads, MaxSpans, R, hd] and stats [N, kv_heads,
// MaxSpans, 2, R] (sized for a full cache, so the arena reaches its final size on the first
// decode step and never grows as the sequences get longer), new K and V [N*T, kvE] (append);
// with QK-norm or RoPE the int32 positions of the query and new key rows [N*T] each and the
// scratch of RunQkTransform (qk_transform.h); then per-worker scratch (GEMM packing, or the
// attention's scores) of per_worker bytes each.
struct StepPlan {
  bool split = false;  // T <= kSplitMaxTokens: spans + merge; else blocked by query rows
  int64_t R = 0;       // query rows per (entry, kv head) task of the split schedule: G x T
  size_t q = 0, concat = 0, acc = 0, stats = 0, k = 0, v = 0, scratch = 0;
  size_t q_pos = 0, k_pos = 0, qk_scratch = 0;
  size_t per_worker = 0, total = 0;
};

StepPlan PlanStep(const LayerWeights& m, const StepShapes& sh, size_t threads);

// Arena bytes every call of a cache of `batch` entries (capacity, ring) with `layer` (whose
// resolved weights are m) of up to max_tokens tokens per entry needs on `threads` workers
// (KvCache::Plan): the larger of the longest split call and max_tokens itself (within each
// schedule the workspace grows with T), and for a layer that can Step prompts of
// kPrefillForwardMinTokens or more, the prompt forward's (MultiheadAttention::Plan) at max_tokens
// and at the longest prompt below it that the forward does not key-chunk (its workspace grows
// with the tokens except where the chunking starts). Errors: the prompt forward's plan's.
Status PlanCacheCallBound(const MultiheadAttention& layer, const LayerWeights& m, int64_t batch,
                          int64_t capacity, bool ring, int64_t max_tokens, size_t threads,
                          size_t* bytes);

}  // namespace mha

#endif  // MHA_RUNTIME_STEP_PLAN_H_
