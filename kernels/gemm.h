// GEMM over strided f32 matrix views: mha's own BLIS-style blocked driver around the sgemm
// micro-kernel of the BLIS configuration selected at run time (haswell, zen3, skx, ...).
// Transposes are expressed by swapping a view's strides, so per-head views of a
// [tokens, heads * head_dim] buffer and K^T need no copy.
//
// Why not bli_sgemm_ex: BLIS 0.9.0 mallocs on every call (control tree and thread-info
// structures, even with a one-thread rntm_t), and mha's forward pass must not allocate; its
// per-call setup also costs more than the arithmetic of the small products in attention.
// This driver packs into caller-owned scratch instead, so a call performs no allocation, takes
// no lock and uses no global mutable state.
//
// Blocking (the five loops of the BLIS/GotoBLAS algorithm): jc over NC columns of C; pc over
// KC blocks of the inner dimension, packing B[KC, NC] into NR-wide micro-panels; ic over MC rows,
// packing A[MC, KC] into MR-tall micro-panels; then the micro-kernel over MR x NR tiles. MR, NR,
// MC are the BLIS configuration's values; KC too, except on AVX-512 targets whose direct kernel
// runs 6 x 4 tiles, where it is 512 (gemm.cc's kAvx512DirectKc, measured there); NC is the
// configuration's, capped so that the packed B panel (KC x NC floats) stays within 2 MiB
// (haswell: 2048 instead of 4080; 1024 at KC 512), which halves the scratch at no measurable cost
// (A is re-packed once per NC columns of C). The KC blocks of a depth k are KcBlockDepth's: KC
// deep, the last one taking a remainder shorter than KC along (k 768 at KC 512 is one block of
// 768, not 512 + 256), so no product runs a short block; a block deeper than KC packs fewer
// rows of A (MC) and columns of B (NC) at a time, so the scratch stays the same.
// Scratch = packed A (MC x KC) + packed B (KC x NC) + one widened 16-bit or dequantized panel
// (max(MR, NR) x KC, used by GemmHalfB and GemmQuantB only), at most 2 MiB + (MC + 32) * KC * 4
// bytes: 2.2 MiB on haswell/zen (MR 6, NR 16, MC 168, KC 256, NC 2048; 2.4 MiB at KC 512 on
// AVX-512), 2.7 MiB on skx (MR 32, NR 12, column-preferring), 3.1 MiB on penryn, the largest of the
// x86-64 configurations.
//
// Which of its routes Gemm and GemmHalfB take is kernels::ChooseGemmRoute's (gemm_route.h).
// kDirectPackB (AVX-512 with a 6 x 16 configuration: haswell/zen, which BLIS 0.9.0 also picks on
// AVX-512 CPUs it does not know): the driver packs only B and runs mha's direct micro-kernel
// (gemm_direct.h) with A read in place: its arithmetic is that kernel's, so the bits are the same
// and the speed is AVX-512's.
//
// kGemv (few rows): when a has at most kGemvMaxRows (16) rows, contiguous rows
// (a.col_stride == 1) and b has contiguous columns (b.row_stride == 1, i.e. b = w^T of a
// row-major w, as in the projections of one decoded token), Gemm calls kernels::Gemv
// (gemv.h), which streams each column of b once and packs nothing; the scratch is then unused.
//
// Numerics: each element of C is alpha * (a sum over k in increasing order, split into the KC
// blocks of KcBlockDepth, of fused multiply-adds) + beta * c, so results are deterministic and do
// not depend on which thread runs the call or on alignment of the data. With beta 0 or 1, computing
// c as several calls on sub-blocks of c gives the same bits as one call (ParallelGemm's panels);
// with other beta it may differ in the last bit (edge tiles round beta * c separately). The GEMV
// path sums differently (SIMD lanes, then across lanes: see gemv.h), so the same-bits guarantee
// holds between calls that take the same path: splitting columns always, splitting rows when the
// whole and every part lie on the same side of kGemvMaxRows; the two paths agree to rounding.
#ifndef MHA_KERNELS_GEMM_H_
#define MHA_KERNELS_GEMM_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mha/types.hpp"

namespace mha {
namespace kernels {

// A rows x cols matrix; element (i, j) at data[i * row_stride + j * col_stride]. Strides in
// elements. A view with row_stride 1 and col_stride = rows is column-major; swapping the two
// strides (and rows/cols) transposes the view. T is float (MatrixView: a result) or const float
// (ConstMatrixView: an operand); a MatrixView converts to a ConstMatrixView.
template <typename T>
struct BasicMatrixView {
  T* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
  ptrdiff_t row_stride = 0;
  ptrdiff_t col_stride = 1;

