// The forward's plan from shapes alone, and the binding of a workspace to it (forward_plan.h).
#include "runtime/forward_plan.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/gemm.h"
#include "kernels/gemm_direct.h"
#include "kernels/targets.h"
#include "runtime/arena.h"
#include "runtime/parallel_gemm.h"
#include "runtime/qk_transform.h"

namespace mha {

namespace {

std::atomic<uint64_t> g_settings_epoch{0};
std::atomic<size_t> g_chunk_min_kv_bytes{kChunkMinKvBytes};
std::atomic<int64_t> g_chunk_keys{kChunkKeys};

// The core's L2 bytes as the C library reports them (0 when it does not).
size_t L2Bytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return bytes > 0 ? static_cast<size_t>(bytes) : 0;
#else
  return 0;
#endif
}

// The value of environment variable `name` as a non-negative integer in `*value`; false (with a
// note on stderr when it is set but not such a number) otherwise.
bool EnvSize(const char* name, size_t* value) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (errno != 0 || *end != '\0' || *env == '-') {
    std::fprintf(stderr, "mha: %s=%s: expected a non-negative integer; ignored\n", name, env);
    return false;
  }
  *value = static_cast<size_t>(v);
  return true;
}

// kGroupRows and kGroupCacheFraction x L2, or the environment's MHA_GROUP_ROWS (0: never
// grouped) and MHA_GROUP_MAX_KIB (the group buffers' bound in KiB), so that the grouped forward
// can be measured against the staged one on any CPU.
BatchGrouping DefaultBatchGrouping() {
  const size_t l2 = L2Bytes();
  BatchGrouping g{l2 > 0 ? kGroupRows : 0, static_cast<size_t>(kGroupCacheFraction * l2)};
  size_t v = 0;
  if (EnvSize("MHA_GROUP_ROWS", &v)) g.rows = v;
  if (EnvSize("MHA_GROUP_MAX_KIB", &v)) g.max_bytes = v > (SIZE_MAX >> 10) ? SIZE_MAX : v << 10;
  return g;
}

// SetBatchGroupingForTesting's setting, once a test made one (constant-initialized: nothing runs
// at load).
std::atomic<bool> g_grouping_replaced{false};
std::atomic<size_t> g_group_rows{0};
std::atomic<size_t> g_group_max_bytes{0};

}  // namespace

BatchGrouping CurrentBatchGrouping() {
  if (g_grouping_replaced.load(std::memory_order_relaxed)) {
    return {g_group_rows.load(std::memory_order_relaxed),
            g_group_max_bytes.load(std::memory_order_relaxed)};
  }
  // The defaults and the environment's overrides, read once, at the first plan.
  static const BatchGrouping defaults = DefaultBatchGrouping();
  return defaults;
}

BatchGrouping SetBatchGroupingForTesting(const BatchGrouping& grouping) {
  const BatchGrouping previous = CurrentBatchGrouping();
  g_group_rows.store(grouping.rows, std::memory_order_relaxed);
  g_group_max_bytes.store(grouping.max_bytes, std::memory_order_relaxed);
  g_grouping_replaced.store(true, std::memory_order_relaxed);
  g_settings_epoch.fetch_add(1, std::memory_order_relaxed);
  return previous;
}

uint64_t PlanSettingsEpoch() {
  return g_settings_epoch.load(std::memory_order_relaxed) + kernels::DispatchEpoch();
}

KeyChunking CurrentKeyChunking() {
  return {g_chunk_min_kv_bytes.load(std::memory_order_relaxed),
          g_chunk_keys.load(std::memory_order_relaxed)};
}

namespace {

// Bytes of f32 K and V buffers of N entries of St keys, kvE floats a row each.
size_t KeyValueBytes(size_t N, size_t St, size_t kvE) { return 2 * N * St * kvE * sizeof(float); }

}  // namespace

bool RunsKeyChunked(const KeyChunking& chunking, size_t N, int64_t S, size_t St, size_t kvE) {
  return S > chunking.chunk_keys && KeyValueBytes(N, St, kvE) >= chunking.min_kv_bytes;
}

int64_t LongestUnchunkedKeys(const KeyChunking& chunking, size_t N, size_t kvE) {
  // Unchunked: S <= chunk_keys, or KeyValueBytes(N, S, kvE) < min_kv_bytes.
  if (chunking.min_kv_bytes == 0) return chunking.chunk_keys;
  const size_t below = (chunking.min_kv_bytes - 1) / KeyValueBytes(N, 1, kvE);
  return std::max<int64_t>(chunking.chunk_keys,
                           static_cast<int64_t>(std::min<size_t>(below, INT64_MAX)));
}

