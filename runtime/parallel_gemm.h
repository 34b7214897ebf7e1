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
#include "kernels/gemm_strassen.h"
#include "kernels/gemv.h"
#include "mha/types.hpp"
#include "runtime/thread_pool.h"
#include "runtime/trace.h"

namespace mha {

// Panel sizes: rows x columns of C per task. Each task packs its rows of A and its columns of B
// (the weights) afresh, so larger panels pack less per FLOP: one thread computing a 1024 x 768
// x 1536 projection in panels (AMD EPYC Zen 3 class, BLIS zen3, min of 15 runs) reached 77-79
// GFLOP/s with 128 x 256 panels, 82-84 with 256 x 512 and 89-90 as one call. Products large
// enough for kMinLargePanelTasks tasks of 256 x 512 take those; smaller ones keep 128 x 256 so
// that threads still get several tasks each (e.g. 128 tokens x 1536 outputs: 6 tasks, not 3).
inline constexpr size_t kPanelRows = 128;
inline constexpr size_t kPanelCols = 256;
inline constexpr size_t kLargePanelRows = 256;
inline constexpr size_t kLargePanelCols = 512;
inline constexpr uint64_t kMinLargePanelTasks = 8;
// Columns per panel when the product has few rows (the GEMV path: kernels::kGemvMaxRows or
// fewer): such products are memory-bound streams of the weights, and 256-column panels would
// leave a 16-token output projection of E = 256 as ONE task for all threads. The column split
// never changes the results (gemm.h), so this depends on shapes only and keeps determinism.
inline constexpr size_t kFewRowsPanelCols = 64;

// A weight matrix in nn.Linear layout [out, in], row-major (row stride = in), stored in f32,
// bf16 or f16 (a layer's weight_dtype). 16-bit weights are widened exactly to f32 inside the
// products (kernels::GemmHalfB), so the arithmetic is f32 either way.
//
// `packed` (optional, f32 weights only): the whole matrix's w^T [in, out] packed once in the
// GEMM micro-kernel's layout (kernels::PackB), made when the layer was created (its `prepack`
// option). Products of PrepackedMinRows() rows or more then multiply it directly
// (MultiplyPacked): no packing of the weights per call.
struct WeightMatrix {
  WeightMatrix() = default;
  WeightMatrix(const void* data_in, DType dtype_in) : data(data_in), dtype(dtype_in) {}

  const void* data = nullptr;
  DType dtype = DType::kF32;          // kF32, kBF16 or kF16
  kernels::PackedB packed;            // data null when the weights are not prepacked
  kernels::StrassenPackedB strassen;  // w^T's Strassen operands (StrassenPacks); empty if none

