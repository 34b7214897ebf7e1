#include "runtime/parallel_gemm.h"

#include <algorithm>

#include "kernels/elementwise.h"
#include "kernels/gemv.h"

namespace mha {

namespace {

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// w^T of an [out, in] f32 weight: element (i, o) at w[o * in + i].
kernels::MatrixView WeightT(const WeightMatrix& w, size_t out, size_t in) {
  return {const_cast<float*>(static_cast<const float*>(w.data)), in, out, 1,
          static_cast<ptrdiff_t>(in)};
}

kernels::HalfMatrixView HalfWeightT(const WeightMatrix& w, size_t out, size_t in) {
  return {static_cast<const uint16_t*>(w.data),
          w.dtype == DType::kBF16 ? kernels::HalfType::kBF16 : kernels::HalfType::kF16,
          in,
          out,
          1,
          static_cast<ptrdiff_t>(in)};
}

}  // namespace

void GemmJob::SetWeights(const WeightMatrix& w, size_t out, size_t in) {
  if (w.dtype == DType::kF32) {
    b = WeightT(w, out, in);
    b_half = {};
  } else {
    b = {};
    b_half = HalfWeightT(w, out, in);
  }
}

void GemmWeights(const kernels::MatrixView& a, const WeightMatrix& weights, size_t out,
                 const kernels::MatrixView& c, void* scratch) {
  if (weights.dtype == DType::kF32) {
    kernels::Gemm(1.0f, a, WeightT(weights, out, a.cols), 0.0f, c, scratch);
  } else {
    kernels::GemmHalfB(1.0f, a, HalfWeightT(weights, out, a.cols), 0.0f, c, scratch);
  }
}

PanelShape PanelsOf(const GemmJob& job) {
  if (job.c.rows <= kernels::kGemvMaxRows) return {kPanelRows, kFewRowsPanelCols};
  const uint64_t large_tasks = job.batches * CeilDiv(job.c.rows, kLargePanelRows) *
                               CeilDiv(job.c.cols, kLargePanelCols);
  if (large_tasks >= kMinLargePanelTasks) return {kLargePanelRows, kLargePanelCols};
  return {kPanelRows, kPanelCols};
}

uint64_t NumPanelTasks(const GemmJob& job) {
  const PanelShape p = PanelsOf(job);
  return job.batches * CeilDiv(job.c.rows, p.rows) * CeilDiv(job.c.cols, p.cols);
}

void ParallelGemm(ThreadPool& pool, const GemmJob* jobs, size_t num_jobs, uint8_t* scratch,
                  size_t scratch_stride, TraceRecorder* trace) {
  // Prefix sums of task counts, on the stack: at most a handful of jobs (q, k, v).
  constexpr size_t kMaxJobs = 8;
  uint64_t first_task[kMaxJobs + 1] = {0};
  for (size_t j = 0; j < num_jobs && j < kMaxJobs; ++j) {
    first_task[j + 1] = first_task[j] + NumPanelTasks(jobs[j]);
  }
  const size_t n_jobs = std::min(num_jobs, kMaxJobs);
  pool.ParallelFor(first_task[n_jobs], [&](uint64_t task, size_t worker) {
    size_t j = 0;
    while (task >= first_task[j + 1]) ++j;
    const GemmJob& job = jobs[j];
    uint64_t t = task - first_task[j];
    const PanelShape panel = PanelsOf(job);
    const uint64_t col_panels = CeilDiv(job.c.cols, panel.cols);
    const uint64_t row_panels = CeilDiv(job.c.rows, panel.rows);
    const uint64_t cp = t % col_panels;
    t /= col_panels;
    const uint64_t rp = t % row_panels;
    const uint64_t batch = t / row_panels;
    const size_t r0 = rp * panel.rows, c0 = cp * panel.cols;
    const size_t nr = std::min(panel.rows, job.c.rows - r0);
    const size_t nc = std::min(panel.cols, job.c.cols - c0);
    const TraceSpan span(trace, worker, job.stage, static_cast<int64_t>(batch), -1,
                         static_cast<int64_t>(task));

    kernels::MatrixView a = job.a;
    a.data += static_cast<ptrdiff_t>(batch) * job.a_batch_stride;
    kernels::MatrixView c = job.c;
    c.data += static_cast<ptrdiff_t>(batch) * job.c_batch_stride;
    const kernels::MatrixView c_blk = c.Block(r0, c0, nr, nc);
    uint8_t* const own_scratch = scratch + worker * scratch_stride;
    if (job.b_half.data != nullptr) {
      kernels::GemmHalfB(1.0f, a.Block(r0, 0, nr, a.cols),
                         job.b_half.Block(0, c0, job.b_half.rows, nc), 0.0f, c_blk, own_scratch);
    } else {
      kernels::Gemm(1.0f, a.Block(r0, 0, nr, a.cols), job.b.Block(0, c0, job.b.rows, nc), 0.0f,
                    c_blk, own_scratch);
    }
    if (job.bias != nullptr) {
      kernels::AddBiasRows(c_blk.data, nr, nc, c_blk.row_stride, job.bias + c0);
    }
  });
}

}  // namespace mha
