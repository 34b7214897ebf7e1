// Partitioned GEMM on the thread pool: a large product (the projections, [tokens x in] x
// [in x out]) is split into fixed panels of rows and columns, each computed by one
// single-threaded kernel call on the route kernels::ChooseGemmRoute gives the whole product, with
// the bias added by each panel while it is still in cache.
//
// The partition depends only on the shapes (never on the thread count), so results are bitwise
// identical for any number of threads.
#ifndef MHA_RUNTIME_PARALLEL_GEMM_H_
#define MHA_RUNTIME_PARALLEL_GEMM_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_route.h"
#include "kernels/gemm_strassen.h"
#include "kernels/quant.h"
#include "mha/types.hpp"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"

namespace mha {

// The route predicates the layer's planning asks (kernels/gemm_route.h).
using kernels::PrepackedMinRows;
using kernels::StrassenPacks;

// Panel sizes: rows x columns of C per task. Each task packs its rows of a and its columns of b
// afresh, so larger panels pack less per FLOP; products large enough for kMinLargePanelTasks
// tasks of the large panels take them, smaller ones keep threads busy with several tasks each
// (measurements: kernels/README.md).
inline constexpr size_t kPanelRows = 128;
inline constexpr size_t kPanelCols = 256;
inline constexpr size_t kLargePanelRows = 256;
inline constexpr size_t kLargePanelCols = 512;
inline constexpr uint64_t kMinLargePanelTasks = 8;
// Columns per panel of a GEMV-route product (kernels::kGemvMaxRows rows or fewer): a memory-bound
// stream of the weights, split finely so that all threads share it.
inline constexpr size_t kFewRowsPanelCols = 64;
// The same for int8 activations (Compute::kInt8). A worker quantizes a panel's rows once for all
// the column panels it takes (parallel_gemm.cc), so the width only trades the threads' balance
// against per-task overhead: Llama-3-8B-shaped decode step, 512 positions, 2 threads, Zen 4 VM
// (VNNI kernel), medians of 6 alternating runs: i8 1.18 ms at 256 columns against 1.26 at 64,
// i4 0.72 against 0.67, both within the machine's run-to-run noise. Not yet measured on an
// AVX2-only CPU.
inline constexpr size_t kInt8FewRowsPanelCols = 256;

// A weight matrix in nn.Linear layout [out, in], row-major (row stride = in), stored in f32,
// bf16 or f16 (a layer's weight_dtype). 16-bit weights are widened exactly to f32 inside the
// products (kernels::GemmHalfB), so the arithmetic is f32 either way. Quantized weights (kI8,
// kI4) are `quant` instead (data null), dequantized inside the products (kernels::GemmQuantB).
//
// `packed` (optional, f32 weights only): the whole matrix's w^T [in, out] packed once in the
// GEMM micro-kernel's layout (kernels::PackB), made when the layer was created (its `prepack`
// option). Products of PrepackedMinRows() rows or more then multiply it directly
// (MultiplyPackedB): no packing of the weights per call.
struct WeightMatrix {
  WeightMatrix() = default;
  WeightMatrix(const void* data_in, DType dtype_in) : data(data_in), dtype(dtype_in) {}

  const void* data = nullptr;
  DType dtype = DType::kF32;          // kF32, kBF16, kF16, or kI8 / kI4 (then `quant`)
  kernels::QuantMatrix quant;         // kI8 / kI4: the codes and scales [out, in]; else empty
  kernels::PackedB packed;            // data null when the weights are not prepacked
  kernels::StrassenPackedB strassen;  // w^T's Strassen operands (StrassenPacks); empty if none
  // Compute::kBF16: w^T [in, out] packed as bf16 (kernels::PackBf16B), which every product by
  // the matrix then multiplies (kBf16PackedB); data null otherwise.
  kernels::PackedBf16B bf16;