  // The matrix from row `row` on (rows of `in` elements), without the packing (a row range of
  // w is not a packing of its own).
  WeightMatrix Rows(int64_t row, int64_t in) const {
    return {static_cast<const uint8_t*>(data) + static_cast<size_t>(row * in) * DTypeSize(dtype),
            dtype};
  }
};

// Rows of a product from which prepacked weights are used when kernels::GemmPackedBDirect
// cannot run (PrepackedMinRows): above the GEMV path's rows. Alone, BLIS's micro-kernel on
// prepacked weights beats the GEMV from 4 rows (one thread, AVX2, Zen 3 class, [rows, 256] x
// [256, 384] with the weights in cache, best of two runs of a throwaway loop over kernels::Gemv
// and kernels::GemmPackedB: 2 rows 42 / 25 GFLOP/s GEMV / prepacked, 4 rows 33 / 42, 16 rows
// 59 / 72), but inside the forward of (1, 16, 256, 4) on 2 threads prepacking from 4 rows
// measured 0.93-1.02x the time without (off / on, per-forward medians of interleaved runs):
// the GEMV's 64-column tasks balance better and GemmPackedB packs a on every call.
inline constexpr size_t kPrepackedMinRows = kernels::kGemvMaxRows + 1;

// Whether a product of `rows` rows by packed weights runs kernels::GemmPackedBDirect: where it
// runs, up to kernels::GemmPackedBDirectMaxRows() rows (the target's measured crossover with
// BLIS's packed a). The choice depends on the product's rows only (a job's, not a panel's), so
// every panel of a product runs the same kernel.
bool UsesDirect(size_t rows);

// The fewest rows of a product that multiplies prepacked weights: 1 where
// kernels::GemmPackedBDirect runs, else kPrepackedMinRows. The direct kernel reads a in place,
// where GemmPackedB packs it per call and pads the last row tile to MR rows, and beats the GEMV
// from one row (one thread, AVX2, Zen 3 class, weights in cache, interleaved runs of a throwaway
// loop, GFLOP/s direct / GemmPackedB / Gemv): [1, 256] x [256, 768] 31.5 / 15.5 / 26.4;
// [4, 256] x [256, 768] 89.9 / 59.2 / 57.3; [16, 256] x [256, 768] 92.1 / 83.9 / 69.2.
size_t PrepackedMinRows();

// c = a * b (+ bias [c.cols], added to every row, if not null) for packed b:
// kernels::GemmPackedBDirect if `direct` (the bias added in its stores), else
// kernels::GemmPackedB and kernels::AddBiasRows (scratch: kernels::GemmScratchBytes(), used by
// GemmPackedB only). The same bits either way the bias is added. c.col_stride must be 1 when
// bias is given.
void MultiplyPacked(bool direct, const kernels::MatrixView& a, const kernels::PackedB& b,
                    const kernels::MatrixView& c, void* scratch, const float* bias = nullptr);

// Strassen-Winograd products (kernels/gemm_strassen.h) for prepacked weights: a layer packs the
// seven operands of w^T [in, out] at creation (WeightPrepack::kOn) when StrassenPacks(in, out),
// and ParallelGemm multiplies them for products of kStrassenMinRows rows or more. At smaller
// depths the half-depth products run too short for the saving (one thread, AVX2, Zen 3 class,
// time against the plain product: [128, 256] x [256, 256] 1.02, [128, 512] x [512, 512] 0.91,
// [64, 512] x [512, 512] 0.93; kernels/gemm_strassen.h); the operands' column ranges must start
// on micro-panels, so out / 2 is a multiple of NR (the right half's columns of the plain
// packing: the odd row of a panel runs the plain product).
inline constexpr size_t kStrassenMinDepth = 512;
inline constexpr size_t kStrassenMinCols = 256;
inline constexpr size_t kStrassenMinRows = 64;
// Rows of C per Strassen panel task (two halves of 64: the direct kernel's products), and the
// fewest rows a (last) panel runs through Strassen; fewer run the plain product.
inline constexpr size_t kStrassenPanelRows = 128;
inline constexpr size_t kStrassenMinPanelRows = 32;

// Whether a layer stores the Strassen operands of a weight matrix with `in` inputs and `out`
// outputs (with WeightPrepack::kOn): depth and width as above, mha's direct micro-kernel runs.
bool StrassenPacks(size_t in, size_t out);

// The Strassen operands of `weights` if they are exactly those of w^T [in, out], else empty.
inline kernels::StrassenPackedB StrassenOf(const WeightMatrix& weights, size_t in, size_t out) {
  const kernels::StrassenPackedB& s = weights.strassen;
  return !s.empty() && 2 * s.half_k() == in && 2 * s.half_n() == out ? s
                                                                     : kernels::StrassenPackedB{};
}

// The prepacking of `weights` if it packs exactly w^T [in, out] (all of the matrix), else empty.
inline kernels::PackedB PackingOf(const WeightMatrix& weights, size_t in, size_t out) {
  const kernels::PackedB& p = weights.packed;
  return p.data != nullptr && p.k == in && p.n == out ? p : kernels::PackedB{};
}

// Whether a product of `rows` rows by `weights` (rows [0, out) of them) multiplies its prepacked
// weights.
inline bool UsesPrepacked(const WeightMatrix& weights, size_t rows, size_t in, size_t out) {
  return rows >= PrepackedMinRows() && PackingOf(weights, in, out).data != nullptr;
}

// c = a * w^T (+ bias [out] on every row, if not null) for w = rows [0, out) of `weights` with
// `in` = a.cols columns: the prepacked weights (UsesPrepacked, MultiplyPacked), kernels::Gemm,
// or kernels::GemmHalfB for 16-bit weights. Single-threaded; scratch as kernels::Gemm's.
// c.col_stride must be 1 when bias is given.
void GemmWeights(const kernels::MatrixView& a, const WeightMatrix& weights, size_t out,
                 const kernels::MatrixView& c, void* scratch, const float* bias = nullptr);

// One product c = a * b (+ bias per column), repeated over `batches` with element offsets
// a_batch_stride / c_batch_stride between batches (b and bias are shared).
struct GemmJob {
  kernels::MatrixView a;           // [m, k] for batch 0
  kernels::MatrixView b;           // [k, n] f32; ignored when b_half.data is set
  kernels::HalfMatrixView b_half;  // [k, n] 16-bit (weights stored in bf16/f16)
  kernels::PackedB b_packed;       // b prepacked (data null if not): used from PrepackedMinRows()
  kernels::StrassenPackedB b_strassen;  // b's Strassen operands (empty if none), with b_packed
  kernels::MatrixView c;           // [m, n] for batch 0, col_stride must be 1 when bias is set
  const float* bias = nullptr;     // [n] or null
  size_t batches = 1;
  ptrdiff_t a_batch_stride = 0;
  ptrdiff_t c_batch_stride = 0;
  Stage stage = Stage::kQkvProjection;  // for the trace

