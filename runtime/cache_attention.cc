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

namespace mha {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

// From shapes alone: N entries, T tokens each, the cache's capacity, which parts run, threads.
StepWorkspace PlanStep(const LayerWeights& m, int64_t N, int64_t T, int64_t capacity, bool append,
                       bool forward, size_t threads) {
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
      const int64_t max_spans = (capacity + kSpan - 1) / kSpan;
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
  size_t attn_scratch = 0;
  if (forward) {
    attn_scratch = split ? FloatBytes(static_cast<size_t>(R * kSpan))
                         : FloatBytes(kQueryBlock * kSpan) + 2 * FloatBytes(kQueryBlock);
  }
  RoundUpToAlignment(std::max(kernels::GemmScratchBytes(), attn_scratch), &ws.per_worker);
  ws.scratch = off;
  off += ws.per_worker * threads;
  ws.total = off;
  return ws;
}

void RunCacheAttention(ThreadPool& pool, TraceRecorder* trace, const LayerWeights& m,
                       const CacheStorage& cache, int64_t N, int64_t T, const int64_t* counts,
                       int64_t spans, const StepWorkspace& ws, uint8_t* base) {
  const int64_t E = m.E, H = m.H, KVH = m.KVH, hd = m.hd;
  const int64_t G = H / KVH;
  const bool split = T <= kSplitMaxTokens;
  const int64_t R = G * T;  // query rows per (entry, kv head) in the split schedule
  const size_t per_worker = ws.per_worker;
  uint8_t* scratch = base + ws.scratch;
  const float* q_buf = reinterpret_cast<const float*>(base + ws.q);
  const size_t elem = DTypeSize(cache.dtype);
  const ptrdiff_t head_stride = static_cast<ptrdiff_t>(cache.capacity * hd);  // per (n, g)
  // Entry n's query token i sits at position base_n + i.
  const DType ctype = cache.dtype;
  float* concat = reinterpret_cast<float*>(base + ws.concat);
  auto count_of = [&](int64_t n) { return counts != nullptr ? counts[n] : T; };
  auto base_of = [&](int64_t n) { return cache.lengths[n] - count_of(n); };
  auto cache_k = [&](int64_t n, int64_t g, int64_t pos) {
    return static_cast<const uint8_t*>(cache.k) + ((n * KVH + g) * head_stride + pos * hd) * elem;
  };
  auto cache_v = [&](int64_t n, int64_t g, int64_t pos) {
    return static_cast<const uint8_t*>(cache.v) + ((n * KVH + g) * head_stride + pos * hd) * elem;
  };
  // int8 scales of the same rows (null for the other storage types).
  auto scales_k = [&](int64_t n, int64_t g, int64_t pos) -> const float* {
    return cache.k_scales != nullptr ? cache.k_scales + (n * KVH + g) * cache.capacity + pos
                                     : nullptr;
  };
  auto scales_v = [&](int64_t n, int64_t g, int64_t pos) -> const float* {
    return cache.v_scales != nullptr ? cache.v_scales + (n * KVH + g) * cache.capacity + pos
                                     : nullptr;
  };
  const float scale = m.scale;
  // One trace event per attention task (mha-bench --decode times the attention from them).

  if (split) {
    // Per (n, g, span) slot: acc [T][G][hd] (token-major, like concat's head columns) and
    // stats [2][G][T] (row max, then row sum).
    float* acc_all = reinterpret_cast<float*>(base + ws.acc);
    float* stats_all = reinterpret_cast<float*>(base + ws.stats);
    const size_t slot_acc = static_cast<size_t>(R * hd), slot_stats = static_cast<size_t>(2 * R);
    pool.ParallelFor(static_cast<uint64_t>(N * KVH * spans), [&](uint64_t task, size_t worker) {
      const int64_t c = static_cast<int64_t>(task) % spans;
      const int64_t g = (static_cast<int64_t>(task) / spans) % KVH;
      const int64_t n = static_cast<int64_t>(task) / (spans * KVH);
      const TraceSpan trace_span(trace, worker, Stage::kCacheAttention, n, g, c);
      float* acc = acc_all + task * slot_acc;
      float* row_max = stats_all + task * slot_stats;
      float* row_sum = row_max + R;
      std::fill(row_max, row_max + R, kNegInf);
      std::fill(row_sum, row_sum + R, 0.0f);
      const int64_t k0 = c * kSpan;
      const int64_t len = cache.lengths[n];
      if (k0 >= len) return;  // past this entry's end: an empty partial state
      std::memset(acc, 0, slot_acc * sizeof(float));
      const size_t keys = static_cast<size_t>(std::min(kSpan, len - k0));
      float* scores = reinterpret_cast<float*>(scratch + worker * per_worker);  // [T][G][kSpan]
      // The G query heads of kv head g are adjacent hd-column groups of a token's Q row.
      for (int64_t i = 0; i < T; ++i) {
        kernels::QueryKeyScores(q_buf + (n * T + i) * E + g * G * hd, G, hd, cache_k(n, g, k0),
                                ctype, hd, scales_k(n, g, k0), keys, hd, scores + i * G * kSpan,
                                kSpan);
      }
      for (int64_t h = 0; h < G; ++h) {
        kernels::SoftmaxMasks masks;
        masks.causal = true;
        masks.causal_offset = base_of(n) - k0;
        kernels::OnlineSoftmaxUpdate(scores + h * kSpan, T, keys, G * kSpan, scale, masks,
                                     row_max + h * T, row_sum + h * T, acc + h * hd, hd, G * hd);
      }
      for (int64_t i = 0; i < T; ++i) {
        kernels::AccumulateWeightedValues(scores + i * G * kSpan, G, kSpan, cache_v(n, g, k0),
                                          ctype, hd, scales_v(n, g, k0), keys, hd, acc + i * G * hd,
                                          hd);
      }
    });
    // Merge the spans of each (n, head) in increasing order.
    pool.ParallelFor(static_cast<uint64_t>(N * H), [&](uint64_t task, size_t worker) {
      const int64_t n = static_cast<int64_t>(task) / H, h = static_cast<int64_t>(task) % H;
      const TraceSpan trace_span(trace, worker, Stage::kCacheAttention, n, h, -1);
      const int64_t g = h / G, hh = h % G;
      const int64_t used = (cache.lengths[n] + kSpan - 1) / kSpan;
      for (int64_t i = 0; i < T; ++i) {
        float* dst = concat + (n * T + i) * E + h * hd;
        std::memset(dst, 0, hd * sizeof(float));
        if (i >= count_of(n)) continue;
        const size_t first = static_cast<size_t>((n * KVH + g) * spans);
        float mx = kNegInf;
        for (int64_t c = 0; c < used; ++c) {
          mx = std::max(mx, stats_all[(first + c) * slot_stats + hh * T + i]);
        }
        if (mx == kNegInf) continue;  // no key allowed (cannot happen: a token sees itself)
        float sum = 0.0f;
        for (int64_t c = 0; c < used; ++c) {
          const float* st = stats_all + (first + c) * slot_stats;
          const float cm = st[hh * T + i];
          if (cm == kNegInf) continue;
          const float w = std::exp(cm - mx);
          sum += w * st[R + hh * T + i];
          const float* a = acc_all + (first + c) * slot_acc + (i * G + hh) * hd;
          for (int64_t d = 0; d < hd; ++d) dst[d] += w * a[d];
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
      std::fill(row_max, row_max + valid, kNegInf);
      std::fill(row_sum, row_sum + valid, 0.0f);
      const int64_t first_pos = base_of(n) + q0;
      const int64_t key_end = first_pos + valid;  // keys the last row of the block sees
      const float* qr = q_buf + (n * T + q0) * E + h * hd;
      for (int64_t k0 = 0; k0 < key_end; k0 += kSpan) {
        const size_t keys = static_cast<size_t>(std::min(kSpan, key_end - k0));
        kernels::QueryKeyScores(qr, valid, E, cache_k(n, g, k0), ctype, hd, scales_k(n, g, k0),
                                keys, hd, scores, kSpan);
        kernels::SoftmaxMasks masks;
        masks.causal = true;
        masks.causal_offset = first_pos - k0;
        kernels::OnlineSoftmaxUpdate(scores, valid, keys, kSpan, scale, masks, row_max, row_sum,
                                     acc, hd, E);
        kernels::AccumulateWeightedValues(scores, valid, kSpan, cache_v(n, g, k0), ctype, hd,
                                          scales_v(n, g, k0), keys, hd, acc, E);
      }
      kernels::OnlineSoftmaxFinish(acc, valid, hd, E, row_sum);
    });
  }
}

}  // namespace mha