  // The matrix from row `row` on (rows of `in` elements; null data when this has none), with the
  // packings' columns from `row` on where `row` starts a micro-panel (f32: GemmBlocking().nr,
  // bf16: kernels::kBf16PanelCols); elsewhere without that packing (the rows then multiply as
  // stored). Never the Strassen operands (a row range is not a half of the matrix).
  WeightMatrix Rows(int64_t row, int64_t in) const {
    WeightMatrix r{data == nullptr ? nullptr
                                   : static_cast<const uint8_t*>(data) +
                                         static_cast<size_t>(row * in) * DTypeSize(dtype),
                   dtype};
    const size_t first = static_cast<size_t>(row);
    if (!quant.empty()) r.quant = quant.Rows(first, quant.rows - first);
    if (packed.data != nullptr && first % kernels::GemmBlocking().nr == 0 && first <= packed.n) {
      r.packed = packed.Columns(first, packed.n - first);
    }
    if (bf16.data != nullptr && first % kernels::kBf16PanelCols == 0 && first <= bf16.n) {
      r.bf16 = bf16.Columns(first, bf16.n - first);
    }
    return r;
  }
};

// Bytes of GEMM scratch one worker needs for any product (the blocked driver's packing, or a
// bf16 product's rounded rows of a).
inline size_t WorkerGemmScratchBytes() {
  return std::max(kernels::GemmScratchBytes(), kernels::GemmBf16ScratchBytes());
}

// Products by quantized weights with bf16 compute (QuantMatrix::bf16_products, more than
// kernels::kGemvMaxRows rows) pack a's transpose for a group of its rows into the worker's
// scratch (kernels::PackBf16Transposed) and run kernels::GemmBf16QuantB on it. The rows of a
// group: the most, at most kQuantBf16MaxGroupRows and a multiple of the bf16 panel (32), whose
// packing and product scratch fit `scratch_bytes` for `k` inputs; 0 if not even 32 rows fit
// (a layer refuses such widths at creation). Why a cap: each group dequantizes every weight
// once, so larger groups spread that over more rows, while the packing of 512 rows of 4096
// inputs already takes 4 MiB.
inline constexpr size_t kQuantBf16MaxGroupRows = 512;
size_t QuantBf16GroupRows(size_t k, size_t scratch_bytes);
// Byte offset of the packed a^T in a worker's scratch for groups of `group_rows` rows.
size_t QuantBf16PackingOffset(size_t group_rows);

// The bf16 packing of `weights` if it holds w^T [in, >= out], as its columns [0, out); else empty.
inline kernels::PackedBf16B Bf16Of(const WeightMatrix& weights, size_t in, size_t out) {
  const kernels::PackedBf16B& p = weights.bf16;
  return p.data != nullptr && p.k == in && p.n >= out ? p.Columns(0, out) : kernels::PackedBf16B{};
}

// c = a * b (+ bias [c.cols], added to every row, if not null) for packed b on `route`
// (kDirectPackedB: the bias added in the direct kernel's stores; kBlisPackedB: then
// kernels::AddBiasToRows; scratch: kernels::GemmScratchBytes(), used by kBlisPackedB only). The
// same bits either way the bias is added. c.col_stride must be 1 when bias is given.
void MultiplyPackedB(kernels::GemmRoute route, const kernels::ConstMatrixView& a,
                     const kernels::PackedB& b, const float* bias, const kernels::MatrixView& c,
                     void* scratch);

// Rows of C per Strassen panel task (two halves of 64: the direct kernel's products), and the
// fewest rows a (last) panel runs through Strassen; fewer run the plain product.
inline constexpr size_t kStrassenPanelRows = 128;
inline constexpr size_t kStrassenMinPanelRows = 32;

// The Strassen operands of `weights` if they are exactly those of w^T [in, out], else empty.
inline kernels::StrassenPackedB StrassenOf(const WeightMatrix& weights, size_t in, size_t out) {
  const kernels::StrassenPackedB& s = weights.strassen;
  return !s.empty() && 2 * s.half_k() == in && 2 * s.half_n() == out ? s
                                                                     : kernels::StrassenPackedB{};
}

// The prepacking of `weights`' first `out` rows (w^T [in, out]) if it has one, else empty.
inline kernels::PackedB PackingOf(const WeightMatrix& weights, size_t in, size_t out) {
  const kernels::PackedB& p = weights.packed;
  return p.data != nullptr && p.k == in && p.n >= out ? p.Columns(0, out) : kernels::PackedB{};
}

// The route of a product of `rows` rows by `weights` (rows [0, out) of them, `in` columns),
// with its prepacking if it has one (Strassen operands are ParallelGemm's only: not here).
kernels::GemmRoute WeightsRoute(const WeightMatrix& weights, size_t rows, size_t in, size_t out);

// Whether a product of `rows` rows by `weights` (rows [0, out) of them) multiplies its prepacked
// weights (f32 or bf16).
bool UsesPrepacked(const WeightMatrix& weights, size_t rows, size_t in, size_t out);

// c = a * w^T (+ bias [out] on every row, if not null) for w = rows [0, out) of `weights` with
// `in` = a.cols columns, on WeightsRoute: the bf16 packing (kernels::GemmBf16PackedB), the
// prepacked weights (MultiplyPackedB), kernels::Gemm, kernels::GemmHalfB for 16-bit weights or
// kernels::GemmQuantB for quantized ones (more than kGemvMaxRows rows with bf16_products: a's
// rows in groups, QuantBf16GroupRows); bf16 products on `bf16_kernel` (the context's).
// Single-threaded; scratch: WorkerGemmScratchBytes(). c.col_stride must be 1 when bias is given.
void MultiplyWeights(const kernels::ConstMatrixView& a, const WeightMatrix& weights, size_t out,
                     const float* bias, const kernels::MatrixView& c, void* scratch,
                     kernels::Bf16Kernel bf16_kernel);

// One product c = a * b (+ bias per column), repeated over `batches` with element offsets
// a_batch_stride / c_batch_stride between batches (b and bias are shared).
struct GemmJob {
  kernels::ConstMatrixView a;      // [m, k] for batch 0
  kernels::ConstMatrixView b;      // [k, n] f32; ignored when b_half.data is set
  kernels::HalfMatrixView b_half;  // [k, n] 16-bit (weights stored in bf16/f16)
  kernels::QuantMatrix b_quant;    // quantized weights w [n, k] (b = w^T); empty if not
  kernels::PackedB b_packed;       // b prepacked (data null if not): used from PrepackedMinRows()
  kernels::StrassenPackedB b_strassen;  // b's Strassen operands (empty if none), with b_packed
  kernels::PackedBf16B b_bf16;     // Compute::kBF16: b packed as bf16, used for every row count
  kernels::MatrixView c;           // [m, n] for batch 0, col_stride must be 1 when bias is set
  const float* bias = nullptr;     // [n] or null
  size_t batches = 1;
  ptrdiff_t a_batch_stride = 0;
  ptrdiff_t c_batch_stride = 0;
  Stage stage = Stage::kQkvProjection;  // for the trace