  // b = w^T for the weight rows [0, out) of `w`, `in` columns, in whichever storage w has,
  // and its prepacking when w has one of exactly that shape.
  void SetWeights(const WeightMatrix& w, size_t out, size_t in);
};

// Runs every job (all panels of all jobs form one flat task range) on the pool. `scratch` holds
// one GEMM packing buffer per worker: worker w uses scratch + w * scratch_stride
// (kernels::GemmScratchBytes() bytes each, 64-byte aligned).
//
// `packed` (optional, 64-byte aligned, `packed_bytes` long): room to pack f32 weights once per
// call. A job whose product has rows for two or more row panels (PackedPanelsOf) and whose
// weights are f32 then runs in two steps: its b is packed by column panels in parallel
// (kernels::PackBColumns), then each panel task packs only its rows of a and multiplies them by
// the shared packing (kernels::GemmPackedB), instead of every panel task packing its own
// columns of b: a 2048-row projection packed each weight eight times. Jobs are packed into
// `packed` in order while they fit (PackedJobBytes each); the rest, 16-bit weights and few-row
// products run as above. The results are bitwise the same either way on row-preferring
// micro-kernels (kernels::GemmPackedB), except where the unpacked partition has an edge panel
// of kernels::kGemvMaxRows rows or fewer (the GEMV path sums in another order); in any case
// they do not depend on the thread count. They take kernels::GemmPackedBDirect where it wins at
// every size (kernels::GemmPackedBDirectAlwaysWins: AVX-512), as 16-bit weights' products do
// there (kernels::GemmHalfB's driver); its arithmetic is that of the 6 x 16 BLIS kernels it
// needs (kernels/gemm_direct.h), so either way an f32 layer without prepacked weights computes
// exactly what a 16-bit layer computes (AttentionConfig::weight_dtype; tests/weights16_test.cc).
//
// A job with prepacked weights (b_packed, and PrepackedMinRows() rows or more per product)
// needs neither step nor room in `packed`: each panel task (PrepackedPanelsOf) multiplies its
// rows of a by a column range of b_packed (MultiplyPacked, with UsesDirect of the product's
// rows). Its results are bitwise those of one such call over the whole product, whatever the
// panels and the thread count. A job that also has b_strassen and kStrassenMinRows rows or more
// (UsesStrassen) runs Strassen panels instead (StrassenPanelsOf): each task computes its panel's
// rows (128, or half of a short job alone in the call) of c's columns [c0, c0 + nc) and
// [n/2 + c0, n/2 + c0 + nc) with
// kernels::GemmStrassenPackedB (a's sums in the worker's scratch), the odd last row of a panel
// and panels of fewer than kStrassenMinPanelRows rows with the plain product; the partition is
// the shapes', so these results too are bitwise the same for any thread count.
void ParallelGemm(ThreadPool& pool, const GemmJob* jobs, size_t num_jobs, uint8_t* scratch,
                  size_t scratch_stride, TraceRecorder* trace = nullptr, uint8_t* packed = nullptr,
                  size_t packed_bytes = 0);

// Bytes `packed` needs to pack the weights b [k, n] of one job (a multiple of 64).
size_t PackedJobBytes(size_t k, size_t n);

// Rows x columns of C per panel task of `job` (depends on its shape only).
struct PanelShape {
  size_t rows;
  size_t cols;
};
PanelShape PanelsOf(const GemmJob& job);

// Panels of a job whose weights ParallelGemm packs once: kernels::GemmBlocking().mc rows (the
// rows GemmPackedB packs per block, so no panel ends in a short block except the last) by
// kLargePanelCols columns rounded down to a multiple of the micro-kernel's NR (the column
// ranges of a packing must start on a micro-panel). Measured on this machine (AMD EPYC Zen 3
// class, BLIS zen3, MC 168, noisy): in a perf profile of (1, 2048, 1024, 16) on 2 threads the
// packing routines fell from 10.6% to 5.8% of CPU samples (the weights' from 2.5% to 0.6%), and
// instructions per forward of (2, 512, 512, 8) by 2.5% (callgrind); single-threaded products
// (bench/kernels_bench BM_ProjectionPanels, 4096 x 512 x 1536) measured alike within the noise
// (81.7 / 74.5 GFLOP/s per-panel packing, 80.2 / 78.1 packed once, 85.1 / 87.2 one call).
PanelShape PackedPanelsOf();

// Panels of a job with prepacked weights: kernels::GemmBlocking().mc rows by the widest of
// kLargePanelCols, 256, 128 or kMinPrepackedPanelCols columns (multiples of NR) that still gives
// kMinPrepackedTasks tasks, else the narrowest. Each task packs its rows of a again, so wide
// panels pack a least (two tasks: a 16-token projection of E = 256 packs its a twice, not four
// times); several jobs in one call add up their tasks (q, k, v: six at that shape). The partition
// does not change the results (GemmPackedB's rows and columns are independent).
inline constexpr size_t kMinPrepackedPanelCols = 64;
inline constexpr uint64_t kMinPrepackedTasks = 2;
PanelShape PrepackedPanelsOf(const GemmJob& job);

// Whether ParallelGemm runs `job` as Strassen panels: Strassen operands, kStrassenMinRows rows
// or more, and room for their scratch in kernels::GemmScratchBytes().
bool UsesStrassen(const GemmJob& job);

// Panels of a Strassen job: kStrassenPanelRows rows by the widest of 512, 256, 128 or 64
// columns per half (multiples of NR) that still gives kMinPrepackedTasks tasks. Except for a job
// `alone` in its ParallelGemm call with one panel's rows (one batch of at most
// kStrassenPanelRows rows: an output projection of 64-128 tokens), which takes two row panels
// of half its rows (even) by the widest columns: each task then forms a's sums of its own rows
// only, where column panels each formed all of them (the same sums on every worker). Not with
// other jobs: q, k and v of one input share each worker's sums across column panels.
// (1, 128, 512, 8)'s output projection, 2 threads, alternated: 342-362 us per worker against
// 362-376 by column panels.
PanelShape StrassenPanelsOf(const GemmJob& job, bool alone);

// Whether a job with f32 weights and `batches` products of `rows` rows each has its weights
// packed once by ParallelGemm (given room in `packed`): more rows than the GEMV path takes, at
// least two PackedPanelsOf row panels to share the packing, and a micro-kernel that stores
// row-major C tiles itself (GemmPackedB never swaps operands). Planners size `packed` by it.
bool PacksWeightsOnce(size_t batches, size_t rows);

// Number of panel tasks ParallelGemm creates for one job (without a packed buffer).
uint64_t NumPanelTasks(const GemmJob& job);

}  // namespace mha

#endif  // MHA_RUNTIME_PARALLEL_GEMM_H_
