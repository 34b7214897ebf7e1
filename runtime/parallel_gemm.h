// Partitioned GEMM on the thread pool: a large product (the projections, [tokens x in] x
// [in x out]) is split into fixed panels of rows and columns, each computed by one single-threaded
// BLIS call, with the bias add fused right after each panel while it is still in cache.
//
// The partition depends only on the shapes (never on the thread count), so results are bitwise
// identical for any number of threads.
#ifndef MHA_RUNTIME_PARALLEL_GEMM_H_
#define MHA_RUNTIME_PARALLEL_GEMM_H_

#include <cstddef>
#include <cstdint>

#include "kernels/gemm.h"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"

namespace mha {

// Panel sizes: rows x columns of C per task. 128 x 256 f32 keeps a panel of C (128 KiB) plus the
// packed A and B blocks within a 1-2 MiB L2, and gives enough tasks to balance 2-8 threads at
// attention shapes.
inline constexpr size_t kPanelRows = 128;
inline constexpr size_t kPanelCols = 256;

// One product c = a * b (+ bias per column), repeated over `batches` with element offsets
// a_batch_stride / c_batch_stride between batches (b and bias are shared).
struct GemmJob {
  kernels::MatrixView a;  // [m, k] for batch 0
  kernels::MatrixView b;  // [k, n]
  kernels::MatrixView c;  // [m, n] for batch 0, col_stride must be 1 when bias is set
  const float* bias = nullptr;  // [n] or null
  size_t batches = 1;
  ptrdiff_t a_batch_stride = 0;
  ptrdiff_t c_batch_stride = 0;
  Stage stage = Stage::kQkvProjection;  // for the trace
};

// Runs every job (all panels of all jobs form one flat task range) on the pool. `scratch` holds
// one GEMM packing buffer per worker: worker w uses scratch + w * scratch_stride
// (kernels::GemmScratchBytes() bytes each, 64-byte aligned).
void ParallelGemm(ThreadPool& pool, const GemmJob* jobs, size_t num_jobs, uint8_t* scratch,
                  size_t scratch_stride, TraceRecorder* trace = nullptr);

// Number of panel tasks ParallelGemm creates for one job.
uint64_t NumPanelTasks(const GemmJob& job);

}  // namespace mha

#endif  // MHA_RUNTIME_PARALLEL_GEMM_H_
