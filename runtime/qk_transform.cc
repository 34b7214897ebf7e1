// QK-norm then RoPE on projected q and k rows (qk_transform.h).
#include "runtime/qk_transform.h"

#include <algorithm>
#include <cstring>

#include "kernels/rope.h"
#include "runtime/context_internal.h"
#include "runtime/forward_plan.h"
#include "runtime/rope_scaling.h"
#include "runtime/task_grid.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"

namespace mha {

namespace {

// Tokens per task: the cos/sin tables of a block, [kQkBlockRows, rotary_dim / 2] x 2, stay in
// L1 at rotary_dim 128 (64 KiB at most) and are reused by every head of those tokens.
constexpr int64_t kQkBlockRows = 64;

// Per-worker scratch: cos then sin [kQkBlockRows, half], then (RopeScaling::kDynamic) the
// call's inverse frequencies [half] in double, then (strided heads) one token block's rows
// copied dense [kQkBlockRows, max(E, kvE)].
size_t CosBytes(const LayerWeights& m) {
  return FloatBytes(kQkBlockRows * static_cast<size_t>(m.variants.rotary_dim / 2));
}
size_t TableBytes(const LayerWeights& m) {
  if (m.variants.rope == RopeStyle::kNone) return 0;
  const bool dynamic = m.variants.rope_scaling.type == RopeScaling::kDynamic;
  return 2 * CosBytes(m) +
         (dynamic ? FloatBytes(2 * static_cast<size_t>(m.variants.rotary_dim / 2)) : 0);
}
size_t GatherBytes(const LayerWeights& m) {
  return FloatBytes(kQkBlockRows * static_cast<size_t>(std::max(m.E, m.kvE)));
}

// QK-norm then RoPE of `rows` dense-headed tokens at x (row stride `stride`): heads * hd values
// per token, positions as in QkRows (positions already offset to the first token), at the
// call's frequencies inv_freq [rd / 2].
void TransformRows(const LayerWeights& m, bool is_key, float* x, size_t rows, ptrdiff_t stride,
                   const int32_t* positions, int64_t pos0, const double* inv_freq, float* cos,
                   float* sin) {
  const LayerVariants& v = m.variants;
  const size_t hd = static_cast<size_t>(m.hd);
  const size_t heads = static_cast<size_t>(is_key ? m.KVH : m.H);
  if (!v.q_norm.empty()) {
    const float* w = is_key ? v.k_norm.data() : v.q_norm.data();
    // Whole: one RMS over all of a token's heads (OLMo 2); else one per head (Qwen3, Gemma 3).
    kernels::RmsNormRows(x, rows, stride, v.qk_norm_whole ? 1 : heads,
                         v.qk_norm_whole ? heads * hd : hd, w, v.qk_norm_eps);
  }
  if (v.rope != RopeStyle::kNone) {
    const size_t half = static_cast<size_t>(v.rotary_dim / 2);
    kernels::RopeAngles(positions, pos0, rows, inv_freq, half, cos, sin, v.rope_scaling.attention);
    kernels::ApplyRope(x, rows, stride, heads, hd, static_cast<size_t>(v.rotary_dim),
                       /*interleaved=*/v.rope == RopeStyle::kGptj, cos, sin);
  }
}

// Token block [r0, r0 + kQkBlockRows) of entry n of set s, with one worker's scratch `ws`
// (cos and sin tables and the dynamic frequencies, `table` bytes, then for strided heads a
// dense copy of the block).
void TransformBlock(const LayerWeights& m, const QkRows& s, int64_t n, int64_t r0, size_t table,
                    uint8_t* ws) {
  const ptrdiff_t hd = static_cast<ptrdiff_t>(m.hd);
  const size_t rows = static_cast<size_t>(std::min(kQkBlockRows, s.rows - r0));
  float* cos = reinterpret_cast<float*>(ws);
  float* sin = reinterpret_cast<float*>(ws + (table > 0 ? CosBytes(m) : 0));
  // The call's frequencies: the layer's, or (kDynamic past its original length) computed here,
  // once per task: rd/2 pow() against the block's rows x rd/2 cos and sin.
  const double* inv_freq = nullptr;
  if (table > 0) {
    const LayerVariants& v = m.variants;
    double* buf = reinterpret_cast<double*>(ws + 2 * CosBytes(m));
    inv_freq = RopeCallInvFreq(v.rope_scaling, v.inv_freq, s.rope_len, buf);
  }
  const int32_t* pos =
      s.positions != nullptr ? s.positions + n * s.positions_batch_stride + r0 : nullptr;
  float* x = s.data + n * s.batch_stride + r0 * s.row_stride;
  if (s.head_stride == 0 || s.head_stride == hd) {
    TransformRows(m, s.is_key, x, rows, s.row_stride, pos, s.pos0 + r0, inv_freq, cos, sin);
    return;
  }
  // Heads apart (Project's [N, heads, T, hd]): transform a dense copy of the block's tokens,
  // so the values are those of the forward's buffers bit for bit.
  const int64_t heads = s.is_key ? m.KVH : m.H;
  const ptrdiff_t width = heads * hd;
  float* dense = reinterpret_cast<float*>(ws + table);
  for (size_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(dense + r * width + h * hd, x + r * s.row_stride + h * s.head_stride,
                  hd * sizeof(float));
    }
  }
  TransformRows(m, s.is_key, dense, rows, width, pos, s.pos0 + r0, inv_freq, cos, sin);
  for (size_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(x + r * s.row_stride + h * s.head_stride, dense + r * width + h * hd,
                  hd * sizeof(float));
    }
  }
}

}  // namespace

