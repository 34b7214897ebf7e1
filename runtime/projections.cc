// Projections of the attention layer (projections.h).
#include "runtime/projections.h"

#include <algorithm>
#include <cstring>

#include "runtime/context_internal.h"
#include "runtime/task_grid.h"
#include "runtime/thread_pool.h"

namespace mha {

using kernels::ConstMatrixView;
using kernels::MatrixView;

GemmJob ProjectionJob(const SeqShape& x, const float* x_data, size_t N, const WeightMatrix& w,
                      const float* bias, size_t out_cols, float* dst, TokenLayout dst_layout,
                      ptrdiff_t ld) {
  GemmJob job;
  job.SetWeights(w, out_cols, x.features);
  job.bias = bias;
  const int64_t n = static_cast<int64_t>(N);
  if (x.layout.SequenceMajor(n) && dst_layout.SequenceMajor(n)) {
    job.a = {x_data, x.tokens * N, static_cast<size_t>(x.features), x.layout.batch, 1};
    job.c = {dst, x.tokens * N, out_cols, ld, 1};
  } else if (x.layout.BatchMajor(n, x.tokens) && dst_layout.BatchMajor(n, x.tokens)) {
    job.a = {x_data, x.tokens * N, static_cast<size_t>(x.features), x.layout.token, 1};
    job.c = {dst, x.tokens * N, out_cols, dst_layout.token, 1};
  } else {
    job.a = {x_data, static_cast<size_t>(x.tokens), static_cast<size_t>(x.features), x.layout.token,
             1};
    job.c = {dst, static_cast<size_t>(x.tokens), out_cols, dst_layout.token, 1};
    job.batches = N;
    job.a_batch_stride = x.layout.batch;
    job.c_batch_stride = dst_layout.batch;
  }
  return job;
}

void RunInputProjections(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                         const ForwardPlan& ws, const ForwardBuffers& buf, const KeyChunk* keys) {
  const ForwardShapes& sh = args.shapes;
  const int64_t E = m.E, kvE = m.kvE, qd = m.qd;
  const size_t N = sh.N;
  float* k_buf = buf.k;
  float* v_buf = buf.v;
  GemmJob jobs[3];
  size_t num_jobs = 0;
  // Buffer row of the first appended key/value position, when this call writes them.
  int64_t pos = ws.chunked() ? -1 : sh.S;
  if (ws.fused) {
    jobs[num_jobs++] = ProjectionJob(sh.q, args.q, N, m.w_packed, m.b_packed, E + 2 * kvE, buf.q,
                                     ws.q_layout, ws.q_ld);
    if (UsesPrepacked(m.w_q, jobs[0].c.rows, qd, E) && m.w_packed.bf16.data == nullptr) {
      // Prepacked weights are packed per matrix (unless packed whole as bf16): three products
      // into the buffer's columns.
      jobs[0] = ProjectionJob(sh.q, args.q, N, m.w_q, m.b_q, E, buf.q, ws.q_layout, ws.q_ld);
      jobs[num_jobs++] =
          ProjectionJob(sh.q, args.q, N, m.w_k, m.b_k, kvE, buf.k, ws.q_layout, ws.q_ld);
      jobs[num_jobs++] =
          ProjectionJob(sh.q, args.q, N, m.w_v, m.b_v, kvE, buf.v, ws.q_layout, ws.q_ld);
    }
  } else if (keys == nullptr) {
    jobs[num_jobs++] = ProjectionJob(sh.q, args.q, N, m.w_q, m.b_q, E, buf.q, ws.q_layout, ws.q_ld);
  }
  if (!ws.fused && (!ws.chunked() || keys != nullptr)) {
    // Key-chunked: the key chunk's real keys [begin, min(end, S)) into buffer rows from 0.
    SeqShape k = sh.k, v = sh.v;
    const float* k_data = args.k;
    const float* v_data = args.v;
    if (keys != nullptr) {
      k.tokens = v.tokens = std::min(keys->end, sh.S) - keys->begin;
      k_data += keys->begin * k.layout.token;
      v_data += keys->begin * v.layout.token;
      if (keys->end > sh.S) pos = sh.S - keys->begin;
    }
    jobs[num_jobs++] =
        ProjectionJob(k, k_data, N, m.w_k, m.b_k, kvE, k_buf, ws.kv_layout, ws.kv_ld);
    jobs[num_jobs++] =
        ProjectionJob(v, v_data, N, m.w_v, m.b_v, kvE, v_buf, ws.kv_layout, ws.kv_ld);
  }
  ParallelGemm(PoolOf(ctx), jobs, num_jobs, buf.scratch, ws.scratch_per_worker, Bf16KernelOf(ctx),
               TraceOf(ctx), buf.packed_w, ws.packed_w_bytes);
  if (pos >= 0) AppendKeyValuePositions(m, k_buf, v_buf, ws.kv_layout, N, pos);
}

void AppendKeyValuePositions(const LayerWeights& m, float* k_buf, float* v_buf,
                             const TokenLayout& layout, size_t N, int64_t pos) {
  const int64_t kvE = m.kvE;
  for (size_t n = 0; n < N; ++n) {
    int64_t p = pos;
    if (m.config.add_bias_kv) {
      std::memcpy(k_buf + n * layout.batch + p * layout.token, m.bias_k, kvE * sizeof(float));
      std::memcpy(v_buf + n * layout.batch + p * layout.token, m.bias_v, kvE * sizeof(float));
      ++p;
    }
    if (m.config.add_zero_attn) {
      std::memset(k_buf + n * layout.batch + p * layout.token, 0, kvE * sizeof(float));
      std::memset(v_buf + n * layout.batch + p * layout.token, 0, kvE * sizeof(float));
    }
  }
}

void ProjectGroupInputs(const LayerWeights& m, const ForwardArgs& args, const ForwardPlan& plan,
                        float* q, float* k, float* v, int64_t n0, size_t count, void* scratch) {
  const ForwardShapes& sh = args.shapes;
  const GemmJob jobs[3] = {ProjectionJob(sh.q, args.q + n0 * sh.q.layout.batch, count, m.w_q, m.b_q,
                                         m.E, q, plan.q_layout, plan.q_ld),
                           ProjectionJob(sh.k, args.k + n0 * sh.k.layout.batch, count, m.w_k, m.b_k,
                                         m.kvE, k, plan.kv_layout, plan.kv_ld),
                           ProjectionJob(sh.v, args.v + n0 * sh.v.layout.batch, count, m.w_v, m.b_v,
                                         m.kvE, v, plan.kv_layout, plan.kv_ld)};
  for (const GemmJob& job : jobs) MultiplyPrepackedJob(job, scratch);
  AppendKeyValuePositions(m, k, v, plan.kv_layout, count, sh.S);
}

GemmJob OutputProjectionJob(const LayerWeights& m, const float* concat_in,
                            TokenLayout concat_layout, float* out, TokenLayout out_layout, size_t N,
                            size_t L) {
  const float* concat = concat_in;
  GemmJob job;
  job.SetWeights(m.w_o, m.D, m.E);
  job.bias = m.b_o;
  job.stage = Stage::kOutProjection;
  // The N entries' rows as one matrix when concat and out order them alike.
  const int64_t n = static_cast<int64_t>(N), l = static_cast<int64_t>(L);
  if (concat_layout.SequenceMajor(n) && out_layout.SequenceMajor(n)) {
    job.a = {concat, N * L, static_cast<size_t>(m.E), concat_layout.batch, 1};
    job.c = {out, N * L, static_cast<size_t>(m.D), out_layout.batch, 1};
  } else if (concat_layout.BatchMajor(n, l) && out_layout.BatchMajor(n, l)) {
    job.a = {concat, N * L, static_cast<size_t>(m.E), concat_layout.token, 1};
    job.c = {out, N * L, static_cast<size_t>(m.D), out_layout.token, 1};
  } else {
    job.a = {concat, L, static_cast<size_t>(m.E), concat_layout.token, 1};
    job.c = {out, L, static_cast<size_t>(m.D), out_layout.token, 1};
    job.batches = N;
    job.a_batch_stride = concat_layout.batch;
    job.c_batch_stride = out_layout.batch;
  }
  return job;
}

void RunHeadProjections(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                        const ProjectionOutputs& outputs, uint8_t* scratch, size_t scratch_stride) {
  const ForwardShapes& sh = args.shapes;
  const int64_t N = sh.N, hd = m.hd;
  const int64_t heads[3] = {m.H, m.KVH, m.KVH};
  const SeqShape* xs[3] = {&sh.q, &sh.k, &sh.v};
  const float* x_data[3] = {args.q, args.k, args.v};
  const WeightMatrix ws[3] = {m.w_q, m.w_k, m.w_v};
  const float* bs[3] = {m.b_q, m.b_k, m.b_v};
  float* outs[3] = {outputs.q.As<float>(), outputs.k.As<float>(), outputs.v.As<float>()};
  const int64_t rows_out[3] = {sh.L, sh.St, sh.St};
  const uint64_t per_kind = static_cast<uint64_t>(N) * m.H;  // upper bound over kinds
  const kernels::Bf16Kernel bf16_kernel = Bf16KernelOf(ctx);
  PoolOf(ctx).ParallelFor(3 * per_kind, [&](uint64_t task, size_t worker) {
    const TaskTriple knh = SplitTask(task, N, m.H);  // (q/k/v, entry, head)
    const int kind = static_cast<int>(knh.i0);
    const int64_t n = knh.i1, h = knh.i2;
    if (h >= heads[kind]) return;
    const SeqShape& x = *xs[kind];
    float* dst = outs[kind] + ((n * heads[kind] + h) * rows_out[kind]) * hd;
    const ConstMatrixView a{x_data[kind] + n * x.layout.batch, static_cast<size_t>(x.tokens),
                            static_cast<size_t>(x.features), x.layout.token, 1};
    const MatrixView c{dst, static_cast<size_t>(x.tokens), static_cast<size_t>(hd),
                       static_cast<ptrdiff_t>(hd), 1};
    MultiplyWeights(a, ws[kind].Rows(h * hd, x.features), static_cast<size_t>(hd),
                    bs[kind] != nullptr ? bs[kind] + h * hd : nullptr, c,
                    scratch + worker * scratch_stride, bf16_kernel);
    if (kind > 0) {
      int64_t p = sh.S;
      const float* extra = kind == 1 ? m.bias_k : m.bias_v;
      if (m.config.add_bias_kv) {
        std::memcpy(dst + p * hd, extra + h * hd, hd * sizeof(float));
        ++p;
      }
      if (m.config.add_zero_attn) std::memset(dst + p * hd, 0, hd * sizeof(float));
    }
  });
}

void SinkProjectedKv(Context& ctx, const ForwardPlan& plan, const ForwardBuffers& buf,
                     int64_t begin, int64_t end, KvSinkFn sink, void* user) {
  if (sink == nullptr) return;
  sink(user, ctx,
       ProjectedKv{buf.k, buf.v, plan.kv_layout.batch, plan.kv_layout.token, begin, end});
}

}  // namespace mha