KeyChunking SetKeyChunkingForTesting(const KeyChunking& chunking) {
  const KeyChunking previous = CurrentKeyChunking();
  g_chunk_min_kv_bytes.store(chunking.min_kv_bytes, std::memory_order_relaxed);
  g_chunk_keys.store(std::max<int64_t>(chunking.chunk_keys, 1), std::memory_order_relaxed);
  g_settings_epoch.fetch_add(1, std::memory_order_relaxed);
  return previous;
}

size_t FloatBytes(size_t floats) {
  size_t r = 0;
  RoundUpToAlignment(floats * sizeof(float), &r);
  return r;
}

bool OnlineUsesDirectKernel() { return kernels::DirectKernelRuns(); }

// Query rows per strip of the online path: kStripRows rounded down to a multiple of the
// micro-kernel's MR (at least MR), since strips are row ranges of the task's packed Q.
size_t OnlineStripRows(Compute compute) {
  if (compute == Compute::kBF16) return kBf16StripRows;
  const size_t mr = kernels::GemmBlocking().mr;
  return std::max(kStripRows / mr, size_t{1}) * mr;
}

namespace {

// Layout of a projection buffer that follows the input's token order when the input is dense in
// batch-major or sequence-major order (so one GEMM covers all batches), batch-major otherwise.
TokenLayout BufferLayout(const SeqShape& in, int64_t N, int64_t rows_per_batch, ptrdiff_t ld) {
  if (in.layout.SequenceMajor(N) && in.tokens == rows_per_batch) {
    return {ld, N * ld};  // sequence-major, like the input
  }
  return {rows_per_batch * ld, ld};
}

// Row stride (floats) of a projection buffer of `cols` columns: an odd number of whole cache
// lines. The attention tasks write their results over Q's rows (concat_in_q) while the next
// strip's scores product loads rows a strip further on; at a stride of an even number of lines
// those loads and the pending stores fell on the same offsets modulo 4 KiB (at E = 512, strips
// of 24 rows of the 6 KiB qkv rows are 36 x 4 KiB apart), and the CPU made each load wait for
// the stores it might alias (bench/README.md, "Attention results over Q").
size_t PaddedRowFloats(size_t cols) {
  constexpr size_t kLineFloats = 64 / sizeof(float);
  size_t lines = (cols + kLineFloats - 1) / kLineFloats;
  if (lines % 2 == 0) ++lines;
  return lines * kLineFloats;
}

// The online path's per-worker scratch (OnlineScratch) for a plan's query and key blocks.
OnlineScratch OnlineScratchLayout(const ForwardPlan& ws, size_t hd, Compute compute) {
  OnlineScratch l;
  size_t off = FloatBytes(OnlineStripRows(compute) * ws.key_block);
  l.row_max = off;
  off += FloatBytes(ws.query_block);
  l.row_sum = off;
  off += FloatBytes(ws.query_block);
  // K^T and V packed as f32, or as bf16 (Compute::kBF16, whose panels pad hd to 32).
  const bool bf16 = compute == Compute::kBF16;
  const auto packed_bytes = [&](size_t k, size_t n) {
    return bf16 ? FloatBytes((kernels::PackedBf16Elements(k, n) + 1) / 2)
                : FloatBytes(kernels::PackedBFloats(k, n));
  };
  l.packed_k = off;
  off += packed_bytes(hd, ws.key_block);
  l.packed_v = off;
  off += packed_bytes(ws.key_block, hd);
  l.q_rows = off;
  off += FloatBytes(OnlineUsesDirectKernel() ? ws.query_block * hd
                                             : kernels::PackedAFloats(ws.query_block, hd));
  l.acc_rows = off;
  off += FloatBytes(ws.query_block * hd);
  l.total = off;
  return l;
}

// Whether groups of `group` of N entries keep `threads` workers busy and leave the busiest at most
// 5% more entries than the mean.
bool GroupsBalance(size_t N, size_t group, size_t threads) {
  const size_t groups = (N + group - 1) / group;
  const size_t busiest = std::min((groups + threads - 1) / threads * group, N);
  return groups >= threads && busiest * threads * 100 <= N * 105;
}

}  // namespace

