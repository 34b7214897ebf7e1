// c = alpha * a * b + beta * c for a b packed by kernels::PackB (the BLIS micro-kernel's
// layout), reading a where it lies: mha's own register-blocked Highway micro-kernel broadcasts
// each a element from its row and multiplies it with the packed NR-wide micro-panels of b.
// Plain declaration; per-target code in gemm_direct-inl.h, dispatch in gemm_direct.cc.
//
// Why: kernels::GemmBlisPackedB packs a (MR-tall micro-panels) on every call and then calls BLIS's
// micro-kernel per MR x NR tile. For the products whose b is packed once for many calls
// (prepacked projection weights, attention's per-key-block K^T and V) a is a few rows: packing it
// costs as much as a good share of the product, and BLIS pads the last row tile to MR rows
// (16 rows run as 18 on MR 6). kernels/README.md has the measurements per route.
//
// Layout: b is a PackedB (gemm.h): k in the KC blocks of KcBlockDepth, each block holding
// NR-wide micro-panels of packnr floats per k step, possibly a column range (col0) of a wider
// packing. a [m, b.k] and c [m, b.n] take any strides (c must not overlap a or b). No
// alignment required.
//
// Numerics: the micro-kernel's own. Each element of c is, per KC block of k in order, a chain
// of fused multiply-adds over the block's k in increasing order starting from zero (acc), then
// c = alpha * acc (first block, beta == 0: c not read) or c = fma(c, beta', alpha * acc) with
// beta' = beta for the first block and 1 for the later ones. The same operations run for an
// element wherever it sits, so results do not depend on how a caller splits a and c into calls,
// on threads or on alignment; on targets without FMA the multiply-adds round twice (as Highway's
// MulAdd there). BLIS's haswell/zen sgemm micro-kernel (6 x 16, zen3 on this machine) performs
// exactly these operations, so on those configurations the result is bitwise GemmBlisPackedB's
// (tests/gemm_direct_test.cc checks it where it applies).
//
// Coverage: the kernel needs NR to be a multiple of the dispatched target's f32 lanes (every
// NR-wide micro-panel is whole vectors): true of every x86 configuration with NR 16 (haswell,
// zen, zen2, zen3) on AVX2, SSE and scalar targets, and of NR 12 / 8 panels on 4-lane targets.
// Elsewhere (e.g. skx's NR 12 on AVX-512) GemmDirectPackedB returns false without touching c and
// the routes (gemm_route.h) take GemmBlisPackedB.
#ifndef MHA_KERNELS_GEMM_DIRECT_H_
#define MHA_KERNELS_GEMM_DIRECT_H_

#include "kernels/gemm.h"

namespace mha {
namespace kernels {

// True if GemmDirectPackedB runs on this CPU's dispatched target with the BLIS configuration
// selected at run time (see Coverage above). Fixed for the process unless a test forces a
// target (kernels::ForceTarget).
bool GemmDirectSupported();

// True if the kernel runs on the dispatched target over NR-wide micro-panels (whole vectors):
// GemmDirectSupported for a configuration's NR, which gemm.cc asks while it chooses the blocking
// (before GemmBlocking exists).
bool GemmDirectRunsPanels(size_t nr);

// c = alpha * a * b + beta * c with Gemm's contract for alpha and beta (beta == 0 does not read
// c; b.k == 0 or alpha == 0 gives c = beta * c), then, if bias is not null, c[i, j] += bias[j]
// (bias [b.n], contiguous): one more rounded add per element in the last k block's store, so
// the bits are those of the product followed by a separate pass adding the bias (a projection's
// bias without a pass over its output). Shapes: a [m, b.k], c [m, b.n]. No scratch, no
// allocation, single-threaded. Returns false, with c untouched, when
// GemmDirectSupported() is false. Shape mismatches are programming errors: debug asserts.
[[nodiscard]] bool GemmDirectPackedB(float alpha, const ConstMatrixView& a, const PackedB& b,
                                     float beta, const float* bias, const MatrixView& c);
// The same without a bias.
[[nodiscard]] bool GemmDirectPackedB(float alpha, const ConstMatrixView& a, const PackedB& b,
                                     float beta, const MatrixView& c);

// What GemmDirectPackedBDual writes to its second destination.
enum class SecondStore {
  kCopy,  // c2 = the c just computed (bits equal to c's)
  kAdd,   // c2 += alpha * a * b: per KC block of k, c2 = c2 + alpha * acc, one rounded add
};

// GemmDirectPackedB, and in the same stores a second destination c2 [m, b.n] (any strides, not
// overlapping a, b or c). Why: one level of Strassen (gemm_strassen.h) needs each of several
// partial products in two of c's blocks; storing them from the registers replaces a copy or an
// add pass over [m, n] afterwards. Per element, c gets exactly GemmDirectPackedB's bits; with
// kCopy c2 gets them too, with kAdd and k within one KC block (k < 2 GemmBlocking().kc) c2
// gets c2 + alpha * a * b rounded once, as kernels::AddInto would add a stored product (deeper k
// adds each KC block's part in turn). Returns false, with c and c2 untouched, when
// GemmDirectSupported() is false.
[[nodiscard]] bool GemmDirectPackedBDual(float alpha, const ConstMatrixView& a, const PackedB& b,
                                         float beta, const float* bias, SecondStore mode,
                                         const MatrixView& c, const MatrixView& c2);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMM_DIRECT_H_