  BasicMatrixView Transposed() const { return {data, cols, rows, col_stride, row_stride}; }
  // The sub-block starting at (r0, c0) of size nr x nc.
  BasicMatrixView Block(size_t r0, size_t c0, size_t nr, size_t nc) const {
    return {
        data + static_cast<ptrdiff_t>(r0) * row_stride + static_cast<ptrdiff_t>(c0) * col_stride,
        nr, nc, row_stride, col_stride};
  }
  template <typename U, typename = std::enable_if_t<std::is_same_v<U, const T>>>
  operator BasicMatrixView<U>() const {  // NOLINT(google-explicit-constructor): float -> const
    return {data, rows, cols, row_stride, col_stride};
  }
};
using MatrixView = BasicMatrixView<float>;
using ConstMatrixView = BasicMatrixView<const float>;

// A rows x cols matrix of 16-bit floats (bits in uint16_t; type DType::kBF16 or DType::kF16),
// strides in elements, as MatrixView. Read-only: the products take 16-bit weights as an
// operand, never as a result.
struct HalfMatrixView {
  const uint16_t* data = nullptr;
  DType type = DType::kBF16;
  size_t rows = 0;
  size_t cols = 0;
  ptrdiff_t row_stride = 0;
  ptrdiff_t col_stride = 1;