size_t PlanForwardBound(const LayerWeights& m, const ForwardShapes& sh, size_t threads) {
  // A group's buffers grow with its entries: the largest group that balances is the most any
  // grouping (ContextOptions' rows and bytes) can take; smaller ones take less.
  BatchGrouping largest;
  for (size_t group = sh.N; group >= 2 && sh.L > 0; --group) {
    if (GroupsBalance(sh.N, group, threads)) {
      largest = {group * sh.L, SIZE_MAX};
      break;
    }
  }
  size_t bound = 0;
  for (const bool out_private : {false, true}) {
    for (const bool self : {false, true}) {
      // Self-attention needs key and value shaped like the query.
      if (self && !sh.self_possible) continue;
      Aliasing aliasing;
      aliasing.out_private = out_private;
      aliasing.self_attention = self;
      bound = std::max(bound, PlanForward(m, sh, aliasing, threads, {}).total);
      bound = std::max(bound, PlanForward(m, sh, aliasing, threads, largest).total);
    }
  }
  return bound;
}

namespace {

// Whether every product of `rows` rows or more by rows [0, out) of w multiplies its f32
// prepacking (routes kDirectPackedB / kBlisPackedB), never Strassen's operands.
bool MultipliesPrepacked(const WeightMatrix& w, size_t rows, size_t in, size_t out) {
  return w.strassen.empty() && w.bf16.data == nullptr && UsesPrepacked(w, rows, in, out);
}

// Entries per group of the grouped forward (ForwardPlan::batch_group), 0 to run it stage by
// stage. Grouped: online and unchunked, an output that shares no memory with the inputs (a
// group writes its output rows while later groups still read their inputs), f32 compute,
// every product over prepacked f32 weights; groups of at least two entries
// whose buffers (`entry_bytes` each) fit the grouping's bytes, that keep every worker busy and
// leave the busiest worker at most 5% more entries than the mean.
size_t BatchGroupOf(const LayerWeights& m, const ForwardShapes& sh, const Aliasing& aliasing,
                    size_t threads, const BatchGrouping& grouping, bool online_unchunked,
                    size_t entry_bytes) {
  const size_t N = sh.N, L = sh.L, St = sh.St;
  if (grouping.rows == 0 || !online_unchunked || !aliasing.out_private || L == 0) return 0;
  if (m.config.compute != Compute::kF32) return 0;
  const size_t group = std::min(grouping.rows / L + (grouping.rows % L != 0), N);
  if (group < 2 || group * entry_bytes > grouping.max_bytes) return 0;
  if (!GroupsBalance(N, group, threads)) return 0;
  const size_t E = m.E, kvE = m.kvE;
  const bool prepacked =
      MultipliesPrepacked(m.w_q, L, m.qd, E) && MultipliesPrepacked(m.w_k, St, m.kd, kvE) &&
      MultipliesPrepacked(m.w_v, St, m.vd, kvE) && MultipliesPrepacked(m.w_o, L, E, m.D);
  return prepacked ? group : 0;
}

}  // namespace

