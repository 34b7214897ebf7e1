// The key-chunked path of the forward (key_chunks.h).
#include "runtime/key_chunks.h"

#include <algorithm>
#include <cstring>

#include "kernels/softmax.h"
#include "runtime/attention_tasks.h"
#include "runtime/context_internal.h"
#include "runtime/qk_transform.h"
#include "runtime/task_grid.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"

namespace mha {

using kernels::MatrixView;

void RunKeyChunks(Context& ctx, const LayerWeights& m, const ForwardArgs& args,
                  const ForwardPlan& ws, const ForwardBuffers& buf, KvSinkFn sink, void* user) {
  const ForwardShapes& sh = args.shapes;
  const int64_t E = m.E, H = m.H, hd = m.hd;
  // Key chunks of chunk_keys real keys; the last one also takes the appended positions [S, S').
  // Each chunk runs only the query blocks whose keys (causal limit, a window's band) meet it;
  // a block's softmax state starts in the chunk holding its first visible key (attention_tasks.cc).
  for (int64_t k0 = 0; k0 < sh.S; k0 += ws.chunk_keys) {
    const bool last = k0 + ws.chunk_keys >= sh.S;
    KeyChunk keys;
    keys.begin = k0;
    keys.first = k0 == 0;
    keys.end = last ? sh.St : k0 + ws.chunk_keys;
    RunInputProjections(ctx, m, args, ws, buf, &keys);
    RunForwardQkTransform(ctx, m, args, ws, buf, &keys);
    SinkProjectedKv(ctx, ws, buf, keys.begin, std::min(keys.end, sh.S), sink, user);
    RunAttentionTasks(ctx, m, args, ws, buf, keys);
  }

  // Output projection, kOutRows rows of one batch per task: the rows' running sums (in the
  // output rows themselves, or in concat) are copied to the worker's scratch [rows, E] and
  // normalized there by the row sums of each head (OnlineSoftmaxFinish), then out rows = scratch
  // x W_o^T + b_o. Every task reads and writes only its own rows, so the tasks are independent.
  const int64_t N = sh.N, L = sh.L;
  const int64_t blocks = (L + kOutRows - 1) / kOutRows;
  const float* row_sum = buf.row_sum;
  TraceRecorder* trace = TraceOf(ctx);
  const kernels::Bf16Kernel bf16_kernel = Bf16KernelOf(ctx);
  PoolOf(ctx).ParallelFor(N * blocks, [&](uint64_t task, size_t worker) {
    const TaskPair nb = SplitTask(task, blocks);  // (entry, row block)
    const int64_t n = nb.outer;
    const TraceSpan span(trace, worker, Stage::kOutProjection, n, -1, static_cast<int64_t>(task));
    const int64_t r0 = nb.inner * kOutRows;
    const size_t rows = std::min<int64_t>(kOutRows, L - r0);
    uint8_t* gemm_scratch = buf.scratch + worker * ws.scratch_per_worker;
    float* a = reinterpret_cast<float*>(gemm_scratch + ws.gemm_scratch);
    float* out = args.out + n * sh.out_layout.batch + r0 * sh.out_layout.token;
    // The running sums: in the output rows themselves or in concat (ForwardBuffers::concat).
    const float* acc = buf.concat + n * buf.concat_layout.batch + r0 * buf.concat_layout.token;
    const ptrdiff_t acc_stride = buf.concat_layout.token;
    for (size_t r = 0; r < rows; ++r) {
      std::memcpy(a + r * E, acc + r * acc_stride, E * sizeof(float));
    }
    for (int64_t h = 0; h < H; ++h) {
      kernels::OnlineSoftmaxFinish(a + h * hd, rows, hd, E, row_sum + (n * H + h) * L + r0);
    }
    const MatrixView c{out, rows, static_cast<size_t>(m.D), sh.out_layout.token, 1};
    MultiplyWeights(MatrixView{a, rows, static_cast<size_t>(E), E, 1}, m.w_o,
                    static_cast<size_t>(m.D), m.b_o, c, gemm_scratch, bf16_kernel);
  });
}

}  // namespace mha