  HalfMatrixView Block(size_t r0, size_t c0, size_t nr, size_t nc) const {
    return {
        data + static_cast<ptrdiff_t>(r0) * row_stride + static_cast<ptrdiff_t>(c0) * col_stride,
        type,
        nr,
        nc,
        row_stride,
        col_stride};
  }
};

// Depth of the KC block that starts at step pc of a packing or product k steps deep, for a
// block size kc (GemmBlocking().kc): kc, except that the last block takes the rest, from kc to
// 2 kc - 1 steps (all of k when k < 2 kc). Why: each block costs every register tile one pass
// over its c (loads, stores, the tile's setup), which a short last block pays for few
// multiply-adds: kernels/README.md "Direct micro-kernel tiles" has the measurements. Blocks
// start at multiples of kc.
inline size_t KcBlockDepth(size_t kc, size_t k, size_t pc) { return k - pc < 2 * kc ? k - pc : kc; }

// Whether the KC blocks of the leading k steps of a packing packed_k deep (the packing's blocks,
// the last one used cut at k) are the blocks of a packing k deep: true unless k ends inside a
// block that a packing of depth k would merge with the one before (e.g. k = KC + 3 of a packing
// 3 KC deep). GemmBlisPackedAB needs it of its packed a and b.
inline bool LeadingKcBlocksAreOwn(size_t kc, size_t packed_k, size_t k) {
  for (size_t pc = 0, depth = 0; pc < k; pc += depth) {
    depth = KcBlockDepth(kc, packed_k, pc);
    if (KcBlockDepth(kc, k, pc) != (depth < k - pc ? depth : k - pc)) return false;
  }
  return true;
}

// Alignment, in bytes, Gemm requires of its scratch.
inline constexpr size_t kGemmScratchAlignment = 64;

// Bytes of packing scratch one Gemm call needs. Fixed for the process: it depends only on the
// register and cache block sizes of the BLIS configuration chosen at run time and the KC of the
// dispatched target (2.2 MiB on haswell/zen, 2.4 MiB with AVX-512, at most 3.1 MiB on x86-64:
// see the blocking note above).
// Initializes BLIS on first use.
size_t GemmScratchBytes();

// c = alpha * a * b + beta * c, single-threaded. Shapes: a [m, k], b [k, n], c [m, n]; any
// strides (c must not overlap a or b). beta == 0 overwrites c without reading it (NaN in c does
// not propagate); k == 0 or alpha == 0 gives c = beta * c without reading a and b.
// `scratch`: GemmScratchBytes() bytes, kGemmScratchAlignment-aligned, used by this call only
// (one buffer per thread for concurrent calls). No heap allocation, no locks; safe to call
// concurrently from several threads with separate scratch.
// Shape mismatches are a programming error in mha (callers validate): checked by debug asserts.
void Gemm(float alpha, const ConstMatrixView& a, const ConstMatrixView& b, float beta,
          const MatrixView& c, void* scratch);

// c = alpha * a * b + beta * c with b in bf16 or f16 (16-bit weights: b = w^T of an nn.Linear
// weight w [n, k], so b.row_stride must be 1). Same contract, scratch and path choice as Gemm
// (GEMV for a few rows); the 16-bit elements are widened exactly to f32 while packing (or while
// streaming, on the GEMV path), so the result is bitwise the result of Gemm on the widened
// matrix: 16-bit weights cost accuracy only through their own rounding, never in the product.
void GemmHalfB(float alpha, const ConstMatrixView& a, const HalfMatrixView& b, float beta,
               const MatrixView& c, void* scratch);

// c = a * w^T (overwritten, not read) for quantized weights w [n, k] (quant.h: kI8 / kI4, an
// nn.Linear weight; c [m, n], a [m, k] any strides). Gemm's path choice and scratch: on the GEMV
// route (a few rows, a.col_stride 1) GemvQuant (gemv_quant.h), else the driver, which
// dequantizes the weights' rows into the scratch's widening panel as it packs them. Either way
// the result is bitwise kernels::Gemm's (alpha 1, beta 0) on the dequantized matrix (code *
// scale rounded to f32), where GemvQuant's lane count equals Gemv's (gemv_quant.h). A matrix
// with int8_activations (Compute::kInt8) goes to GemmInt8 instead (gemv_int8.h: a's rows
// quantized to int8, integer dot products; needs a.col_stride 1).
struct QuantMatrix;
void GemmQuantB(const ConstMatrixView& a, const QuantMatrix& w, const MatrixView& c, void* scratch);

// A b [k, n] operand packed once and multiplied by many a's (GemmBlisPackedB): attention packs each
// key block's K^T and V once and runs a few query rows at a time against them, so that each
// strip's scores and probabilities stay in L1/L2 between the two products (runtime/attention.cc),
// and ParallelGemm packs a projection's weights once for all of its row panels.
// Layout: the packing of Gemm's driver for all columns at once: k in the KC blocks of
// KcBlockDepth (GemmBlocking().kc), each block holding ceil(packed_n / NR) NR-wide
// micro-panels, zero-padded to full panels. A PackedB may be a column range of a larger packing
// (Columns): it then starts at micro-panel col0 / NR of each block of a packing packed_n columns
// wide. It may also be the leading rows [0, k) of a packing packed_k rows deep (LeadingRows): the
// blocks keep the packing's depths (the micro-panels of the block at pc are KcBlockDepth(KC,
// packed_k, pc) steps long) and the products read the first k steps, so they give the bits of the
// whole packing's product by an a whose columns past k are zero. Attention's causal strips multiply
// their probabilities by the leading rows of a key block's packed V (the keys before their causal
// limit), and windowed strips by rows from their band's start (Rows).
struct PackedB {
  const float* data = nullptr;
  size_t k = 0;
  size_t n = 0;
  size_t packed_n = 0;  // columns of the whole packing (each KC block's width); >= col0 + n
  size_t col0 = 0;      // first column of this operand in the packing, a multiple of NR
  size_t packed_k = 0;  // rows of the whole packing (sets each KC block's depth); >= k