ForwardPlan PlanForward(const LayerWeights& m, const ForwardShapes& sh, const Aliasing& aliasing,
                        size_t threads, const BatchGrouping& grouping) {
  const int64_t E = m.E, H = m.H, kvE = m.kvE, hd = m.hd, qd = m.qd, kd = m.kd, vd = m.vd;
  ForwardPlan plan;
  const size_t N = sh.N, L = sh.L, St = sh.St;
  size_t off = 0;
  // Key-chunked path: long keys, no weights (see kChunkMinKvBytes). Q [tokens_q, E] is
  // projected whole (the key chunks reread it), K and V [N, chunk + extra, kvE] hold one key
  // chunk at a time, and the running softmax state of every query row stays between key chunks:
  // row max and sum [N, H, L] here, the unnormalized output in the caller's output rows when
  // they are private (out_private), else in concat. At (1, 8192, 1024, 16): 32 + 2 x 4 + 1 MiB
  // (+ 32 for concat) instead of 4 x 32 MiB (plus per-worker scratch).
  const KeyChunking chunking = CurrentKeyChunking();
  const bool online = !sh.need_weights;
  const bool chunked = online && RunsKeyChunked(chunking, N, sh.S, St, kvE);
  plan.path = chunked  ? ForwardPath::kKeyChunked
              : online ? ForwardPath::kOnline
                       : ForwardPath::kFullRows;
  // The running sums are [tokens_q, E]: they fit the output's rows when D == E.
  plan.acc_in_output = chunked && aliasing.out_private && m.D == m.E;
  plan.fused = !chunked && aliasing.self_attention && m.qkv_adjacent;
  // Online and unchunked, the attention results overwrite Q (concat_in_q); the key-chunked
  // path rereads Q after writing results, and the full-row path keeps them apart.
  const bool online_unchunked = online && !chunked;
  plan.concat_in_q = online_unchunked;
  // Row strides: Q's (fused: the qkv buffer's), padded by PaddedRowFloats under the results.
  const size_t q_cols = plan.fused ? E + 2 * kvE : E;
  plan.q_ld = plan.concat_in_q ? PaddedRowFloats(q_cols) : q_cols;
  plan.kv_ld = plan.fused ? plan.q_ld : kvE;
  // Bytes of one entry's projection buffers (the results lie over Q on the online unchunked
  // path, the only one that groups), and the entries they hold: all N, or `threads` groups
  // (batch-major).
  const size_t fused_rows = std::max(L, St);
  const size_t entry_bytes =
      sizeof(float) * (plan.fused ? fused_rows * plan.q_ld : L * plan.q_ld + 2 * St * kvE);
  plan.batch_group =
      BatchGroupOf(m, sh, aliasing, threads, grouping, online_unchunked, entry_bytes);
  // Grouped: one group per worker (there are at least as many groups as workers).
  const size_t entries = plan.batch_group > 0 ? threads * plan.batch_group : N;
  const int64_t layout_n = plan.batch_group > 0 ? 1 : static_cast<int64_t>(N);
  if (plan.fused) {
    // One [tokens, q_ld >= E + 2 kvE] buffer; rows per batch = max(L, S') so the appended
    // key/value positions fit after the real ones.
    plan.q_layout = plan.kv_layout = BufferLayout(sh.q, layout_n, fused_rows, plan.q_ld);
    plan.qkv = off;
    off += FloatBytes(entries * fused_rows * plan.q_ld);
  } else {
    // Q [tokens_q, q_ld >= E]; K and V [tokens_kv, kvE], or when chunked [N, chunk + extra,
    // kvE] (batch-major, a chunk's key k0 + i at row i).
    plan.chunk_keys = chunked ? chunking.chunk_keys : 0;
    const size_t kv_rows = chunked ? plan.chunk_keys + m.Extra() : St;
    plan.q_layout = BufferLayout(sh.q, layout_n, L, plan.q_ld);
    plan.kv_layout = chunked ? TokenLayout{static_cast<ptrdiff_t>(kv_rows * kvE), kvE}
                             : BufferLayout(sh.k, layout_n, St, kvE);
    plan.q = off;
    off += FloatBytes(entries * L * plan.q_ld);
    plan.k = off;
    off += FloatBytes(entries * kv_rows * kvE);
    plan.v = off;
    off += FloatBytes(entries * kv_rows * kvE);
  }
  if (chunked) {
    plan.row_max = off;
    off += FloatBytes(N * H * L);
    plan.row_sum = off;
    off += FloatBytes(N * H * L);
  }
  if (plan.concat_in_q) {
    plan.concat_layout = plan.q_layout;
  } else if (!plan.acc_in_output) {
    plan.concat_layout = BufferLayout(sh.q, layout_n, L, E);
    plan.concat = off;
    off += FloatBytes(entries * L * E);
  }

  // Masks are padded to S' columns (and causal folded into them) only when extra key positions
  // exist, because the kernels read a mask value for every column they process. The chunked
  // path reads the caller's masks as they are: it runs the extra positions as a block of their
  // own without masks (it would not fit an [L, S'] copy either).
  plan.padded_masks =
      !chunked && St > static_cast<size_t>(sh.S) &&
      (sh.attn.type != MaskType::kNone || sh.kpm.type != MaskType::kNone || sh.causal);
  if (plan.padded_masks) {
    if (sh.attn.type != MaskType::kNone || sh.causal) {
      const size_t slices = sh.attn.per_head ? N * H : 1;
      const size_t elem = sh.attn.type == MaskType::kFloat ? sizeof(float) : 1;
      size_t r = 0;
      RoundUpToAlignment(slices * L * St * elem, &r);
      plan.attn_pad = off;
      off += r;
    }
    if (sh.kpm.type != MaskType::kNone) {
      const size_t elem = sh.kpm.type == MaskType::kFloat ? sizeof(float) : 1;
      size_t r = 0;
      RoundUpToAlignment(N * St * elem, &r);
      plan.kpm_pad = off;
      off += r;
    }
  }

  // Without weights, the online path at every length: its strips beat the full-row path's
  // scores [block, S'] at short lengths too (bench/README.md).
  plan.key_block = std::max<size_t>(std::min(kKeyBlock, St), 1);
  // Query rows per task: the full-row path's scores block [block, S'] within
  // kScoresBlockFloats; the online path's as kMinOnlineTasksPerThread says.
  size_t qb = kCausalQueryBlock;
  if (online && !(sh.causal && chunked)) {
    // Causal too: strips stop at their own last row, so smaller blocks would skip no more of
    // the masked triangle and only pack each head's K^T and V more often.
    const size_t heads = std::max<size_t>(N * H, 1);
    const size_t blocks =
        std::max<size_t>((kMinOnlineTasksPerThread * threads + heads - 1) / heads, 1);
    const size_t strip = OnlineStripRows(m.config.compute);
    qb = std::min(kMaxOnlineQueryBlock, ((L + blocks - 1) / blocks + strip - 1) / strip * strip);
    qb = std::max(qb, strip);
  } else if (!online) {
    qb = std::min(std::max(kScoresBlockFloats / std::max<size_t>(St, 1), kMinQueryBlock),
                  kMaxQueryBlock) /
         8 * 8;
  }
  if (sh.need_weights && sh.average) {
    // Averaged weights run one task per (batch, query block) with all heads inside it: split
    // the queries so that there are at least kMinAverageTasks tasks when L allows, with blocks of
    // at least kMinAverageRows rows.
    const size_t blocks = (kMinAverageTasks + N - 1) / N;
    qb = std::min(qb, std::max<size_t>(kMinAverageRows, (L + blocks - 1) / blocks + 7) / 8 * 8);
  }
  // The full-row path's partition depends only on shapes; the online path's follows the thread
  // count too, which its results do not depend on (see kMinOnlineTasksPerThread).
  // Grouped: one task per head (each packs its K^T and V once).
  plan.query_block = plan.batch_group > 0 ? std::min(L, kMaxOnlineQueryBlock) : std::min(qb, L);
  // Per worker: the GEMM packing buffer, then the online path's strip scores, row state and
  // packed K^T and V (OnlineScratchLayout), or the full-row path's scores [block, S'] (unused
  // when the per-head weights are the scores); the key-chunked output projection uses the
  // same space for a copy of kOutRows output rows [rows, E].
  plan.gemm_scratch = WorkerGemmScratchBytes();
  RoundUpToAlignment(plan.gemm_scratch, &plan.gemm_scratch);
  if (online) plan.online_scratch = OnlineScratchLayout(plan, hd, m.config.compute);
  size_t per_worker = online ? plan.online_scratch.total : FloatBytes(plan.query_block * St);
  if (chunked) per_worker = std::max(per_worker, FloatBytes(std::min<size_t>(kOutRows, L) * E));
  plan.scratch_per_worker = plan.gemm_scratch + per_worker;
  plan.scratch = off;
  off += plan.scratch_per_worker * threads;
  // f32 projection weights packed once per projection (see ParallelGemm) when the product has
  // rows for several row panels: room for the largest of the projections that run (q, k, v
  // together or fused; when chunked q alone, then k and v per chunk; the output projection).
  // The key-chunked output projection runs its own panels (RunKeyChunks).
  // Prepacked weights (LayerWeights::Prepack) need no room: every product that would pack
  // here has PrepackedMinRows() rows or more.
  if (m.config.weight_dtype == DType::kF32 && m.w_q.packed.data == nullptr &&
      m.w_q.bf16.data == nullptr) {
    // ProjectionJob makes one product of N x len rows or N products of len rows.
    auto packs = [&](size_t len) {
      return PacksWeightsOnce(1, N * len) || PacksWeightsOnce(N, len);
    };
    const bool q_packs = packs(L);
    const bool kv_packs = packs(chunked ? plan.chunk_keys : St);
    const size_t wq = q_packs ? PackedJobBytes(qd, E) : 0;
    const size_t wkv = kv_packs ? PackedJobBytes(kd, kvE) + PackedJobBytes(vd, kvE) : 0;
    size_t bytes = 0;
    if (plan.fused) {
      bytes = q_packs ? PackedJobBytes(qd, E + 2 * kvE) : 0;
    } else if (chunked) {
      bytes = std::max(wq, wkv);
    } else {
      bytes = wq + wkv;
    }
    if (!chunked && q_packs) bytes = std::max(bytes, PackedJobBytes(E, E));
    plan.packed_w = off;
    plan.packed_w_bytes = bytes;
    off += bytes;
  }
  if (sh.has_positions) {
    // Every query's and key's position as int32 (the kernels' SoftmaxMasks::q_pos / k_pos).
    plan.q_pos = off;
    off += FloatBytes(N * L);  // int32, the size of f32
    plan.k_pos = off;
    off += FloatBytes(N * sh.S);
  }
  plan.qk_scratch_bytes = QkTransformScratchBytes(m, threads);
  if (plan.qk_scratch_bytes > 0) {
    RoundUpToAlignment(plan.qk_scratch_bytes, &plan.qk_scratch_bytes);
    plan.qk_scratch = off;
    off += plan.qk_scratch_bytes;
  }
  plan.total = off;
  return plan;
}

