// Decode attention over a KV cache (cache_attention.h).
#include "runtime/cache_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/decode.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/softmax.h"
#include "runtime/arena.h"
#include "runtime/forward_plan.h"
#include "runtime/qk_transform.h"

namespace mha {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

int64_t SplitSpan(int64_t length, int64_t kv_heads, int64_t hd, size_t elem_bytes, int64_t rows) {
  int64_t span = kSpan;
  for (int64_t next = 2 * kSpan;; next *= 2) {
    const bool fits = next * hd * static_cast<int64_t>(elem_bytes) <= kMaxSpanBytes &&
                      next * rows <= kMaxSpanScores &&
                      kv_heads * ((length + next - 1) / next) >= kMinSplitTasks;
    if (!fits) return span;
    span = next;
  }
}

int64_t MaxSpans(int64_t capacity, bool ring) {
  return (capacity + kSpan - 1) / kSpan + (ring ? 1 : 0);
}

// From shapes alone: N entries, T tokens each, the cache's capacity and ring flag, which parts
// run, threads.
StepWorkspace PlanStep(const LayerWeights& m, int64_t N, int64_t T, int64_t capacity, bool ring,
                       bool append, bool forward, size_t threads) {
  const int64_t G = m.H / m.KVH;
  const size_t rows = static_cast<size_t>(N * T);
  const bool split = T <= kSplitMaxTokens;
  const int64_t R = G * T;  // query rows per (entry, kv head) in the split schedule
  StepWorkspace ws;
  size_t off = 0;
  if (forward) {
    ws.q = off;
    off += FloatBytes(rows * m.E);
    ws.concat = off;
    off += FloatBytes(rows * m.E);
    if (split) {
      const int64_t max_spans = MaxSpans(capacity, ring);
      ws.acc = off;
      off += FloatBytes(static_cast<size_t>(N * m.KVH * max_spans * R * m.hd));
      ws.stats = off;
      off += FloatBytes(static_cast<size_t>(N * m.KVH * max_spans * 2 * R));
    }
  }
  if (append) {
    ws.k = off;
    off += FloatBytes(rows * m.kvE);
    ws.v = off;
    off += FloatBytes(rows * m.kvE);
  }
  if (m.variants.qk_transform()) {
    // int32 positions: FloatBytes rounds sizeof(float) == sizeof(int32_t) elements up.
    ws.q_pos = off;
    off += FloatBytes(rows);
    ws.k_pos = off;
    off += FloatBytes(rows);
    ws.qk_scratch = off;
    off += QkTransformScratchBytes(m, threads);
    RoundUpToAlignment(off, &off);
  }
  size_t attn_scratch = 0;
  if (forward) {
    // The split schedule's scores: R rows of the longest span any dtype and length give.
    attn_scratch =
        split ? FloatBytes(static_cast<size_t>(R * SplitSpan(int64_t{1} << 40, m.KVH, m.hd, 1, R)))
              : FloatBytes(kQueryBlock * kSpan) + 2 * FloatBytes(kQueryBlock);
  }
  RoundUpToAlignment(std::max(WorkerGemmScratchBytes(), attn_scratch), &ws.per_worker);
  ws.scratch = off;
  off += ws.per_worker * threads;
  ws.total = off;
  return ws;
}

void RunCacheAttention(ThreadPool& pool, TraceRecorder* trace, const LayerWeights& m,
                       const CacheStorage& cache, int64_t N, int64_t T, const int64_t* counts,
                       const StepWorkspace& ws, uint8_t* base) {
  const int64_t E = m.E, H = m.H, KVH = m.KVH, hd = m.hd;
  const int64_t G = H / KVH;
  const bool split = T <= kSplitMaxTokens;
  const int64_t R = G * T;  // query rows per (entry, kv head) in the split schedule
  const size_t per_worker = ws.per_worker;
  uint8_t* scratch = base + ws.scratch;
  const float* q_buf = reinterpret_cast<const float*>(base + ws.q);
  const size_t elem = DTypeSize(cache.dtype);
  const ptrdiff_t head_stride = static_cast<ptrdiff_t>(cache.capacity * hd);  // per (n, g)
  const DType ctype = cache.dtype;
  const LayerVariants& var = m.variants;
  const int64_t W = var.window;
  float* concat = reinterpret_cast<float*>(base + ws.concat);
  auto count_of = [&](int64_t n) { return counts != nullptr ? counts[n] : T; };
  // Entry n's query token i sits at position base_n + i.
  auto base_of = [&](int64_t n) { return cache.lengths[n] - count_of(n); };
  // The first position any query of entry n (from position `first` on) may see.
  auto band_start = [&](int64_t first) { return W > 0 ? std::max<int64_t>(0, first - W + 1) : 0; };
  // Entry n's span (split schedule; SplitSpan), the span of its grid (multiples of the span)
  // holding its band start, and the spans from it to the end.
  auto span_of = [&](int64_t n) {
    return split ? SplitSpan(cache.lengths[n], KVH, hd, elem, G * T) : kSpan;
  };
  auto first_span = [&](int64_t n) { return band_start(base_of(n)) / span_of(n); };
  auto spans_of = [&](int64_t n) {
    return (cache.lengths[n] + span_of(n) - 1) / span_of(n) - first_span(n);
  };
  auto slot_of = [&](int64_t pos) { return cache.ring ? pos % cache.capacity : pos; };
  // Element offset of (n, g, slot) in K or V; the int8 scales of the same row (null otherwise).
  auto row_of = [&](int64_t n, int64_t g, int64_t slot) {
    return ((n * KVH + g) * head_stride + slot * hd) * static_cast<ptrdiff_t>(elem);
  };
  auto scale_row = [&](const float* scales, int64_t n, int64_t g, int64_t slot) -> const float* {
    return scales != nullptr ? scales + (n * KVH + g) * cache.capacity + slot : nullptr;
  };
  // scores[r, j - a] = q_r . k_j for the positions j in [a, b) (at most the capacity): one
  // kernel call per contiguous run of slots (two when a ring range wraps).
  auto key_scores = [&](const float* q, size_t rows, ptrdiff_t q_stride, int64_t n, int64_t g,
                        int64_t a, int64_t b, float* scores, ptrdiff_t score_stride) {
    for (int64_t p = a; p < b;) {
      const int64_t slot = slot_of(p), run = std::min(b - p, cache.capacity - slot);
      kernels::QueryKeyScores(q, rows, q_stride,
                              static_cast<const uint8_t*>(cache.k) + row_of(n, g, slot), ctype, hd,
                              scale_row(cache.k_scales, n, g, slot), static_cast<size_t>(run), hd,
                              scores + (p - a), score_stride);
      p += run;
    }
  };
  // acc[r] += sum_j p[r, j - a] v_j over the positions j in [a, b), as key_scores.
  auto weighted_values = [&](const float* p, size_t rows, ptrdiff_t p_stride, int64_t n, int64_t g,
                             int64_t a, int64_t b, float* acc, ptrdiff_t acc_stride) {
    for (int64_t pos = a; pos < b;) {
      const int64_t slot = slot_of(pos), run = std::min(b - pos, cache.capacity - slot);
      kernels::AccumulateWeightedValues(p + (pos - a), rows, p_stride,
                                        static_cast<const uint8_t*>(cache.v) + row_of(n, g, slot),
                                        ctype, hd, scale_row(cache.v_scales, n, g, slot),
                                        static_cast<size_t>(run), hd, acc, acc_stride);
      pos += run;
    }
  };
  // The variants' terms of query head h; the caller sets causal_offset.
  auto masks_of = [&](int64_t h) {
    kernels::SoftmaxMasks masks;
    masks.causal = true;
    masks.softcap = var.softcap;
    masks.alibi_slope = var.alibi_slopes.empty() ? 0.0f : var.alibi_slopes[h];
    masks.window = W;
    return masks;
  };
  auto sink_of = [&](int64_t h) { return var.sinks.empty() ? kNegInf : var.sinks[h]; };
  const float scale = m.scale;
  // One trace event per attention task (mha-bench --decode times the attention from them).

  if (split) {
    // Per (n, g, span) slot: acc [T][G][hd] (token-major, like concat's head columns) and
    // stats [2][G][T] (row max, then row sum). Span slot j of entry n is the global span
    // first_span(n) + j.
    int64_t spans = 1;
    for (int64_t n = 0; n < N; ++n) spans = std::max(spans, spans_of(n));
    float* acc_all = reinterpret_cast<float*>(base + ws.acc);
    float* stats_all = reinterpret_cast<float*>(base + ws.stats);
    const size_t slot_acc = static_cast<size_t>(R * hd), slot_stats = static_cast<size_t>(2 * R);
    pool.ParallelFor(static_cast<uint64_t>(N * KVH * spans), [&](uint64_t task, size_t worker) {
      const int64_t j = static_cast<int64_t>(task) % spans;
      const int64_t g = (static_cast<int64_t>(task) / spans) % KVH;
      const int64_t n = static_cast<int64_t>(task) / (spans * KVH);
      const int64_t c = first_span(n) + j;
      const TraceSpan trace_span(trace, worker, Stage::kCacheAttention, n, g, c);
      float* acc = acc_all + task * slot_acc;
      float* row_max = stats_all + task * slot_stats;
      float* row_sum = row_max + R;
      std::fill(row_max, row_max + R, kNegInf);
      std::fill(row_sum, row_sum + R, 0.0f);
      const int64_t len = cache.lengths[n];
      const int64_t span = span_of(n);
      if (c * span >= len) return;  // past this entry's end: an empty partial state
      std::memset(acc, 0, slot_acc * sizeof(float));
      const int64_t a = std::max(c * span, band_start(base_of(n)));
      const int64_t b = std::min((c + 1) * span, len);
      const size_t keys = static_cast<size_t>(b - a);
      float* scores = reinterpret_cast<float*>(scratch + worker * per_worker);  // [T][G][span]
      // The G query heads of kv head g are adjacent hd-column groups of a token's Q row.
      for (int64_t i = 0; i < T; ++i) {
        key_scores(q_buf + (n * T + i) * E + g * G * hd, G, hd, n, g, a, b, scores + i * G * span,
                   span);
      }
      for (int64_t h = 0; h < G; ++h) {
        kernels::SoftmaxMasks masks = masks_of(g * G + h);
        masks.causal_offset = base_of(n) - a;
        kernels::OnlineSoftmaxUpdate(scores + h * span, T, keys, G * span, scale, masks,
                                     row_max + h * T, row_sum + h * T, acc + h * hd, hd, G * hd);
      }
      for (int64_t i = 0; i < T; ++i) {
        weighted_values(scores + i * G * span, G, span, n, g, a, b, acc + i * G * hd, hd);
      }
    });
    // Merge the spans of each (n, head) in increasing order, from the sink's state (sink_h, 1).
    pool.ParallelFor(static_cast<uint64_t>(N * H), [&](uint64_t task, size_t worker) {
      const int64_t n = static_cast<int64_t>(task) / H, h = static_cast<int64_t>(task) % H;
      const TraceSpan trace_span(trace, worker, Stage::kCacheAttention, n, h, -1);
      const int64_t g = h / G, hh = h % G;
      const int64_t used = spans_of(n);
      const float sink = sink_of(h);
      for (int64_t i = 0; i < T; ++i) {
        float* dst = concat + (n * T + i) * E + h * hd;
        std::memset(dst, 0, hd * sizeof(float));
        if (i >= count_of(n)) continue;
        const size_t first = static_cast<size_t>((n * KVH + g) * spans);
        float mx = sink;
        for (int64_t c = 0; c < used; ++c) {
          mx = std::max(mx, stats_all[(first + c) * slot_stats + hh * T + i]);
        }
        if (mx == kNegInf) continue;  // no key allowed (cannot happen: a token sees itself)
        float sum = sink == kNegInf ? 0.0f : std::exp(sink - mx);
        for (int64_t c = 0; c < used; ++c) {
          const float* st = stats_all + (first + c) * slot_stats;
          const float cm = st[hh * T + i];
          if (cm == kNegInf) continue;
          const float w = std::exp(cm - mx);
          sum += w * st[R + hh * T + i];
          const float* acc = acc_all + (first + c) * slot_acc + (i * G + hh) * hd;
          for (int64_t d = 0; d < hd; ++d) dst[d] += w * acc[d];
        }
        kernels::ScaleBy(1.0f / sum, dst, hd);
      }
    });
  } else {
    const int64_t blocks = (T + kQueryBlock - 1) / kQueryBlock;
    pool.ParallelFor(static_cast<uint64_t>(N * H * blocks), [&](uint64_t task, size_t worker) {
      const int64_t b = static_cast<int64_t>(task) % blocks;
      const int64_t h = (static_cast<int64_t>(task) / blocks) % H;
      const int64_t n = static_cast<int64_t>(task) / (blocks * H);
      const TraceSpan trace_span(trace, worker, Stage::kCacheAttention, n, h, b);
      const int64_t g = h / G;
      const int64_t q0 = b * kQueryBlock;
      const int64_t block_rows = std::min(kQueryBlock, T - q0);
      const int64_t valid = std::max<int64_t>(0, std::min(block_rows, count_of(n) - q0));
      float* acc = concat + (n * T + q0) * E + h * hd;
      for (int64_t r = 0; r < block_rows; ++r) std::memset(acc + r * E, 0, hd * sizeof(float));
      if (valid == 0) return;
      uint8_t* ws = scratch + worker * per_worker;
      float* scores = reinterpret_cast<float*>(ws);
      float* row_max = reinterpret_cast<float*>(ws + FloatBytes(kQueryBlock * kSpan));
      float* row_sum = row_max + FloatBytes(kQueryBlock) / sizeof(float);
      const float sink = sink_of(h);
      std::fill(row_max, row_max + valid, sink);
      std::fill(row_sum, row_sum + valid, sink == kNegInf ? 0.0f : 1.0f);
      const int64_t first_pos = base_of(n) + q0;
      const int64_t key_end = first_pos + valid;  // keys the last row of the block sees
      const int64_t lo = band_start(first_pos);   // the first key the first row sees
      const float* qr = q_buf + (n * T + q0) * E + h * hd;
      for (int64_t k0 = lo / kSpan * kSpan; k0 < key_end; k0 += kSpan) {
        const int64_t a = std::max(k0, lo), e = std::min(k0 + kSpan, key_end);
        key_scores(qr, valid, E, n, g, a, e, scores, kSpan);
        kernels::SoftmaxMasks masks = masks_of(h);
        masks.causal_offset = first_pos - a;
        kernels::OnlineSoftmaxUpdate(scores, valid, e - a, kSpan, scale, masks, row_max, row_sum,
                                     acc, hd, E);
        weighted_values(scores, valid, kSpan, n, g, a, e, acc, E);
      }
      kernels::OnlineSoftmaxFinish(acc, valid, hd, E, row_sum);
    });
  }
}

}  // namespace mha
