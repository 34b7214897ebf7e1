#include "runtime/parallel_gemm.h"

#include <algorithm>
#include <cassert>

#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "kernels/gemm_bf16_quant.h"
#include "kernels/gemm_direct.h"
#include "kernels/gemv_int8.h"
#include "runtime/task_grid.h"

namespace mha {

namespace {

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Whether a product of `rows` rows by w multiplies in bf16 (kernels::GemmBf16QuantB).
bool QuantBf16Rows(const kernels::QuantMatrix& w, size_t rows) {
  return !w.empty() && w.bf16_products && rows > kernels::kGemvMaxRows;
}

// c = a * w^T (+ bias) with bf16 products, a's rows in groups of `group_rows` (>= 1) packed
// transposed at the offset QuantBf16PackingOffset(group_rows) of the scratch.
void MultiplyQuantBf16(const kernels::ConstMatrixView& a, const kernels::QuantMatrix& w,
                       const float* bias, const kernels::MatrixView& c, uint8_t* scratch,
                       size_t group_rows, kernels::Bf16Kernel bf16_kernel) {
  uint16_t* packed = reinterpret_cast<uint16_t*>(scratch + QuantBf16PackingOffset(group_rows));
  for (size_t i0 = 0; i0 < a.rows; i0 += group_rows) {
    const size_t rows = std::min(group_rows, a.rows - i0);
    const kernels::PackedBf16B at =
        kernels::PackBf16Transposed(bf16_kernel, a.Block(i0, 0, rows, a.cols), packed);
    kernels::GemmBf16QuantB(bf16_kernel, at, w, bias, c.Block(i0, 0, rows, c.cols), scratch);
  }
}

// w^T of an [out, in] f32 weight: element (i, o) at w[o * in + i].
kernels::ConstMatrixView WeightT(const WeightMatrix& w, size_t out, size_t in) {
  return {static_cast<const float*>(w.data), in, out, 1, static_cast<ptrdiff_t>(in)};
}

kernels::HalfMatrixView HalfWeightT(const WeightMatrix& w, size_t out, size_t in) {
  return {static_cast<const uint16_t*>(w.data), w.dtype, in, out, 1, static_cast<ptrdiff_t>(in)};
}

}  // namespace

size_t QuantBf16PackingOffset(size_t group_rows) {
  return kernels::GemmBf16QuantScratchBytes(group_rows);
}

size_t QuantBf16GroupRows(size_t k, size_t scratch_bytes) {
  for (size_t g = kQuantBf16MaxGroupRows; g >= kernels::kBf16PanelCols;
       g -= kernels::kBf16PanelCols) {
    const size_t bytes =
        QuantBf16PackingOffset(g) + kernels::PackedBf16Elements(k, g) * sizeof(uint16_t);
    if (bytes <= scratch_bytes) return g;
  }
  return 0;
}

void GemmJob::SetWeights(const WeightMatrix& w, size_t out, size_t in) {
  b_bf16 = Bf16Of(w, in, out);
  b_packed = PackingOf(w, in, out);
  b_strassen = b_packed.data != nullptr ? StrassenOf(w, in, out) : kernels::StrassenPackedB{};
  b_quant = w.quant.empty() ? kernels::QuantMatrix{} : w.quant.Rows(0, out);
  if (!w.quant.empty()) {
    b = {};
    b_half = {};
  } else if (w.dtype == DType::kF32) {
    b = WeightT(w, out, in);
    b_half = {};
  } else {
    b = {};
    b_half = HalfWeightT(w, out, in);
  }
}

namespace {

// c += bias on every row (c.col_stride 1), if bias is not null.
void AddBias(const kernels::MatrixView& c, const float* bias) {
  if (bias == nullptr) return;
  assert(c.col_stride == 1 && "bias needs unit column stride");
  kernels::AddBiasToRows(bias, c.data, c.rows, c.cols, c.row_stride);
}

}  // namespace

void MultiplyPackedB(kernels::GemmRoute route, const kernels::ConstMatrixView& a,
                     const kernels::PackedB& b, const float* bias, const kernels::MatrixView& c,
                     void* scratch) {
  assert(
      (route == kernels::GemmRoute::kDirectPackedB || route == kernels::GemmRoute::kBlisPackedB) &&
      "MultiplyPackedB: a route over a packed b");
  if (route == kernels::GemmRoute::kDirectPackedB &&
      kernels::GemmDirectPackedB(1.0f, a, b, 0.0f, bias, c)) {
    return;
  }
  kernels::GemmBlisPackedB(1.0f, a, b, 0.0f, c, scratch);
  AddBias(c, bias);
}

kernels::GemmRoute WeightsRoute(const WeightMatrix& weights, size_t rows, size_t in, size_t out) {
  const bool packed = PackingOf(weights, in, out).data != nullptr;
  const bool bf16 = Bf16Of(weights, in, out).data != nullptr;
  return kernels::ChooseGemmRoute({rows, out, in, weights.dtype,
                                   bf16     ? kernels::BPacking::kBf16
                                   : packed ? kernels::BPacking::kPrepacked
                                            : kernels::BPacking::kNone});
}

namespace {

bool OverPackedB(kernels::GemmRoute route) {
  return route == kernels::GemmRoute::kDirectPackedB || route == kernels::GemmRoute::kBlisPackedB;
}

}  // namespace

bool UsesPrepacked(const WeightMatrix& weights, size_t rows, size_t in, size_t out) {
  const kernels::GemmRoute route = WeightsRoute(weights, rows, in, out);
  return OverPackedB(route) || route == kernels::GemmRoute::kBf16PackedB;
}

void MultiplyWeights(const kernels::ConstMatrixView& a, const WeightMatrix& weights, size_t out,
                     const float* bias, const kernels::MatrixView& c, void* scratch,
                     kernels::Bf16Kernel bf16_kernel) {
  const kernels::GemmRoute route = WeightsRoute(weights, a.rows, a.cols, out);
  if (route == kernels::GemmRoute::kBf16PackedB) {
    kernels::GemmBf16PackedB(bf16_kernel, 1.0f, a, Bf16Of(weights, a.cols, out), 0.0f, bias, c,
                             scratch);
    return;
  }
  if (OverPackedB(route)) {
    MultiplyPackedB(route, a, PackingOf(weights, a.cols, out), bias, c, scratch);
    return;
  }
  if (QuantBf16Rows(weights.quant, a.rows)) {
    const size_t group = QuantBf16GroupRows(a.cols, WorkerGemmScratchBytes());
    MHA_CHECK(group > 0, "MultiplyWeights: the layer's inputs fit a bf16 group (checked at creation)");
    MultiplyQuantBf16(a, weights.quant.Rows(0, out), bias, c, static_cast<uint8_t*>(scratch), group,
                      bf16_kernel);
    return;
  }
  if (!weights.quant.empty()) {
    kernels::GemmQuantB(a, weights.quant.Rows(0, out), c, scratch);
    AddBias(c, bias);
    return;
  }
  assert(weights.data != nullptr && "MultiplyWeights: a released copy has a packing for this");
  if (weights.dtype == DType::kF32) {
    kernels::Gemm(1.0f, a, WeightT(weights, out, a.cols), 0.0f, c, scratch);
  } else {
    kernels::GemmHalfB(1.0f, a, HalfWeightT(weights, out, a.cols), 0.0f, c, scratch);
  }
  AddBias(c, bias);
}

namespace {

// The route of `job`'s product over prepacked f32 weights (one batch's shape).
kernels::GemmRoute PrepackedRouteOf(const GemmJob& job) {
  return kernels::ChooseGemmRoute(
      {job.c.rows, job.c.cols, job.a.cols, DType::kF32, kernels::BPacking::kPrepacked});
}

}  // namespace

void MultiplyPrepackedJob(const GemmJob& job, void* scratch) {
  const kernels::GemmRoute route = PrepackedRouteOf(job);
  assert(job.b_packed.data != nullptr && OverPackedB(route) &&
         "MultiplyPrepackedJob: a product over prepacked weights");
  for (size_t batch = 0; batch < job.batches; ++batch) {
    MultiplyPackedB(route, job.BatchA(batch), job.b_packed, job.bias, job.BatchC(batch), scratch);
  }
}

PanelShape PanelsOf(const GemmJob& job) {
  if (job.c.rows <= kernels::kGemvMaxRows) {
    return {kPanelRows, job.b_quant.int8_activations ? kInt8FewRowsPanelCols : kFewRowsPanelCols};
  }
  const uint64_t large_tasks = job.batches * CeilDiv(job.c.rows, kLargePanelRows) *
                               CeilDiv(job.c.cols, kLargePanelCols);
  if (large_tasks >= kMinLargePanelTasks) return {kLargePanelRows, kLargePanelCols};
  return {kPanelRows, kPanelCols};
}

namespace {

// Tasks of `job` split into `panel`-sized pieces of C (batch x row panels x column panels).
uint64_t PanelTasks(const GemmJob& job, const PanelShape& panel) {
  return job.batches * RowPanels(job.c.rows, panel) * CeilDiv(job.c.cols, panel.cols);
}

}  // namespace

uint64_t RowPanels(size_t rows, const PanelShape& panel) {
  if (!panel.balanced || rows == 0) return CeilDiv(rows, panel.rows);
  return std::max<uint64_t>(1, (rows + panel.rows / 2) / panel.rows);
}

size_t RowPanelStart(size_t rows, const PanelShape& panel, uint64_t rp) {
  if (!panel.balanced) return std::min<size_t>(rp * panel.rows, rows);
  // Panel rp starts after rp / count of the product's MR-row tiles.
  const size_t mr = kernels::GemmBlocking().mr;
  const uint64_t tiles = CeilDiv(rows, mr);
  return std::min<size_t>(rp * tiles / RowPanels(rows, panel) * mr, rows);
}

PanelShape Bf16PanelsOf(const GemmJob& job) {
  PanelShape panel{kBf16PanelRows, job.c.cols};
  for (size_t w : {size_t{1024}, size_t{512}, size_t{256}, size_t{128}, size_t{64}}) {
    if (PanelTasks(job, panel) >= kMinLargePanelTasks) break;
    if (w < job.c.cols) panel.cols = w;
  }
  return panel;
}

namespace {

// Panels of a job with bf16 products by quantized weights: one near-equal share of the rows,
// the fewest groups of at most QuantBf16GroupRows (rounded up to the bf16 panel's 32), by the
// widest of 1024, 512, 256, 128 or 96 columns that still gives kMinLargePanelTasks tasks.
PanelShape QuantBf16PanelsOf(const GemmJob& job, size_t scratch_stride) {
  const size_t group = QuantBf16GroupRows(job.a.cols, scratch_stride);
  MHA_CHECK(group > 0, "ParallelGemm: the layer's inputs fit a bf16 group (checked at creation)");
  const size_t groups = CeilDiv(job.c.rows, group);
  const size_t rows = CeilDiv(CeilDiv(job.c.rows, groups), kernels::kBf16PanelCols) *
                      kernels::kBf16PanelCols;
  PanelShape panel{std::min(rows, group), job.c.cols};
  for (size_t w : {size_t{1024}, size_t{512}, size_t{256}, size_t{128}, size_t{96}}) {
    if (PanelTasks(job, panel) >= kMinLargePanelTasks) break;
    if (w < job.c.cols) panel.cols = w;
  }
  return panel;
}

}  // namespace

PanelShape PrepackedPanelsOf(const GemmJob& job, bool direct) {
  const kernels::GemmBlocks& blk = kernels::GemmBlocking();
  const size_t widths[] = {kLargePanelCols, 256, 128, kMinPrepackedPanelCols};
  PanelShape panel{blk.mc, 0, direct};
  for (size_t w : widths) {
    panel.cols = std::max(blk.nr, w / blk.nr * blk.nr);
    if (PanelTasks(job, panel) >= kMinPrepackedTasks) break;
  }
  return panel;
}

namespace {

// The job as its Strassen panels see it: c's columns are those of one half.
GemmJob HalfColumns(const GemmJob& job) {
  GemmJob half = job;
  half.c.cols = job.b_strassen.half_n();
  return half;
}

constexpr size_t kStrassenPanelCols[] = {512, 256, 128, 64};

// Floats of a worker's scratch for Strassen panels of depth k: a's sums for kStrassenPanelRows
// rows.
size_t StrassenScratchFloats(size_t k) {
  return kernels::StrassenSumsFloats(kStrassenPanelRows, k);
}

}  // namespace

bool UsesStrassen(const GemmJob& job) {
  if (job.b_strassen.empty() || job.b_packed.data == nullptr) return false;
  const kernels::GemmRoute route = kernels::ChooseGemmRoute(
      {job.c.rows, job.c.cols, job.a.cols, DType::kF32, kernels::BPacking::kStrassen});
  return route == kernels::GemmRoute::kStrassenPackedB &&
         StrassenScratchFloats(job.a.cols) * sizeof(float) <= kernels::GemmScratchBytes();
}

PanelShape StrassenPanelsOf(const GemmJob& job, bool alone) {
  const size_t nr = kernels::GemmBlocking().nr;
  const GemmJob half = HalfColumns(job);
  PanelShape panel{kStrassenPanelRows, 0};
  if (alone && job.batches == 1 && job.c.rows <= kStrassenPanelRows) {
    // Two row panels, the first of ceil(rows / 2) rounded up to even, when the second keeps
    // kStrassenMinPanelRows rows (else it would run the plain product).
    const size_t first = ((job.c.rows + 1) / 2 + 1) / 2 * 2;
    if (job.c.rows - first >= kStrassenMinPanelRows) panel.rows = first;
  }
  for (size_t w : kStrassenPanelCols) {
    panel.cols = std::max(nr, w / nr * nr);
    if (PanelTasks(half, panel) >= kMinPrepackedTasks) break;
  }
  return panel;
}

PanelShape PackedPanelsOf() {
  const kernels::GemmBlocks& blk = kernels::GemmBlocking();
  return {blk.mc, std::max(blk.nr, kLargePanelCols / blk.nr * blk.nr)};
}

size_t PackedJobBytes(size_t k, size_t n) { return kernels::PackedBFloats(k, n) * sizeof(float); }

bool PacksWeightsOnce(size_t batches, size_t rows) {
  return rows > kernels::kGemvMaxRows && kernels::GemmBlocking().prefers_rows &&
         batches * CeilDiv(rows, PackedPanelsOf().rows) >= 2;
}

namespace {

// Whether ParallelGemm packs this job's weights once (given room): f32 weights as stored, a
// non-empty product, and PacksWeightsOnce for its rows.
bool SharesPacking(const GemmJob& job) {
  return job.b_half.data == nullptr && job.b.data != nullptr && job.c.cols != 0 &&
         job.b.rows != 0 && PacksWeightsOnce(job.batches, job.c.rows);
}

// The panel task `t` of a job (tasks ordered batch, row panel, column panel).
struct PanelTask {
  size_t batch, r0, c0, nr, nc;
};
PanelTask PanelTaskOf(const GemmJob& job, const PanelShape& panel, uint64_t t) {
  const uint64_t col_panels = CeilDiv(job.c.cols, panel.cols);
  const uint64_t row_panels = RowPanels(job.c.rows, panel);
  const TaskTriple brc = SplitTask(t, row_panels, col_panels);  // (batch, row, column panel)
  const uint64_t rp = static_cast<uint64_t>(brc.i1), cp = static_cast<uint64_t>(brc.i2);
  PanelTask p;
  p.batch = static_cast<size_t>(brc.i0);
  p.r0 = RowPanelStart(job.c.rows, panel, rp);
  p.c0 = cp * panel.cols;
  p.nr = RowPanelStart(job.c.rows, panel, rp + 1) - p.r0;
  p.nc = std::min(panel.cols, job.c.cols - p.c0);
  return p;
}

// What a worker's scratch holds from its earlier tasks of one ParallelGemm call, so that the
// next task over the same rows of the same a reuses it: Strassen sums of a
// (StrassenSumsOfA), or a's rows quantized for int8-activation products
// (kernels::QuantizeActivationsInt8, for weights of `type` and `block`), or a's rows packed
// transposed for bf16 products by quantized weights (kernels::PackBf16Transposed, at
// QuantBf16PackingOffset). Valid within one call
// only: a's are not written during a call, and any other use of the scratch (a BLIS product
// packs into it) clears it.
struct ScratchHolds {
  enum class Kind { kNothing, kStrassenSums, kInt8Rows, kBf16Transposed };
  Kind kind = Kind::kNothing;
  const float* data = nullptr;
  size_t rows = 0, cols = 0;
  ptrdiff_t row_stride = 0;
  DType type = DType::kF32;  // kInt8Rows: the weights' quantization
  size_t block = 0;
  kernels::StrassenA sums;  // kStrassenSums

