// The run of a KV-cache call (decode_step.h): projections, QK transform, stores, attention over
// the cache, output projection; or a prompt's forward.
#include "runtime/decode_step.h"

#include <algorithm>
#include <cstring>

#include "runtime/attention_impl.h"
#include "runtime/cache_attention.h"
#include "runtime/context_internal.h"
#include "runtime/forward_plan.h"
#include "runtime/parallel_gemm.h"
#include "runtime/projections.h"
#include "runtime/qk_transform.h"

namespace mha {

namespace {

// The token layout under which ProjectionJob and OutputProjectionJob (projections.h) make of a
// batch-first [N, T, ...] tensor with these strides the products the cache needs: one over all
// N * T rows when the tokens are evenly spaced (one token per entry: the entries' rows, which the
// sequence-major layout {batch, N * batch} says), else one per entry.
TokenLayout CacheLayout(int64_t N, int64_t T, ptrdiff_t batch_stride, ptrdiff_t token_stride) {
  if (T == 1) return {batch_stride, static_cast<ptrdiff_t>(N) * batch_stride};
  return {batch_stride, token_stride};
}

// x [N, T, in] times W^T [in, out] + bias into dense dst [N*T, out].
GemmJob CacheProjectionJob(const BatchFirstSeq& x, int64_t N, int64_t in, const WeightMatrix& w,
                           const float* bias, int64_t out, float* dst) {
  const SeqShape shape{x.tokens, in, CacheLayout(N, x.tokens, x.batch_stride, x.token_stride)};
  const ptrdiff_t ld = static_cast<ptrdiff_t>(out);
  return ProjectionJob(shape, x.data, static_cast<size_t>(N), w, bias, static_cast<size_t>(out),
                       dst, CacheLayout(N, x.tokens, x.tokens * ld, ld), ld);
}

// The workspace's buffers (StepPlan's offsets bound to base).
struct StepBuffers {
  float* q;       // [N*T, E]
  float* k;       // [N*T, kvE]
  float* v;       // [N*T, kvE]
  float* concat;  // [N*T, E]
  uint8_t* scratch;
};

StepBuffers BindStepPlan(const StepPlan& plan, uint8_t* base) {
  return {reinterpret_cast<float*>(base + plan.q), reinterpret_cast<float*>(base + plan.k),
          reinterpret_cast<float*>(base + plan.v), reinterpret_cast<float*>(base + plan.concat),
          base + plan.scratch};
}

// 1. Q (forward) and the new K, V (append) of every token, in one ParallelGemm.
void ProjectStepInputs(Context& ctx, const LayerWeights& m, const CacheCallArgs& a,
                       const StepPlan& plan, const StepBuffers& buf, int64_t N) {
  GemmJob jobs[3];
  size_t num_jobs = 0;
  if (a.forward) jobs[num_jobs++] = CacheProjectionJob(a.q, N, m.qd, m.w_q, m.b_q, m.E, buf.q);
  if (a.append) {
    jobs[num_jobs++] = CacheProjectionJob(a.k, N, m.kd, m.w_k, m.b_k, m.kvE, buf.k);
    jobs[num_jobs++] = CacheProjectionJob(a.v, N, m.vd, m.w_v, m.b_v, m.kvE, buf.v);
  }
  ParallelGemm(PoolOf(ctx), jobs, num_jobs, buf.scratch, plan.per_worker, Bf16KernelOf(ctx),
               TraceOf(ctx));
}

// 1. QK-norm and RoPE on Q and the new K at their positions (padding rows: any valid position);
// the step's length for RoPE scaling (rope_scaling.h) is its largest real position + 1, the
// longest entry's length after the append (padding rows and empty entries left out).
void TransformStepRows(Context& ctx, const LayerWeights& m, const CacheCallArgs& a,
                       const StepPlan& plan, const StepBuffers& buf, const int64_t* lengths,
                       const int64_t* ends, int64_t N, uint8_t* base) {
  if (!m.variants.qk_transform()) return;
  const int64_t T = a.T;
  int32_t* q_pos = reinterpret_cast<int32_t*>(base + plan.q_pos);
  int32_t* k_pos = reinterpret_cast<int32_t*>(base + plan.k_pos);
  int64_t rope_len = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t c = a.Count(n);
    const int64_t q_first = ends[n] - c;
    if (c > 0) rope_len = std::max(rope_len, q_first + c);
    FillPositionRun(lengths[n], c, T, k_pos + n * T);
    FillPositionRun(q_first, c, T, q_pos + n * T);
  }
  QkRows sets[2];
  size_t num_sets = 0;
  if (a.forward) sets[num_sets++] = {buf.q, N * T, static_cast<ptrdiff_t>(m.E), false, q_pos, 0};
  if (a.append) sets[num_sets++] = {buf.k, N * T, static_cast<ptrdiff_t>(m.kvE), true, k_pos, 0};
  for (size_t i = 0; i < num_sets; ++i) sets[i].rope_len = rope_len;
  RunQkTransform(ctx, m, sets, num_sets, base + plan.qk_scratch);
}

// 4. The output projection of the attention results into the caller's output, then its
// padding rows (tokens past count_n) to 0.
void ProjectStepOutput(Context& ctx, const LayerWeights& m, const CacheCallArgs& a,
                       const StepPlan& plan, const StepBuffers& buf, int64_t N) {
  const int64_t T = a.T, E = m.E;
  const BatchFirstSeq& out = a.out;
  const GemmJob job = OutputProjectionJob(m, buf.concat, CacheLayout(N, T, T * E, E), out.data,
                                          CacheLayout(N, T, out.batch_stride, out.token_stride),
                                          static_cast<size_t>(N), static_cast<size_t>(T));
  ParallelGemm(PoolOf(ctx), &job, 1, buf.scratch, plan.per_worker, Bf16KernelOf(ctx), TraceOf(ctx));
  if (a.counts == nullptr) return;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = a.counts[n]; i < T; ++i) {
      std::memset(out.data + n * out.batch_stride + i * out.token_stride, 0, m.D * sizeof(float));
    }
  }
}

