// The plan of a KV-cache call from its shapes alone (step_plan.h).
#include "runtime/step_plan.h"

#include <algorithm>

#include "runtime/arena.h"
#include "runtime/forward_plan.h"
#include "runtime/parallel_gemm.h"
#include "runtime/qk_transform.h"

namespace mha {

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

StepPlan PlanStep(const LayerWeights& m, const StepShapes& sh, size_t threads) {
  const int64_t G = m.H / m.KVH;
  const size_t rows = static_cast<size_t>(sh.N * sh.T);
  StepPlan plan;
  plan.split = sh.T <= kSplitMaxTokens;
  plan.R = G * sh.T;
  const int64_t R = plan.R;
  size_t off = 0;
  if (sh.forward) {
    plan.q = off;
    off += FloatBytes(rows * m.E);
    plan.concat = off;
    off += FloatBytes(rows * m.E);
    if (plan.split) {
      const int64_t max_spans = MaxSpans(sh.capacity, sh.ring);
      plan.acc = off;
      off += FloatBytes(static_cast<size_t>(sh.N * m.KVH * max_spans * R * m.hd));
      plan.stats = off;
      off += FloatBytes(static_cast<size_t>(sh.N * m.KVH * max_spans * 2 * R));
    }
  }
  if (sh.append) {
    plan.k = off;
    off += FloatBytes(rows * m.kvE);
    plan.v = off;
    off += FloatBytes(rows * m.kvE);
  }
  if (m.variants.qk_transform()) {
    // int32 positions: FloatBytes rounds sizeof(float) == sizeof(int32_t) elements up.
    plan.q_pos = off;
    off += FloatBytes(rows);
    plan.k_pos = off;
    off += FloatBytes(rows);
    plan.qk_scratch = off;
    off += QkTransformScratchBytes(m, threads);
    RoundUpToAlignment(off, &off);
  }
  size_t attn_scratch = 0;
  if (sh.forward) {
    // The split schedule's scores: R rows of the longest span any dtype and length give.
    attn_scratch =
        plan.split
            ? FloatBytes(static_cast<size_t>(R * SplitSpan(int64_t{1} << 40, m.KVH, m.hd, 1, R)))
            : FloatBytes(kQueryBlock * kSpan) + 2 * FloatBytes(kQueryBlock);
  }
  RoundUpToAlignment(std::max(WorkerGemmScratchBytes(), attn_scratch), &plan.per_worker);
  plan.scratch = off;
  off += plan.per_worker * threads;
  plan.total = off;
  return plan;
}

namespace {

// Arena bytes of the prompt forward of `tokens` tokens per entry (a KV cache's prefill: causal
// self-attention of query [N, tokens, q_dim] batch-first, or [tokens, N, q_dim]).
Status PrefillPlanBytes(const MultiheadAttention& layer, int64_t N, int64_t tokens, size_t threads,
                        size_t* bytes) {
  static float placeholder;
  const int64_t E = layer.config().embed_dim;
  const int64_t d = layer.config().q_dim != 0 ? layer.config().q_dim : E;
  const bool bf = layer.config().batch_first;
  const int64_t in_shape[3] = {bf ? N : tokens, bf ? tokens : N, d};
  const int64_t out_shape[3] = {in_shape[0], in_shape[1], E};
  AttentionInputs in;
  AttentionOutputs out;
  Status s = TensorView::Dense(&placeholder, DType::kF32, 3, in_shape, &in.query);
  if (s.ok()) s = TensorView::Dense(&placeholder, DType::kF32, 3, out_shape, &out.output);
  in.causal = true;
  if (s.ok()) s = layer.Plan(in, out, threads, bytes);
  return s;
}

}  // namespace

Status PlanCacheCallBound(const MultiheadAttention& layer, const LayerWeights& m, int64_t batch,
                          int64_t capacity, bool ring, int64_t max_tokens, size_t threads,
                          size_t* bytes) {
  StepShapes sh;
  sh.N = batch;
  sh.capacity = capacity;
  sh.ring = ring;
  sh.append = sh.forward = true;  // a Step needs the most: projections, store and attention
  sh.T = std::min(max_tokens, kSplitMaxTokens);
  const size_t longest_split = PlanStep(m, sh, threads).total;
  sh.T = max_tokens;
  size_t planned = ArenaBytesFor(std::max(longest_split, PlanStep(m, sh, threads).total));
  if (max_tokens >= kPrefillForwardMinTokens && m.kd == m.qd && m.vd == m.qd) {
    const int64_t unchunked =
        LongestUnchunkedKeys(CurrentKeyChunking(), static_cast<size_t>(batch), m.kvE);
    for (const int64_t t :
         {max_tokens, std::clamp(unchunked, kPrefillForwardMinTokens, max_tokens)}) {
      size_t forward_bytes = 0;
      const Status s = PrefillPlanBytes(layer, batch, t, threads, &forward_bytes);
      if (!s.ok()) return s;
      planned = std::max(planned, forward_bytes);
    }
  }
  *bytes = planned;
  return Status::Ok();
}

}  // namespace mha