// The GEMMs write straight into the caller's tensors: per-worker packing buffers, and what the
// QK transform needs.
ProjectPlan PlanProjectWorkspace(const LayerWeights& m, const ForwardShapes& sh, size_t threads) {
  ProjectPlan p;
  threads = std::max<size_t>(threads, 1);
  RoundUpToAlignment(WorkerGemmScratchBytes(), &p.scratch_per_worker);
  size_t off = p.scratch_per_worker * threads;
  if (sh.has_positions) {
    p.q_pos = off;
    off += FloatBytes(sh.N * sh.L);  // int32, the size of f32
    p.k_pos = off;
    off += FloatBytes(sh.N * sh.S);
  }
  size_t qk = QkTransformScratchBytes(m, threads, /*strided_heads=*/true);
  RoundUpToAlignment(qk, &qk);
  p.qk_scratch = off;
  off += qk;
  p.total = off;
  return p;
}

void FillPositions(const ForwardArgs& args, int32_t* q_pos, int32_t* k_pos) {
  const ForwardShapes& sh = args.shapes;
  if (!sh.has_positions) return;
  const int64_t N = sh.N, L = sh.L, S = sh.S;
  if (args.positions.present()) {
    PositionsToInt32(args.positions, N, L, q_pos);
  } else {
    for (int64_t n = 0; n < N; ++n) FillPositionRun(0, L, L, q_pos + n * L);
  }
  if (args.key_positions.present()) {
    PositionsToInt32(args.key_positions, N, S, k_pos);
  } else if (args.aliasing.self_attention) {
    std::memcpy(k_pos, q_pos, N * L * sizeof(int32_t));
  } else {
    for (int64_t n = 0; n < N; ++n) FillPositionRun(0, S, S, k_pos + n * S);
  }
}