// The forward of a prompt x [N, T, F] (batch-first, as the cache takes it) as the layer reads
// it: [N, T, F] or [T, N, F] views of the same memory.
Status PromptView(const MultiheadAttention& layer, const TensorView& x, int64_t N, int64_t T,
                  TensorView* view) {
  const int64_t F = x.shape[2];
  if (layer.config().batch_first) {
    const int64_t shape[3] = {N, T, F}, strides[3] = {x.strides[0], x.strides[1], 1};
    return TensorView::Strided(x.data, DType::kF32, 3, shape, strides, view);
  }
  const int64_t shape[3] = {T, N, F}, strides[3] = {x.strides[1], x.strides[0], 1};
  return TensorView::Strided(x.data, DType::kF32, 3, shape, strides, view);
}

}  // namespace

void RunDecodeStep(Context& ctx, const LayerWeights& m, const CacheStorage& cache,
                   const int64_t* lengths, const int64_t* ends, const CacheCallArgs& args,
                   const StepPlan& plan, uint8_t* base) {
  const int64_t N = args.N;
  const StepBuffers buf = BindStepPlan(plan, base);
  ProjectStepInputs(ctx, m, args, plan, buf, N);
  TransformStepRows(ctx, m, args, plan, buf, lengths, ends, N, base);
  if (args.append) {
    const ProjectedKv kv{buf.k, buf.v, args.T * m.kvE, m.kvE, 0, args.T};
    StoreCacheTokens(PoolOf(ctx), cache, N, lengths, kv, args.counts, /*keep_from=*/0);
  }
  if (!args.forward) return;
  RunCacheAttention(PoolOf(ctx), TraceOf(ctx), m, cache, ends, N, args.T, args.counts, plan, base);
  ProjectStepOutput(ctx, m, args, plan, buf, N);
}

Status RunPromptForward(Context& ctx, const MultiheadAttention& layer, const CacheStorage& cache,
                        int64_t N, const TensorView& x, const TensorView& output, int64_t T) {
  AttentionInputs in;
  AttentionOutputs out;
  Status s = PromptView(layer, x, N, T, &in.query);
  if (s.ok()) s = PromptView(layer, output, N, T, &out.output);
  if (!s.ok()) return s;
  in.causal = true;
  // The keys of positions [begin, end) go to positions begin + t of every entry, in tasks over
  // (entry, kv head), as the forward hands them over (every length is 0 here).
  struct Sink {
    const CacheStorage* cache;
    int64_t N;
    int64_t keep_from;
  } sink{&cache, N, cache.ring ? T - cache.capacity : 0};
  auto store = [](void* user, Context& c, const ProjectedKv& kv) {
    const Sink& d = *static_cast<const Sink*>(user);
    StoreCacheTokens(PoolOf(c), *d.cache, d.N, /*lengths=*/nullptr, kv, nullptr, d.keep_from);
  };
  return ForwardWithKvSink(layer, ctx, in, out, store, &sink);
}

}  // namespace mha