int64_t RopeCallLength(const LayerWeights& m, const ForwardShapes& sh, const int32_t* q_pos,
                       const int32_t* k_pos) {
  if (!m.variants.rope_scaling.LengthDependent()) return 0;
  if (q_pos == nullptr) return std::max(sh.L, sh.S);
  int32_t top = 0;
  for (int64_t i = 0; i < sh.N * sh.L; ++i) top = std::max(top, q_pos[i]);
  if (k_pos != nullptr) {
    for (int64_t i = 0; i < sh.N * sh.S; ++i) top = std::max(top, k_pos[i]);
  }
  return int64_t{top} + 1;
}

size_t QkTransformScratchBytes(const LayerWeights& m, size_t threads, bool strided_heads) {
  if (!m.variants.qk_transform()) return 0;
  return (TableBytes(m) + (strided_heads ? GatherBytes(m) : 0)) * std::max<size_t>(threads, 1);
}

void RunQkTransform(Context& ctx, const LayerWeights& m, const QkRows* sets, size_t count,
                    uint8_t* scratch) {
  if (!m.variants.qk_transform()) return;
  const ptrdiff_t hd = static_cast<ptrdiff_t>(m.hd);
  bool strided = false;
  uint64_t tasks = 0;
  for (size_t i = 0; i < count; ++i) {
    const QkRows& s = sets[i];
    strided = strided || (s.head_stride != 0 && s.head_stride != hd);
    tasks += static_cast<uint64_t>(s.batches) * ((s.rows + kQkBlockRows - 1) / kQkBlockRows);
  }
  if (tasks == 0) return;
  const size_t table = TableBytes(m);
  const size_t per_worker = table + (strided ? GatherBytes(m) : 0);
  TraceRecorder* trace = TraceOf(ctx);
  PoolOf(ctx).ParallelFor(tasks, [&](uint64_t task, size_t worker) {
    // Traced as part of the projections: it finishes producing q and k.
    const TraceSpan span(trace, worker, Stage::kQkvProjection, -1, -1, static_cast<int64_t>(task));
    // Task -> (set, batch entry, token block), sets in order.
    size_t i = 0;
    uint64_t blocks = 0;
    for (;; ++i) {
      blocks = (sets[i].rows + kQkBlockRows - 1) / kQkBlockRows;
      const uint64_t set_tasks = static_cast<uint64_t>(sets[i].batches) * blocks;
      if (task < set_tasks) break;
      task -= set_tasks;
    }
    const TaskPair nb = SplitTask(task, blocks);  // (entry, row block) of the set
    TransformBlock(m, sets[i], nb.outer, nb.inner * kQkBlockRows, table,
                   scratch + worker * per_worker);
  });
}