  // Columns [c0, c0 + nc) of this operand; c0 must be a multiple of GemmBlocking().nr.
  PackedB Columns(size_t c0, size_t nc) const {
    return {data, k, nc, packed_n, col0 + c0, packed_k};
  }
  // Rows [0, kk) of this operand, kk <= k.
  PackedB LeadingRows(size_t kk) const { return {data, kk, n, packed_n, col0, packed_k}; }
  // Rows [r0, r0 + kk) of an operand whose packing is one KC block deep (packed_k <=
  // GemmBlocking().kc, asserted by attention, its user): each micro-panel's k steps are packnr
  // floats apart, so the rows start r0 steps in, and packed_k keeps the panels' length.
  PackedB Rows(size_t r0, size_t kk, size_t packnr) const {
    return {data + r0 * packnr, kk, n, packed_n, col0, packed_k};
  }
};

// The register and cache blocks of the BLIS configuration selected at run time: callers that
// split a product into pieces (ParallelGemm) align the pieces to them.
struct GemmBlocks {
  size_t mr = 0;             // rows of the micro-kernel's C tile
  size_t nr = 0;             // columns of the micro-kernel's C tile (PackedB column alignment)
  size_t packnr = 0;         // floats per k step of a packed NR-wide micro-panel (>= nr)
  size_t mc = 0;             // rows of A packed per block
  size_t kc = 0;             // depth of a packed block
  bool prefers_rows = true;  // the micro-kernel stores row-major C tiles fastest
};
const GemmBlocks& GemmBlocking();

// Floats PackB writes for a [k, n] b (a multiple of 16, so consecutive packed operands keep the
// 64-byte alignment of the first).
size_t PackedBFloats(size_t k, size_t n);

// Packs b [k, n] (any strides) into dst: PackedBFloats(b.rows, b.cols) floats,
// kGemmScratchAlignment-aligned. Returns the packed operand (pointing at dst).
PackedB PackB(const ConstMatrixView& b, float* dst);

// Packs only columns [c0, c0 + nc) of b into dst, where they lie in PackB(b, dst)'s layout
// (c0 a multiple of GemmBlocking().nr): disjoint column ranges can be packed by different
// threads into one packing. Returns the packed operand of those columns.
PackedB PackBColumns(const ConstMatrixView& b, size_t c0, size_t nc, float* dst);

// c = alpha * a * b + beta * c for a packed b, with Gemm's contract (beta == 0 does not read c;
// scratch: GemmScratchBytes(), which this call uses for packing a). Shapes: a [m, b.k],
// c [m, b.n]. Always runs the blocked driver (never the GEMV path) with the micro-kernel storing
// c as it lies: the result is bitwise the one Gemm gives when it takes its driver without
// swapping operands (c stored the way the micro-kernel prefers), and each row of c depends
// only on the same row of a, so splitting a and c into row strips gives the same bits.
void GemmBlisPackedB(float alpha, const ConstMatrixView& a, const PackedB& b, float beta,
                     const MatrixView& c, void* scratch);

// An a [m, k] operand packed once and multiplied by many b's (GemmBlisPackedAB): attention packs a
// task's Q rows once for all of its key blocks (runtime/attention.cc). Layout: the packing of
// Gemm's driver for all rows at once: k in the KC blocks of KcBlockDepth, each block holding
// ceil(packed_m / MR) MR-tall micro-panels, zero-padded to full panels. A PackedA may be a row
// range of a larger packing (Rows): it then starts at micro-panel row0 / MR of each block.
struct PackedA {
  const float* data = nullptr;
  size_t m = 0;
  size_t k = 0;
  size_t packed_m = 0;  // rows of the whole packing (each KC block's height); >= row0 + m
  size_t row0 = 0;      // first row of this operand in the packing, a multiple of MR

  // Rows [r0, r0 + nr) of this operand; r0 must be a multiple of GemmBlocking().mr.
  PackedA Rows(size_t r0, size_t nr) const { return {data, nr, k, packed_m, row0 + r0}; }
};

// Floats PackA writes for an [m, k] a (a multiple of 16, like PackedBFloats).
size_t PackedAFloats(size_t m, size_t k);

// Packs a [m, k] (any strides) into dst: PackedAFloats(a.rows, a.cols) floats,
// kGemmScratchAlignment-aligned. Returns the packed operand (pointing at dst).
PackedA PackA(const ConstMatrixView& a, float* dst);

// c = alpha * a * b + beta * c for a packed a and a packed b (Gemm's contract for beta; no
// scratch: nothing is packed). Shapes: a [m, k], b [k, n], c [m, n]. The result is bitwise the
// one GemmBlisPackedB gives for the unpacked a (the same micro-kernel calls on the same packed
// values, k blocks in the same order), so a row range of a packed a gives the same bits as the
// same rows through GemmBlisPackedB. b's KC blocks must pair with a's
// (LeadingKcBlocksAreOwn(GemmBlocking().kc, b.packed_k, b.k)): a is packed a.k steps deep.
void GemmBlisPackedAB(float alpha, const PackedA& a, const PackedB& b, float beta,
                      const MatrixView& c);

// c = beta * c (beta == 0 writes zeros without reading c): the trivial case of the products
// (k == 0 or alpha == 0).
void ScaleC(float beta, const MatrixView& c);

// Initializes BLIS and reads the micro-kernel and block sizes (once, thread-safe); cheap after
// the first call. Called by contexts before a first parallel run so timing starts warm.
void GemmInit();

// The name BLIS gives the architecture configuration it selected at run time (e.g. "zen3",
// "skx", "cortexa57", "generic").
const char* GemmArchName();

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMM_H_