void FillPositionRun(int64_t first, int64_t count, int64_t rows, int32_t* dst) {
  for (int64_t t = 0; t < rows; ++t) dst[t] = static_cast<int32_t>(first + std::min(t, count));
}

ForwardBuffers BindForwardPlan(const ForwardPlan& plan, const LayerWeights& m,
                               const ForwardArgs& args, uint8_t* base) {
  ForwardBuffers b;
  if (plan.fused) {
    float* qkv = reinterpret_cast<float*>(base + plan.qkv);
    b.q = qkv;
    b.k = qkv + m.E;
    b.v = qkv + m.E + m.kvE;
  } else {
    b.q = reinterpret_cast<float*>(base + plan.q);
    b.k = reinterpret_cast<float*>(base + plan.k);
    b.v = reinterpret_cast<float*>(base + plan.v);
  }
  if (plan.acc_in_output) {
    b.concat = args.out;
    b.concat_layout = args.shapes.out_layout;
  } else {
    b.concat = plan.concat_in_q ? b.q : reinterpret_cast<float*>(base + plan.concat);
    b.concat_layout = plan.concat_layout;
  }
  b.attn_pad = base + plan.attn_pad;
  b.kpm_pad = base + plan.kpm_pad;
  b.row_max = reinterpret_cast<float*>(base + plan.row_max);
  b.row_sum = reinterpret_cast<float*>(base + plan.row_sum);
  b.scratch = base + plan.scratch;
  b.packed_w = base + plan.packed_w;
  if (args.shapes.has_positions) {
    b.q_pos = reinterpret_cast<int32_t*>(base + plan.q_pos);
    b.k_pos = reinterpret_cast<int32_t*>(base + plan.k_pos);
  }
  if (plan.qk_scratch_bytes > 0) b.qk_scratch = base + plan.qk_scratch;
  return b;
}

}  // namespace mha