  bool Holds(Kind k, const kernels::ConstMatrixView& a, DType t = DType::kF32, size_t b = 0) const {
    return kind == k && data == a.data && rows == a.rows && cols == a.cols &&
           row_stride == a.row_stride && type == t && block == b;
  }
  void Set(Kind k, const kernels::ConstMatrixView& a, DType t = DType::kF32, size_t b = 0) {
    *this = ScratchHolds{};
    kind = k;
    data = a.data;
    rows = a.rows;
    cols = a.cols;
    row_stride = a.row_stride;
    type = t;
    block = b;
  }
};

// Whether a panel task of `job` with `rows` rows multiplies by int8 activations
// (Compute::kInt8) whose quantized rows fit the worker's GEMM scratch (always, at real widths:
// 128 rows of 4096 inputs take 0.8 MiB); otherwise kernels::GemmQuantB quantizes them in blocks.
bool Int8RowsFit(const GemmJob& job, size_t rows) {
  const kernels::QuantMatrix& w = job.b_quant;
  if (!w.int8_activations || w.cols == 0 || job.a.col_stride != 1) return false;
  return rows * kernels::Int8ActLayoutOf(w.type, w.block, w.cols).row_bytes <=
         kernels::GemmScratchBytes();
}

// Panel task `t` of a Strassen job (StrassenPanelsOf, tasks over the left half's columns): rows
// [r0, r0 + nr) of c's columns [c0, c0 + nc) and [n/2 + c0, n/2 + c0 + nc). The even rows run
// kernels::GemmStrassenPackedB when there are kStrassenMinPanelRows of them, with a's sums
// reused from the worker's previous task when it had the same rows of the same a (the column
// panels of one product, and q, k, v of one input); the rest (an odd last row, or a short
// panel) the plain product by b_packed's same columns.
void RunStrassenPanel(const GemmJob& job, const PanelShape& panel, uint64_t t,
                      kernels::GemmRoute plain, uint8_t* scratch, ScratchHolds* cache) {
  const PanelTask p = PanelTaskOf(HalfColumns(job), panel, t);
  const size_t n2 = job.b_strassen.half_n();
  const kernels::ConstMatrixView a = job.BatchA(p.batch);
  const kernels::MatrixView c = job.BatchC(p.batch);
  const float* const bias_left = job.bias != nullptr ? job.bias + p.c0 : nullptr;
  const float* const bias_right = job.bias != nullptr ? job.bias + n2 + p.c0 : nullptr;
  float* const sums = reinterpret_cast<float*>(scratch);
  size_t done = 0;
  const size_t even = p.nr / 2 * 2;
  if (even >= kStrassenMinPanelRows) {
    const kernels::ConstMatrixView a_even = a.Block(p.r0, 0, even, a.cols);
    if (!cache->Holds(ScratchHolds::Kind::kStrassenSums, a_even)) {
      cache->Set(ScratchHolds::Kind::kStrassenSums, a_even);
      cache->sums = kernels::StrassenSumsOfA(a_even, sums);
    }
    const bool ran = kernels::GemmStrassenPackedB(
        cache->sums, job.b_strassen.Columns(p.c0, p.nc), bias_left, bias_right,
        c.Block(p.r0, p.c0, even, p.nc), c.Block(p.r0, n2 + p.c0, even, p.nc));
    MHA_CHECK(ran, "kStrassenPackedB: the direct kernel did not run where the route chose it");
    done = even;
  }
  if (done == p.nr) return;
  if (plain != kernels::GemmRoute::kDirectPackedB) {
    *cache = ScratchHolds{};  // GemmBlisPackedB packs a into the scratch
  }
  const kernels::ConstMatrixView a_rest = a.Block(p.r0 + done, 0, p.nr - done, a.cols);
  MultiplyPackedB(plain, a_rest, job.b_packed.Columns(p.c0, p.nc), bias_left,
                  c.Block(p.r0 + done, p.c0, p.nr - done, p.nc), scratch);
  MultiplyPackedB(plain, a_rest, job.b_packed.Columns(n2 + p.c0, p.nc), bias_right,
                  c.Block(p.r0 + done, n2 + p.c0, p.nr - done, p.nc), scratch);
}

// ParallelGemm for at most kMaxGemmJobs jobs; `alone`: the call has this one job only.
void RunJobs(ThreadPool& pool, const GemmJob* jobs, size_t n_jobs, bool alone, uint8_t* scratch,
             size_t scratch_stride, kernels::Bf16Kernel bf16_kernel, TraceRecorder* trace,
             uint8_t* packed, size_t packed_bytes) {
  // Per job, on the stack: its route over a packed b (kBlisPackAB: none, per-panel products),
  // the packing it multiplies and where ParallelGemm packs it (null if prepacked), and prefix
  // sums of its packing tasks (column panels) and panel tasks.
  kernels::GemmRoute route[kMaxGemmJobs] = {};
  kernels::GemmRoute plain[kMaxGemmJobs] = {};  // a Strassen job's plain product (edge rows)
  bool quant_bf16[kMaxGemmJobs] = {};            // bf16 products by quantized weights
  kernels::PackedB packing[kMaxGemmJobs] = {};
  float* pack_dst[kMaxGemmJobs] = {};
  PanelShape panels[kMaxGemmJobs] = {};
  uint64_t first_pack[kMaxGemmJobs + 1] = {0};
  uint64_t first_task[kMaxGemmJobs + 1] = {0};
  const PanelShape packed_panel = PackedPanelsOf();
  // Per worker (up to kCachedWorkers; more run without reuse): what its scratch holds.
  constexpr size_t kCachedWorkers = 64;
  ScratchHolds caches[kCachedWorkers];
  size_t used = 0;
  for (size_t j = 0; j < n_jobs; ++j) {
    const GemmJob& job = jobs[j];
    const size_t bytes = PackedJobBytes(job.b.rows, job.b.cols);
    route[j] = kernels::GemmRoute::kBlisPackAB;
    panels[j] = PanelsOf(job);
    uint64_t packs = 0;
    const kernels::GemmRoute prepacked = PrepackedRouteOf(job);
    if (job.b_bf16.data != nullptr) {
      route[j] = kernels::GemmRoute::kBf16PackedB;
      panels[j] = Bf16PanelsOf(job);
    } else if (QuantBf16Rows(job.b_quant, job.c.rows)) {
      quant_bf16[j] = true;
      panels[j] = QuantBf16PanelsOf(job, scratch_stride);
    } else if (job.b_packed.data != nullptr && OverPackedB(prepacked)) {
      route[j] = plain[j] = prepacked;
      packing[j] = job.b_packed;
      panels[j] = PrepackedPanelsOf(job, prepacked == kernels::GemmRoute::kDirectPackedB);
      if (UsesStrassen(job)) {
        route[j] = kernels::GemmRoute::kStrassenPackedB;
        panels[j] = StrassenPanelsOf(job, alone);
      }
    } else if (packed != nullptr && SharesPacking(job) && used + bytes <= packed_bytes) {
      pack_dst[j] = reinterpret_cast<float*>(packed + used);
      packing[j] = {pack_dst[j], job.b.rows, job.b.cols, job.b.cols, 0, job.b.rows};
      used += bytes;
      packs = CeilDiv(job.c.cols, packed_panel.cols);
      panels[j] = packed_panel;
      route[j] = kernels::ChooseGemmRoute(
          {job.c.rows, job.c.cols, job.a.cols, DType::kF32, kernels::BPacking::kOncePerCall});
    }
    const bool strassen = route[j] == kernels::GemmRoute::kStrassenPackedB;
    first_pack[j + 1] = first_pack[j] + packs;
    first_task[j + 1] = first_task[j] + PanelTasks(strassen ? HalfColumns(job) : job, panels[j]);
  }
  if (first_pack[n_jobs] > 0) {
    // Step 1: the shared packings, by column panels (each task writes its own micro-panels).
    pool.ParallelFor(first_pack[n_jobs], [&](uint64_t task, size_t worker) {
      size_t j = 0;
      while (task >= first_pack[j + 1]) ++j;
      const GemmJob& job = jobs[j];
      const size_t c0 = (task - first_pack[j]) * packed_panel.cols;
      const TraceSpan span(trace, worker, job.stage, -1, -1, static_cast<int64_t>(task));
      kernels::PackBColumns(job.b, c0, std::min(packed_panel.cols, job.b.cols - c0), pack_dst[j]);
    });
  }
  // Jobs that multiply one a by prepacked weights in the same row panels (q, k and v of one
  // input) run row panel by row panel, all of the jobs' column panels of one before the next:
  // a worker's consecutive tasks then read the same rows of a, which stay in its cache, instead
  // of reading every row panel of a once per job.
  bool same_rows = n_jobs > 1;
  for (size_t j = 0; j < n_jobs && same_rows; ++j) {
    same_rows = (OverPackedB(route[j]) || quant_bf16[j]) && jobs[j].a.data == jobs[0].a.data &&
                jobs[j].a.row_stride == jobs[0].a.row_stride &&
                jobs[j].a.col_stride == jobs[0].a.col_stride && jobs[j].c.rows == jobs[0].c.rows &&
                jobs[j].batches == jobs[0].batches &&
                jobs[j].a_batch_stride == jobs[0].a_batch_stride &&
                panels[j].rows == panels[0].rows && panels[j].balanced == panels[0].balanced;
  }
  // Per job, its column panels, and their prefix sums over the jobs (same_rows only).
  uint64_t first_col[kMaxGemmJobs + 1] = {0};
  for (size_t j = 0; j < n_jobs; ++j) {
    first_col[j + 1] = first_col[j] + CeilDiv(jobs[j].c.cols, panels[j].cols);
  }
  pool.ParallelFor(first_task[n_jobs], [&](uint64_t task, size_t worker) {
    size_t j = 0;
    uint64_t local = 0;  // the task's index among its job's (PanelTaskOf's order)
    if (same_rows) {
      // (row panel, column panel among all the jobs')
      const TaskPair rw = SplitTask(task, first_col[n_jobs]);
      const uint64_t group = static_cast<uint64_t>(rw.outer), w = static_cast<uint64_t>(rw.inner);
      while (w >= first_col[j + 1]) ++j;
      local = group * (first_col[j + 1] - first_col[j]) + (w - first_col[j]);
    } else {
      while (task >= first_task[j + 1]) ++j;
      local = task - first_task[j];
    }
    const GemmJob& job = jobs[j];
    ScratchHolds own_cache;
    ScratchHolds* const cache = worker < kCachedWorkers ? &caches[worker] : &own_cache;
    if (route[j] == kernels::GemmRoute::kStrassenPackedB) {
      const TraceSpan span(trace, worker, job.stage, -1, -1, static_cast<int64_t>(task));
      RunStrassenPanel(job, panels[j], task - first_task[j], plain[j],
                       scratch + worker * scratch_stride, cache);
      return;
    }
    const PanelTask p = PanelTaskOf(job, panels[j], local);
    const TraceSpan span(trace, worker, job.stage, static_cast<int64_t>(p.batch), -1,
                         static_cast<int64_t>(task));

    const kernels::ConstMatrixView a = job.BatchA(p.batch);
    const kernels::MatrixView c = job.BatchC(p.batch);
    const kernels::ConstMatrixView a_blk = a.Block(p.r0, 0, p.nr, a.cols);
    const kernels::MatrixView c_blk = c.Block(p.r0, p.c0, p.nr, p.nc);
    uint8_t* const own_scratch = scratch + worker * scratch_stride;
    const float* const bias = job.bias != nullptr ? job.bias + p.c0 : nullptr;
    if (Int8RowsFit(job, p.nr)) {
      // The panel's rows quantized once per worker, not once per column panel: the q, k and v
      // jobs of one input and all of a job's column panels reuse them.
      const kernels::QuantMatrix& w = job.b_quant;
      if (!cache->Holds(ScratchHolds::Kind::kInt8Rows, a_blk, w.type, w.block)) {
        cache->Set(ScratchHolds::Kind::kInt8Rows, a_blk, w.type, w.block);
        kernels::QuantizeActivationsInt8(a_blk.data, static_cast<size_t>(a_blk.row_stride), p.nr,
                                         a_blk.cols, w.type, w.block, own_scratch);
      }
      kernels::GemvInt8Rows(kernels::Int8Kernel::kAuto, own_scratch, p.nr, w.Rows(p.c0, p.nc),
                            c_blk);
      AddBias(c_blk, bias);
      return;
    }
    if (quant_bf16[j]) {
      // The group's a^T packed once per worker for all the column panels (of every job of this
      // a) it takes.
      const size_t group = panels[j].rows;
      uint16_t* const at_dst =
          reinterpret_cast<uint16_t*>(own_scratch + QuantBf16PackingOffset(group));
      if (!cache->Holds(ScratchHolds::Kind::kBf16Transposed, a_blk)) {
        cache->Set(ScratchHolds::Kind::kBf16Transposed, a_blk);
        kernels::PackBf16Transposed(bf16_kernel, a_blk, at_dst);
      }
      const kernels::PackedBf16B at{at_dst, a_blk.cols, a_blk.rows, a_blk.rows, 0, a_blk.cols};
      kernels::GemmBf16QuantB(bf16_kernel, at, job.b_quant.Rows(p.c0, p.nc), bias, c_blk,
                              own_scratch);
      return;
    }
    *cache = ScratchHolds{};  // the products below may pack into the scratch
    if (route[j] == kernels::GemmRoute::kBf16PackedB) {
      kernels::GemmBf16PackedB(bf16_kernel, 1.0f, a_blk, job.b_bf16.Columns(p.c0, p.nc), 0.0f, bias,
                               c_blk, own_scratch);
      return;
    }
    if (OverPackedB(route[j])) {
      MultiplyPackedB(route[j], a_blk, packing[j].Columns(p.c0, p.nc), bias, c_blk, own_scratch);
      return;
    }
    assert((job.b.data != nullptr || job.b_half.data != nullptr || !job.b_quant.empty()) &&
           "ParallelGemm: a released copy has a packing for this job");
    if (!job.b_quant.empty()) {
      kernels::GemmQuantB(a_blk, job.b_quant.Rows(p.c0, p.nc), c_blk, own_scratch);
    } else if (job.b_half.data != nullptr) {
      kernels::GemmHalfB(1.0f, a_blk, job.b_half.Block(0, p.c0, job.b_half.rows, p.nc), 0.0f,
                         c_blk, own_scratch);
    } else {
      kernels::Gemm(1.0f, a_blk, job.b.Block(0, p.c0, job.b.rows, p.nc), 0.0f, c_blk,
                    own_scratch);
    }
    AddBias(c_blk, bias);
  });
}

}  // namespace

void ParallelGemm(ThreadPool& pool, const GemmJob* jobs, size_t num_jobs, uint8_t* scratch,
                  size_t scratch_stride, kernels::Bf16Kernel bf16_kernel, TraceRecorder* trace,
                  uint8_t* packed, size_t packed_bytes) {
  for (size_t first = 0; first < num_jobs; first += kMaxGemmJobs) {
    RunJobs(pool, jobs + first, std::min(kMaxGemmJobs, num_jobs - first), num_jobs == 1, scratch,
            scratch_stride, bf16_kernel, trace, packed, packed_bytes);
  }
}

}  // namespace mha
