// The forward's plan, from shapes alone (XNNPACK's reshape step): which path runs, the query
// and key block sizes, and the workspace layout as named byte offsets, computed from the
// validated shapes, the aliasing of the arguments and the thread count; then the binding of a
// workspace's pointers to it (setup). Every tuning constant of the forward lives here; the
// measurements behind them are in bench/README.md. Internal: not installed.
#ifndef MHA_RUNTIME_FORWARD_PLAN_H_
#define MHA_RUNTIME_FORWARD_PLAN_H_

#include <cstddef>
#include <cstdint>

#include "runtime/layer_weights.h"
#include "runtime/validate.h"

namespace mha {

// Query rows per task of the full-row path: the scores block [block, S'] stays within ~512 KiB
// (L2), and small enough blocks leave several tasks per thread. Multiple of 8 (micro-tiles).
inline constexpr size_t kScoresBlockFloats = 128 * 1024;
inline constexpr size_t kMinQueryBlock = 8;
inline constexpr size_t kMaxQueryBlock = 256;
// Keys per key block of the online path: a strip's scores [kStripRows, kKeyBlock] are 48 KiB.
inline constexpr size_t kKeyBlock = 512;
// Query rows per task of the online path: each task packs K^T and V of every key block once, so
// it takes as many rows as leave kMinOnlineTasksPerThread tasks per thread over the N x H heads,
// at most kMaxOnlineQueryBlock (its Q and output rows are copied to scratch, 2 x 512 KiB per
// worker at head_dim 64). Rows are independent and causal strips stop at their own last row, so
// a row's work depends only on the strip grid (multiples of OnlineStripRows()): this split may
// follow the thread count without changing any result.
inline constexpr size_t kMinOnlineTasksPerThread = 4;
inline constexpr size_t kMaxOnlineQueryBlock = 2048;
// Query rows per task of the key-chunked path with a causal mask: a block skips the key chunks
// past its diagonal.
inline constexpr size_t kCausalQueryBlock = 512;
// Query rows per strip of the online path (a multiple of the micro-kernel's 6 or 8 rows on
// x86-64 and arm64; rounded down to its MR by OnlineStripRows()).
inline constexpr size_t kStripRows = 24;
// Query rows per strip with Compute::kBF16: two AMX tiles of 16 rows.
inline constexpr size_t kBf16StripRows = 32;
// Tasks the averaged-weights path aims for (it has no head dimension to parallelize over), and
// the fewest query rows such a task takes: each task packs every head's K^T and V for its rows,
// so shorter tasks pack more than they multiply.
inline constexpr size_t kMinAverageTasks = 16;
inline constexpr size_t kMinAverageRows = 32;
// The key-chunked path (long keys without weights): keys per key chunk (two key blocks, so
// inside a chunk the recurrence is the unchunked one), and the size of K + V for all keys (f32)
// from which it replaces the full K, V and concat buffers.
inline constexpr int64_t kChunkKeys = 1024;
inline constexpr size_t kChunkMinKvBytes = size_t{32} << 20;
// Rows per task of the key-chunked path's output projection: a [rows, E] copy per worker.
inline constexpr size_t kOutRows = 128;

// The grouped forward (batch_groups.h): batch entries of short sequences run in groups of
// ceil(kGroupRows / L) entries, each group on one worker from its input projections to its output
// rows, when the group's Q, K, V and attention results (f32) take at most
// kGroupCacheFraction x the core's L2 (bench/README.md has the measurements: groups of 256
// rows won 1.4-5.8% at 2-3 MiB on a 2 MiB L2; 128-row groups and 4 MiB ones did not). The
// environment's MHA_GROUP_ROWS (0: never) and MHA_GROUP_MAX_KIB replace them as the process's
// defaults, read once at the first plan (never at load); ContextOptions' group_rows,
// group_max_bytes and grouped_forward replace those for one context (GroupingOf).
inline constexpr size_t kGroupRows = 256;
inline constexpr double kGroupCacheFraction = 1.5;
struct BatchGrouping {
  size_t rows = 0;       // query rows a group aims for (kGroupRows); 0 turns grouping off
  size_t max_bytes = 0;  // most bytes of a group's buffers (kGroupCacheFraction x L2)
};
BatchGrouping CurrentBatchGrouping();
// Testing hook: replaces the process-wide setting (so that any shape can take the grouped
// forward) and returns the previous one. Not for concurrent use with forwards or plans.
BatchGrouping SetBatchGroupingForTesting(const BatchGrouping& grouping);

// When Forward splits the keys into key chunks (the key-chunked path): no attention weights
// requested, more than `chunk_keys` keys, and K and V buffers of all keys (N x S' x kvE f32
// each) of at least `min_kv_bytes` together. The defaults are kChunkKeys and kChunkMinKvBytes.
struct KeyChunking {
  size_t min_kv_bytes = 0;
  int64_t chunk_keys = 0;
};
KeyChunking CurrentKeyChunking();
// The rule above for a forward of N entries of S keys (St with the appended positions) and K, V
// rows of kvE floats that requests no weights.
bool RunsKeyChunked(const KeyChunking& chunking, size_t N, int64_t S, size_t St, size_t kvE);
// The most keys per entry such a forward of N entries without appended positions keeps
// unchunked: every S up to it runs unchunked, every longer one key-chunked (the KV cache's
// prefill bound).
int64_t LongestUnchunkedKeys(const KeyChunking& chunking, size_t N, size_t kvE);
// Testing hook: replaces the process-wide setting (so small shapes reach the key-chunked path)
// and returns the previous one. Not for concurrent use with forwards or plans.
KeyChunking SetKeyChunkingForTesting(const KeyChunking& chunking);

// Advances whenever a process-wide setting a plan reads changes (the testing hooks above,
// kernels::ForceTarget, kernels::ForceBf16Kernel): a plan made at another value is not reused
// (plan_cache.h).
uint64_t PlanSettingsEpoch();

enum class ForwardPath {
  kFullRows,    // attention weights requested: scores of whole rows, masked softmax, P V
  kOnline,      // no weights: online softmax over key blocks, query blocks in strips
  kKeyChunked,  // kOnline over key chunks whose K and V are projected one at a time
};

// The online path's per-worker scratch after the GEMM packing buffer, byte offsets: scores
// [OnlineStripRows(), key_block], row max and sum [query_block] (unused when key-chunked: the
// state lives in the workspace), K^T of one key block packed [hd, key_block], V packed
// [key_block, hd], the query block's Q rows (copied [query_block, hd] where the scores product
// runs the direct kernel, see OnlineUsesDirectKernel, else PackA of [query_block, hd]) and its
// running output [query_block, hd].
struct OnlineScratch {
  size_t row_max = 0, row_sum = 0, packed_k = 0, packed_v = 0, q_rows = 0, acc_rows = 0;
  size_t total = 0;
};

// A forward's plan. Offsets are bytes from the workspace's base (64-byte aligned each); a
// buffer the path does not use has offset 0 and no bytes.
struct ForwardPlan {
  ForwardPath path = ForwardPath::kOnline;
  bool chunked() const { return path == ForwardPath::kKeyChunked; }