namespace {

// The forward's row sets in buf (RunForwardQkTransform): Q unless keys is given, K's real keys
// unless the plan is key-chunked without keys. Returns the count.
size_t ForwardQkSets(const ForwardArgs& args, const ForwardPlan& plan, const ForwardBuffers& buf,
                     const KeyChunk* keys, QkRows sets[2]) {
  const ForwardShapes& sh = args.shapes;
  size_t count = 0;
  if (keys == nullptr) {
    QkRows& q = sets[count++];
    q.data = buf.q;
    q.rows = sh.L;
    q.row_stride = plan.q_layout.token;
    q.batches = sh.N;
    q.batch_stride = plan.q_layout.batch;
    q.positions = buf.q_pos;
    q.positions_batch_stride = sh.L;
    q.rope_len = buf.rope_len;
  }
  if (keys != nullptr || !plan.chunked()) {
    // The real keys only: appended positions (bias_k, zero attention) are not projections.
    const int64_t begin = keys != nullptr ? keys->begin : 0;
    const int64_t end = keys != nullptr ? std::min(keys->end, sh.S) : sh.S;
    QkRows& k = sets[count++];
    k.data = buf.k;
    k.rows = end - begin;
    k.row_stride = plan.kv_layout.token;
    k.is_key = true;
    k.batches = sh.N;
    k.batch_stride = plan.kv_layout.batch;
    k.positions = buf.k_pos != nullptr ? buf.k_pos + begin : nullptr;
    k.positions_batch_stride = sh.S;
    k.pos0 = begin;
    k.rope_len = buf.rope_len;
  }
  return count;
}

}  // namespace

void RunForwardQkTransform(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                           const ForwardPlan& plan, const ForwardBuffers& buf,
                           const KeyChunk* keys) {
  if (!m.variants.qk_transform()) return;
  QkRows sets[2];
  const size_t count = ForwardQkSets(args, plan, buf, keys, sets);
  RunQkTransform(ctx, m, sets, count, buf.qk_scratch);
}

void TransformGroupQk(const LayerWeights& m, const ForwardArgs& args, const ForwardPlan& plan,
                      const ForwardBuffers& group_buf, int64_t n0, size_t count, size_t worker) {
  if (!m.variants.qk_transform()) return;
  QkRows sets[2];
  const size_t num_sets = ForwardQkSets(args, plan, group_buf, nullptr, sets);
  const size_t table = TableBytes(m);
  uint8_t* ws = group_buf.qk_scratch + worker * table;
  for (size_t i = 0; i < num_sets; ++i) {
    QkRows s = sets[i];
    // The group's buffers start at entry n0; positions are the whole batch's.
    if (s.positions != nullptr) s.positions += n0 * s.positions_batch_stride;
    for (int64_t n = 0; n < static_cast<int64_t>(count); ++n) {
      for (int64_t r0 = 0; r0 < s.rows; r0 += kQkBlockRows) TransformBlock(m, s, n, r0, table, ws);
    }
  }
}

void RunProjectQkTransform(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                           const ProjectionOutputs& outputs, const int32_t* q_pos,
                           const int32_t* k_pos, uint8_t* scratch) {
  if (!m.variants.qk_transform()) return;
  const ForwardShapes& sh = args.shapes;
  const int64_t hd = m.hd;
  const int64_t rope_len = RopeCallLength(m, sh, q_pos, k_pos);
  QkRows sets[2];
  const struct {
    float* data;
    int64_t heads, rows, rows_total;
    const int32_t* positions;
  } kinds[2] = {{outputs.q.As<float>(), m.H, sh.L, sh.L, q_pos},
                {outputs.k.As<float>(), m.KVH, sh.S, sh.St, k_pos}};
  for (int i = 0; i < 2; ++i) {
    QkRows& s = sets[i];
    s.data = kinds[i].data;
    s.rows = kinds[i].rows;
    s.row_stride = hd;
    s.is_key = i == 1;
    s.positions = kinds[i].positions;
    s.batches = sh.N;
    s.batch_stride = kinds[i].heads * kinds[i].rows_total * hd;
    s.positions_batch_stride = kinds[i].rows;
    s.head_stride = kinds[i].rows_total * hd;
    s.rope_len = rope_len;
  }
  RunQkTransform(ctx, m, sets, 2, scratch);
}

}  // namespace mha
