// The grouped forward (batch_groups.h).
#include "runtime/batch_groups.h"

#include <algorithm>

#include "runtime/attention_tasks.h"
#include "runtime/context_internal.h"
#include "runtime/masks.h"
#include "runtime/parallel_gemm.h"
#include "runtime/projections.h"
#include "runtime/qk_transform.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"

namespace mha {

void RunBatchGroups(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                    const ForwardPlan& plan, const ForwardBuffers& buf) {
  const ForwardShapes& sh = args.shapes;
  const size_t group = plan.batch_group;
  const uint64_t groups = (sh.N + group - 1) / group;
  const AttentionMasks masks = PrepareMasks(m, args, plan, buf);
  TraceRecorder* const trace = TraceOf(ctx);
  PoolOf(ctx).ParallelFor(groups, [&](uint64_t task, size_t worker) {
    const int64_t n0 = static_cast<int64_t>(task * group);
    const size_t count = std::min<size_t>(group, sh.N - n0);
    // The worker's group buffers: entries [worker x group, (worker + 1) x group) of the plan's.
    const ptrdiff_t first = static_cast<ptrdiff_t>(worker * group);
    ForwardBuffers gb = buf;
    gb.q += first * plan.q_layout.batch;
    gb.k += first * plan.kv_layout.batch;
    gb.v += first * plan.kv_layout.batch;
    gb.concat += first * gb.concat_layout.batch;
    uint8_t* const scratch = buf.scratch + worker * plan.scratch_per_worker;
    {
      const TraceSpan span(trace, worker, Stage::kQkvProjection, n0, -1, -1);
      ProjectGroupInputs(m, args, plan, gb.q, gb.k, gb.v, n0, count, scratch);
      TransformGroupQk(m, args, plan, gb, n0, count, worker);
    }
    RunGroupAttentionTasks(m, args, plan, gb, masks, trace, n0, count, worker);
    const TraceSpan span(trace, worker, Stage::kOutProjection, n0, -1, -1);
    const GemmJob out =
        OutputProjectionJob(m, gb.concat, gb.concat_layout, args.out + n0 * sh.out_layout.batch,
                            sh.out_layout, count, static_cast<size_t>(sh.L));
    MultiplyPrepackedJob(out, scratch);
  });
}

}  // namespace mha