  // The grouped forward (batch_groups.h): batch entries per group, 0 when the forward runs
  // stage by stage. Grouped, the projection buffers and concat below hold `threads` groups of
  // batch_group entries each (batch-major), worker w's group from entry w x batch_group (a
  // grouped plan has at least as many groups as workers).
  size_t batch_group = 0;
  // Projection buffers: Q, K and V in one [tokens, q_ld] buffer at `qkv` when `fused`
  // (self-attention with packed weights), else Q [tokens_q, q_ld] at `q` and K, V
  // [tokens_kv, kvE] (key-chunked: [N, chunk_keys + extra, kvE], batch-major) at `k`, `v`;
  // q_ld is E + 2 kvE (fused) or E, padded to an odd number of cache lines under the results
  // (concat_in_q; PaddedRowFloats).
  bool fused = false;
  size_t qkv = 0, q = 0, k = 0, v = 0;
  ptrdiff_t q_ld = 0, kv_ld = 0;  // element row strides
  TokenLayout q_layout, kv_layout;
  // Attention results [tokens_q, E] (absent when acc_in_output or concat_in_q).
  size_t concat = 0;
  TokenLayout concat_layout;
  // Online and unchunked: the attention results overwrite Q in place (concat_layout is
  // q_layout). Each task reads its query rows of its head before it writes the same rows and
  // columns (a strip's scores product before its P V; several key blocks: Q copied at the
  // start), and no other task reads them.
  bool concat_in_q = false;
  // Key-chunked: the running output lives in the caller's output rows (Aliasing::out_private),
  // not in concat; row max and sum [N, H, L] f32 persist from key chunk to key chunk.
  bool acc_in_output = false;
  size_t row_max = 0, row_sum = 0;
  int64_t chunk_keys = 0;
  // Masks padded to S' columns (causal folded in) when extra key positions exist.
  bool padded_masks = false;
  size_t attn_pad = 0, kpm_pad = 0;
  // Per-worker scratch: `threads` slices of scratch_per_worker bytes, each the GEMM packing
  // buffer (gemm_scratch bytes) then the path's own (online_scratch, or the full-row path's
  // scores [query_block, S'], or the key-chunked output projection's [kOutRows, E]).
  size_t scratch = 0, scratch_per_worker = 0, gemm_scratch = 0;
  OnlineScratch online_scratch;
  // Projection weights packed once per ParallelGemm call (0 bytes when none is packed).
  size_t packed_w = 0, packed_w_bytes = 0;
  // ForwardShapes::has_positions: int32 positions q_pos [N, L] and k_pos [N, S] (0 bytes
  // otherwise). QK-norm / RoPE: the workers' scratch (QkTransformScratchBytes; 0 without).
  size_t q_pos = 0, k_pos = 0;
  size_t qk_scratch = 0, qk_scratch_bytes = 0;
  // Rows per attention task; keys per key block (online paths: min(kKeyBlock, S')).
  size_t query_block = 0, key_block = 0;
  size_t total = 0;  // workspace bytes
};

// The plan of a forward with these shapes and aliasing on `threads` workers, grouped by
// `grouping` where its rule allows (the context's, GroupingOf; {} for a forward whose projected
// keys and values go to a sink before attention reads them, a KV cache's prefill, which runs
// stage by stage).
ForwardPlan PlanForward(const LayerWeights& m, const ForwardShapes& sh, const Aliasing& aliasing,
                        size_t threads, const BatchGrouping& grouping);

// The most workspace any forward with sh's shapes needs, whatever its pointers and whatever the
// context's grouping: the maximum of PlanForward over every Aliasing those shapes allow, staged
// and with the largest batch group any grouping could choose. MultiheadAttention::Plan returns
// it.
size_t PlanForwardBound(const LayerWeights& m, const ForwardShapes& sh, size_t threads);

// Project's workspace: per-worker GEMM packing buffers [threads x scratch_per_worker] at 0,
// then int32 positions q_pos [N, L] and k_pos [N, S] (has_positions) and the QK transform's
// scratch (strided heads), byte offsets as in ForwardPlan.
struct ProjectPlan {
  size_t scratch_per_worker = 0;
  size_t q_pos = 0, k_pos = 0, qk_scratch = 0;
  size_t total = 0;
};
ProjectPlan PlanProjectWorkspace(const LayerWeights& m, const ForwardShapes& sh, size_t threads);

// Whether the online path's two products per strip run on kernels::GemmDirectPackedB, which
// reads its a operand as it lies (Q rows copied once per task, P in place), else on BLIS
// micro-kernels (Q packed once per task). Fixed per process.
bool OnlineUsesDirectKernel();

// Query rows per strip of the online path: kStripRows rounded down to a multiple of the
// micro-kernel's MR (at least MR), since strips are row ranges of the task's packed Q;
// kBf16StripRows with Compute::kBF16.
size_t OnlineStripRows(Compute compute);

// Bytes of `floats` f32 values rounded up to the workspace alignment.
size_t FloatBytes(size_t floats);

// The keys one pass of the attention tasks covers: all S' positions, or one key chunk of the
// key-chunked path, whose last also holds the appended positions [S, S').
struct KeyChunk {
  int64_t begin = 0, end = 0;  // key positions [begin, end)
  bool first = true;           // the first pass: it initializes the softmax state
};

// A workspace's pointers bound to a plan (setup): base + each named offset.
struct ForwardBuffers {
  float* q = nullptr;  // [tokens_q, q_ld] (fused: the qkv buffer)
  float* k = nullptr;  // head g at columns [g * hd, (g + 1) * hd)
  float* v = nullptr;
  // Attention results [tokens_q, E] at concat_layout: the plan's concat, Q's rows when
  // concat_in_q, or the caller's output when acc_in_output.
  float* concat = nullptr;
  TokenLayout concat_layout;
  uint8_t* attn_pad = nullptr;
  uint8_t* kpm_pad = nullptr;
  float* row_max = nullptr;  // key-chunked: [N, H, L]
  float* row_sum = nullptr;
  uint8_t* scratch = nullptr;  // worker w's at scratch + w * plan.scratch_per_worker
  uint8_t* packed_w = nullptr;
  // Explicit token positions converted to int32 (AttentionInputs::positions / key_positions):
  // q_pos [N, L] and k_pos [N, S] dense; null = index positions (queries 0..L-1, keys 0..S-1,
  // or the query positions in self-attention). Appended keys (bias_kv, zero attention) have
  // no position: layers that use positions reject them.
  int32_t* q_pos = nullptr;
  int32_t* k_pos = nullptr;
  // QK-norm / RoPE scratch (QkTransformScratchBytes).
  uint8_t* qk_scratch = nullptr;
  // The call's length for RoPE scaling (qk_transform.h's RopeCallLength), set after the
  // positions are filled.
  int64_t rope_len = 0;
};

ForwardBuffers BindForwardPlan(const ForwardPlan& plan, const LayerWeights& m,
                               const ForwardArgs& args, uint8_t* base);

// With ForwardShapes::has_positions, writes every query's and key's int32 position to q_pos
// [N, L] and k_pos [N, S]: the given positions, else queries 0..L-1 and keys the query
// positions (self-attention) or 0..S-1. Nothing otherwise.
void FillPositions(const ForwardArgs& args, int32_t* q_pos, int32_t* k_pos);

// dst[t] = first + min(t, count) for t < rows: `count` consecutive positions from `first`, the
// rows past them (padding) repeating the position after the last (any valid position does).
void FillPositionRun(int64_t first, int64_t count, int64_t rows, int32_t* dst);

}  // namespace mha

#endif  // MHA_RUNTIME_FORWARD_PLAN_H_