  // b = w^T for the weight rows [0, out) of `w`, `in` columns, in whichever storage w has,
  // and its prepacking when w has one of exactly that shape.
  void SetWeights(const WeightMatrix& w, size_t out, size_t in);

  // a and c of batch `batch` (< batches).
  kernels::ConstMatrixView BatchA(size_t batch) const {
    kernels::ConstMatrixView v = a;
    v.data += static_cast<ptrdiff_t>(batch) * a_batch_stride;
    return v;
  }
  kernels::MatrixView BatchC(size_t batch) const {
    kernels::MatrixView v = c;
    v.data += static_cast<ptrdiff_t>(batch) * c_batch_stride;
    return v;
  }
};

// Jobs one ParallelGemm call runs as one flat task range (their per-job state lives on the
// stack); a call with more runs them kMaxGemmJobs at a time, with the same results.
inline constexpr size_t kMaxGemmJobs = 8;

// Runs every job (all panels of up to kMaxGemmJobs jobs form one flat task range) on the pool.
// `scratch` holds one GEMM packing buffer per worker: worker w uses scratch + w * scratch_stride
// (WorkerGemmScratchBytes() bytes each, 64-byte aligned). Each job runs on the route
// kernels::ChooseGemmRoute gives its whole product:
//
// - Prepacked weights (b_packed, PrepackedMinRows() rows or more): each panel task
//   (PrepackedPanelsOf) multiplies its rows of a by a column range of b_packed
//   (MultiplyPackedB); bitwise the result of one call over the whole product. With b_strassen
//   too and the kStrassenPackedB route (UsesStrassen): Strassen panels (StrassenPanelsOf), each
//   task computing its panel's rows of c's columns [c0, c0 + nc) and [n/2 + c0, n/2 + c0 + nc)
//   with kernels::GemmStrassenPackedB (a's sums in the worker's scratch), the odd last row of a
//   panel and panels of fewer than kStrassenMinPanelRows rows with the plain product.
// - f32 weights packed once per call (`packed`, optional, 64-byte aligned, `packed_bytes`
//   long): a job with rows for two or more row panels (PacksWeightsOnce) has its b packed by
//   column panels in parallel (kernels::PackBColumns), then each panel task multiplies its rows
//   of a by the shared packing, instead of every panel task packing its own columns of b. Jobs
//   are packed into `packed` in order while they fit (PackedJobBytes each). Bitwise the same as
//   per-panel packing, except where the per-panel partition has an edge panel on the GEMV route.
//   The route there is the blocked driver's, so an f32 layer computes exactly what its 16-bit
//   twin computes (AttentionConfig::weight_dtype; tests/weights16_test.cc).
// - Otherwise each panel task calls kernels::Gemm, kernels::GemmHalfB or kernels::GemmQuantB
//   (quantized weights: dequantized into the worker's scratch as its driver packs them, or
//   streamed by kernels::GemvQuant for few rows) on its panel.
//
// - bf16 weights (b_bf16): each panel task (PanelsOf, columns multiples of the bf16 panel)
//   calls kernels::GemmBf16PackedB on its rows and a column range of b_bf16.
// - Quantized weights with bf16 products (b_quant.bf16_products, more than kGemvMaxRows rows):
//   panels of one group of rows (QuantBf16GroupRows, the job's rows split into near-equal
//   groups) by up to 1024 columns; a worker packs its group's a^T once into its scratch
//   (kernels::PackBf16Transposed) for all the column panels it takes, each of which dequantizes
//   its weights once (kernels::GemmBf16QuantB). c's rows do not depend on the grouping.
//
// Task order: job by job, each in batch, row panel, column panel order; jobs over prepacked
// weights that share one a and its row panels (q, k and v of one input) instead go row panel by
// row panel, through every job's column panels of one before the next, so that a worker's
// consecutive tasks read the same rows of a.
//
// In every case the partition is the shapes', so results do not depend on the thread count.
// Products by bf16 packings (b_bf16) run on `bf16_kernel` (the context's, Bf16KernelOf).
void ParallelGemm(ThreadPool& pool, const GemmJob* jobs, size_t num_jobs, uint8_t* scratch,
                  size_t scratch_stride, kernels::Bf16Kernel bf16_kernel,
                  TraceRecorder* trace = nullptr, uint8_t* packed = nullptr,
                  size_t packed_bytes = 0);

// Runs every batch of `job` on the calling thread over its prepacked f32 weights (b_packed), on
// the route kernels::ChooseGemmRoute gives each batch's product (kDirectPackedB or
// kBlisPackedB, which give the same bits: kernels/gemm_direct.h), so the bits of ParallelGemm's
// result for the job. Not for Strassen's route. scratch: WorkerGemmScratchBytes().
void MultiplyPrepackedJob(const GemmJob& job, void* scratch);

// Bytes `packed` needs to pack the weights b [k, n] of one job (a multiple of 64).
size_t PackedJobBytes(size_t k, size_t n);

// Rows x columns of C per panel task of `job` (depends on its shape only). Balanced: `rows` is a
// target height instead, and the job's rows split into RowPanels (the count nearest rows /
// target, at least one) panels of near-equal heights, multiples of kernels::GemmBlocking().mr
// but the last: no short last panel keeps one worker busy alone at the end (and the task count
// is a multiple of the jobs' column panels, often of the workers too).
struct PanelShape {
  size_t rows;
  size_t cols;
  bool balanced = false;
};
// Row panels of a product of `rows` rows, and the first row of panel rp (rp <= the count: the
// count gives `rows`).
uint64_t RowPanels(size_t rows, const PanelShape& panel);
size_t RowPanelStart(size_t rows, const PanelShape& panel, uint64_t rp);
PanelShape PanelsOf(const GemmJob& job);

// Panels of a job whose weights ParallelGemm packs once: kernels::GemmBlocking().mc rows (the
// rows the BLIS route packs per block, so no panel ends in a short block except the last) by
// kLargePanelCols columns rounded down to a multiple of NR (packed column ranges start on a
// micro-panel).
PanelShape PackedPanelsOf();

// Panels of a job with bf16 weights (b_bf16): kBf16PanelRows rows by the widest of all its
// columns, 1024, 512, 256, 128 or 64 that still gives kMinLargePanelTasks tasks, else 64: each
// task rounds its rows of a to bf16 once for all of its columns, so wide panels round least
// (multiples of the bf16 packing's panels).
inline constexpr size_t kBf16PanelRows = 128;
PanelShape Bf16PanelsOf(const GemmJob& job);

// Panels of a job with prepacked weights: kernels::GemmBlocking().mc rows by the widest of
// kLargePanelCols, 256, 128 or kMinPrepackedPanelCols columns (multiples of NR) that still gives
// kMinPrepackedTasks tasks, else the narrowest: each task packs its rows of a again (BLIS
// route), so wide panels pack a least. `direct` (the kDirectPackedB route, which packs no a):
// balanced row panels of about MC rows instead. The partition does not change the results.
inline constexpr size_t kMinPrepackedPanelCols = 64;
inline constexpr uint64_t kMinPrepackedTasks = 2;
PanelShape PrepackedPanelsOf(const GemmJob& job, bool direct = false);

// Whether ParallelGemm runs `job` as Strassen panels: the kStrassenPackedB route and room for
// a's sums in kernels::GemmScratchBytes().
bool UsesStrassen(const GemmJob& job);

// Panels of a Strassen job: kStrassenPanelRows rows by the widest of 512, 256, 128 or 64
// columns per half (multiples of NR) that still gives kMinPrepackedTasks tasks. A job `alone`
// in its ParallelGemm call with one panel's rows (an output projection of 64-128 tokens) takes
// two row panels of half its rows instead, so that each task forms a's sums of its own rows
// only; with other jobs (q, k, v of one input) the workers share sums across column panels.
PanelShape StrassenPanelsOf(const GemmJob& job, bool alone);

// Whether a job with f32 weights and `batches` products of `rows` rows each has its weights
// packed once by ParallelGemm (given room in `packed`): more rows than the GEMV route takes, at
// least two PackedPanelsOf row panels to share the packing, and a micro-kernel that stores
// row-major C tiles itself (packed products never swap operands). Planners size `packed` by it.
bool PacksWeightsOnce(size_t batches, size_t rows);

}  // namespace mha

#endif  // MHA_RUNTIME_PARALLEL_GEMM_H_
