// Decode attention over a KV cache (cache_attention.h): the reads of K and V, one task function
// per schedule, and the split schedule's merge.
#include "runtime/cache_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/decode.h"
#include "kernels/decode_int8.h"
#include "kernels/elementwise.h"
#include "kernels/softmax.h"
#include "runtime/forward_plan.h"
#include "runtime/task_grid.h"

namespace mha {

namespace {

using kernels::kNegInf;

// What every attention task of one call reads: the layer, the cache with each entry's length
// (new tokens included) and count of query tokens, the plan and its workspace.
struct CacheReads {
  const LayerWeights& m;
  const CacheStorage& cache;
  const int64_t* lengths;  // [N]
  const int64_t* counts;   // [N] or null: T each
  int64_t T;
  const StepPlan& plan;
  const float* q;        // [N*T, E]
  float* concat;         // [N*T, E]
  uint8_t* scratch;      // worker w's plan.per_worker bytes at scratch + w * plan.per_worker
  TraceRecorder* trace;  // one event per attention task (mha-bench --decode times them)

  int64_t G() const { return m.H / m.KVH; }
  int64_t Count(int64_t n) const { return counts != nullptr ? counts[n] : T; }
  // Entry n's query token i sits at position QueryBase(n) + i.
  int64_t QueryBase(int64_t n) const { return lengths[n] - Count(n); }
  // The first position any query of entry n sees.
  int64_t BandStart(int64_t n) const { return WindowBandStart(QueryBase(n), m.variants.window); }
  // Entry n's span (split schedule: SplitSpan), the span of its grid (multiples of the span)
  // holding its band start, and the spans from there to the end.
  int64_t Span(int64_t n) const {
    return plan.split ? SplitSpan(lengths[n], m.KVH, m.hd, DTypeSize(cache.dtype), G() * T) : kSpan;
  }
  int64_t FirstSpan(int64_t n) const { return BandStart(n) / Span(n); }
  int64_t Spans(int64_t n) const { return (lengths[n] + Span(n) - 1) / Span(n) - FirstSpan(n); }
  float* WorkerScratch(size_t worker) const {
    return reinterpret_cast<float*>(scratch + worker * plan.per_worker);
  }
};

// scores[r, j - a] = q_r . k_j for rows r < rows (q_r at q + r * q_stride) and the positions j in
// [a, b) of entry n's kv head g: one kernel call per run of consecutive slots.
void KeyScores(const CacheReads& r, const float* q, size_t rows, ptrdiff_t q_stride, int64_t n,
               int64_t g, int64_t a, int64_t b, float* scores, ptrdiff_t score_stride) {
  const CacheStorage& c = r.cache;
  const size_t hd = static_cast<size_t>(c.head_dim);
  c.ForEachRun(n, g, a, b, [&](int64_t row, int64_t offset, int64_t run) {
    if (c.int8_dot) {
      kernels::QueryKeyScoresDot(kernels::DecodeDotKernel::kAuto, q, rows, q_stride,
                                 reinterpret_cast<const int8_t*>(c.KeyRow(row)), c.head_dim,
                                 c.KeyScale(row), static_cast<size_t>(run), hd, scores + offset,
                                 score_stride);
      return;
    }
    kernels::QueryKeyScores(q, rows, q_stride, c.KeyRow(row), c.dtype, c.head_dim, c.KeyScale(row),
                            static_cast<size_t>(run), hd, scores + offset, score_stride);
  });
}

// acc[r] += sum_j p[r, j - a] v_j over the positions j in [a, b), read as KeyScores reads keys.
void WeightedValues(const CacheReads& r, const float* p, size_t rows, ptrdiff_t p_stride, int64_t n,
                    int64_t g, int64_t a, int64_t b, float* acc, ptrdiff_t acc_stride) {
  const CacheStorage& c = r.cache;
  const size_t hd = static_cast<size_t>(c.head_dim);
  c.ForEachRun(n, g, a, b, [&](int64_t row, int64_t offset, int64_t run) {
    if (c.int8_dot) {
      kernels::AccumulateWeightedValuesDot(kernels::DecodeDotKernel::kAuto, p + offset, rows,
                                           p_stride, reinterpret_cast<const int8_t*>(c.ValueRow(row)),
                                           c.head_dim, c.ValueScale(row), static_cast<size_t>(run),
                                           hd, acc, acc_stride);
      return;
    }
    kernels::AccumulateWeightedValues(p + offset, rows, p_stride, c.ValueRow(row), c.dtype,
                                      c.head_dim, c.ValueScale(row), static_cast<size_t>(run), hd,
                                      acc, acc_stride);
  });
}

// The variants' score terms of query head h, causal; the caller sets causal_offset.
kernels::SoftmaxMasks HeadMasks(const LayerVariants& var, int64_t h) {
  kernels::SoftmaxMasks masks;
  masks.causal = true;
  masks.softcap = var.softcap;
  masks.alibi_slope = var.alibi_slopes.empty() ? 0.0f : var.alibi_slopes[h];
  masks.window = var.window;
  return masks;
}

// Query head h's online-softmax state before any key: its sink's (LayerVariants::sinks).
kernels::OnlineSoftmaxState HeadSeed(const LayerVariants& var, int64_t h) {
  return kernels::SinkSeededState(var.sinks.empty() ? kNegInf : var.sinks[h]);
}

// Split schedule, per (n, g, span) slot of the workspace: acc [T][G][hd] (token-major, like
// concat's head columns) and stats [2][G][T] (row max, then row sum). Span slot j of entry n is
// the global span FirstSpan(n) + j; `spans` slots per (n, g).
struct SpanSlots {
  float* acc;
  float* stats;
  int64_t spans;
  size_t acc_floats, stats_floats;  // per slot
};

// Task (n, g, j) of the split schedule: the partial state of span slot j of entry n's kv head g
// for the G query heads of g and the T tokens (an empty state past the entry's end).
void SpanTask(const CacheReads& r, const SpanSlots& slots, uint64_t task, size_t worker) {
  const int64_t KVH = r.m.KVH, hd = r.m.hd, E = r.m.E, G = r.G(), T = r.T, R = r.plan.R;
  const TaskTriple ngj = SplitTask(task, KVH, slots.spans);  // (entry, kv head, span)
  const int64_t n = ngj.i0, g = ngj.i1, j = ngj.i2;
  const int64_t c = r.FirstSpan(n) + j;
  const TraceSpan trace_span(r.trace, worker, Stage::kCacheAttention, n, g, c);
  float* acc = slots.acc + task * slots.acc_floats;
  float* row_max = slots.stats + task * slots.stats_floats;
  float* row_sum = row_max + R;
  std::fill(row_max, row_max + R, kNegInf);
  std::fill(row_sum, row_sum + R, 0.0f);
  const int64_t len = r.lengths[n];
  const int64_t span = r.Span(n);
  if (c * span >= len) return;  // past this entry's end: an empty partial state
  std::memset(acc, 0, slots.acc_floats * sizeof(float));
  const int64_t a = std::max(c * span, r.BandStart(n));
  const int64_t b = std::min((c + 1) * span, len);
  const size_t keys = static_cast<size_t>(b - a);
  float* scores = r.WorkerScratch(worker);  // [T][G][span]
  // The G query heads of kv head g are adjacent hd-column groups of a token's Q row.
  for (int64_t i = 0; i < T; ++i) {
    KeyScores(r, r.q + (n * T + i) * E + g * G * hd, G, hd, n, g, a, b, scores + i * G * span,
              span);
  }
  for (int64_t h = 0; h < G; ++h) {
    kernels::SoftmaxMasks masks = HeadMasks(r.m.variants, g * G + h);
    masks.causal_offset = r.QueryBase(n) - a;
    kernels::OnlineSoftmaxUpdate(scores + h * span, T, keys, G * span, r.m.scale, masks,
                                 row_max + h * T, row_sum + h * T, acc + h * hd, hd, G * hd);
  }
  for (int64_t i = 0; i < T; ++i) {
    WeightedValues(r, scores + i * G * span, G, span, n, g, a, b, acc + i * G * hd, hd);
  }
}

// Task (n, h) of the split schedule's merge: entry n's spans of head h in increasing order, from
// the head's seed, normalized into concat.
void MergeTask(const CacheReads& r, const SpanSlots& slots, uint64_t task, size_t worker) {
  const int64_t H = r.m.H, KVH = r.m.KVH, hd = r.m.hd, E = r.m.E, G = r.G(), T = r.T, R = r.plan.R;
  const TaskPair nh = SplitTask(task, H);  // (entry, head)
  const int64_t n = nh.outer, h = nh.inner;
  const TraceSpan trace_span(r.trace, worker, Stage::kCacheAttention, n, h, -1);
  const int64_t g = h / G, hh = h % G;
  const int64_t used = r.Spans(n);
  const kernels::OnlineSoftmaxState seed = HeadSeed(r.m.variants, h);
  const size_t first = static_cast<size_t>((n * KVH + g) * slots.spans);
  for (int64_t i = 0; i < T; ++i) {
    float* dst = r.concat + (n * T + i) * E + h * hd;
    std::memset(dst, 0, hd * sizeof(float));
    if (i >= r.Count(n)) continue;
    float mx = seed.row_max;
    for (int64_t c = 0; c < used; ++c) {
      mx = std::max(mx, slots.stats[(first + c) * slots.stats_floats + hh * T + i]);
    }
    if (mx == kNegInf) continue;  // no key allowed (cannot happen: a token sees itself)
    float sum = seed.has_sink() ? seed.row_sum * std::exp(seed.row_max - mx) : 0.0f;
    for (int64_t c = 0; c < used; ++c) {
      const float* st = slots.stats + (first + c) * slots.stats_floats;
      const float cm = st[hh * T + i];
      if (cm == kNegInf) continue;
      const float w = std::exp(cm - mx);
      sum += w * st[R + hh * T + i];
      const float* acc = slots.acc + (first + c) * slots.acc_floats + (i * G + hh) * hd;
      for (int64_t d = 0; d < hd; ++d) dst[d] += w * acc[d];
    }
    kernels::ScaleBy(1.0f / sum, dst, hd);
  }
}

// Task (n, h, block) of the blocked schedule: kQueryBlock query rows of entry n's head h, the
// recurrence over key blocks of kSpan positions from the first row's band to the last row,
// accumulating in concat.
void BlockedTask(const CacheReads& r, int64_t blocks, uint64_t task, size_t worker) {
  const int64_t H = r.m.H, hd = r.m.hd, E = r.m.E, T = r.T;
  const TaskTriple nhb = SplitTask(task, H, blocks);  // (entry, head, query block)
  const int64_t n = nhb.i0, h = nhb.i1, b = nhb.i2;
  const TraceSpan trace_span(r.trace, worker, Stage::kCacheAttention, n, h, b);
  const int64_t g = h / r.G();
  const int64_t q0 = b * kQueryBlock;
  const int64_t block_rows = std::min(kQueryBlock, T - q0);
  const int64_t valid = std::max<int64_t>(0, std::min(block_rows, r.Count(n) - q0));
  float* acc = r.concat + (n * T + q0) * E + h * hd;
  for (int64_t row = 0; row < block_rows; ++row) std::memset(acc + row * E, 0, hd * sizeof(float));
  if (valid == 0) return;
  // Per-worker scratch: scores [kQueryBlock, kSpan], then row max and row sum [kQueryBlock].
  float* scores = r.WorkerScratch(worker);
  float* row_max = scores + FloatBytes(kQueryBlock * kSpan) / sizeof(float);
  float* row_sum = row_max + FloatBytes(kQueryBlock) / sizeof(float);
  const kernels::OnlineSoftmaxState seed = HeadSeed(r.m.variants, h);
  std::fill(row_max, row_max + valid, seed.row_max);
  std::fill(row_sum, row_sum + valid, seed.row_sum);
  const int64_t first_pos = r.QueryBase(n) + q0;
  const int64_t key_end = first_pos + valid;                           // keys the last row sees
  const int64_t lo = WindowBandStart(first_pos, r.m.variants.window);  // the first row's first
  const float* qr = r.q + (n * T + q0) * E + h * hd;
  for (int64_t k0 = lo / kSpan * kSpan; k0 < key_end; k0 += kSpan) {
    const int64_t a = std::max(k0, lo), e = std::min(k0 + kSpan, key_end);
    KeyScores(r, qr, valid, E, n, g, a, e, scores, kSpan);
    kernels::SoftmaxMasks masks = HeadMasks(r.m.variants, h);
    masks.causal_offset = first_pos - a;
    kernels::OnlineSoftmaxUpdate(scores, valid, e - a, kSpan, r.m.scale, masks, row_max, row_sum,
                                 acc, hd, E);
    WeightedValues(r, scores, valid, kSpan, n, g, a, e, acc, E);
  }
  kernels::OnlineSoftmaxFinish(acc, valid, hd, E, row_sum);
}

}  // namespace

void RunCacheAttention(ThreadPool& pool, TraceRecorder* trace, const LayerWeights& m,
                       const CacheStorage& cache, const int64_t* lengths, int64_t N, int64_t T,
                       const int64_t* counts, const StepPlan& plan, uint8_t* base) {
  const CacheReads r{m,
                     cache,
                     lengths,
                     counts,
                     T,
                     plan,
                     reinterpret_cast<const float*>(base + plan.q),
                     reinterpret_cast<float*>(base + plan.concat),
                     base + plan.scratch,
                     trace};
  if (!plan.split) {
    const int64_t blocks = (T + kQueryBlock - 1) / kQueryBlock;
    pool.ParallelFor(static_cast<uint64_t>(N * m.H * blocks),
                     [&](uint64_t task, size_t worker) { BlockedTask(r, blocks, task, worker); });
    return;
  }
  SpanSlots slots{reinterpret_cast<float*>(base + plan.acc),
                  reinterpret_cast<float*>(base + plan.stats), 1,
                  static_cast<size_t>(plan.R * m.hd), static_cast<size_t>(2 * plan.R)};
  for (int64_t n = 0; n < N; ++n) slots.spans = std::max(slots.spans, r.Spans(n));
  pool.ParallelFor(static_cast<uint64_t>(N * m.KVH * slots.spans),
                   [&](uint64_t task, size_t worker) { SpanTask(r, slots, task, worker); });
  pool.ParallelFor(static_cast<uint64_t>(N * m.H),
                   [&](uint64_t task, size_t worker) { MergeTask(r, slots, task, worker); });
}

}  // namespace mha
