// c = a * b by one level of Strassen's algorithm (Winograd's variant: 7 half-size products and
// 15 block additions instead of 8 products) for a b packed once: the projection weights.
//
// Why: a projection [m, k] x [k, n] is FMA-bound; its 2 m k n flops already run at ~0.93 of the
// machine's FMA peak (mha's direct micro-kernel, gemm_direct.h), so the only way to make it much
// faster is fewer flops. Seven products of [m/2, k/2] x [k/2, n/2] do 7/8 of them; the sums of
// b's blocks are formed once, when the weights are packed (7 packed operands: 1.75x the packed
// b), a's four sums are one pass over a, and the products combine in the micro-kernel's stores
// (GemmDirectPackedBDual). Half depths below 256 make the products shorter than the kernel
// likes: callers need k >= 512 (kernels/README.md, kStrassenPackedB).
//
// Numerics: every element of c is a sum of products of sums of a's and b's elements; its
// rounding error is a few times that of the plain product (bounded by a small multiple of
// eps * sum_k |a_ik| |b_kj| with the block norms; tests/gemm_test.cc checks 8 eps * k * max|a|
// max|b|). Each operation is fixed by the shapes (the block split at m/2, k/2, n/2) and the
// kernels' own numerics, so results do not depend on how a caller splits c's columns into
// calls, on threads or on alignment.
#ifndef MHA_KERNELS_GEMM_STRASSEN_H_
#define MHA_KERNELS_GEMM_STRASSEN_H_

#include <cstddef>

#include "kernels/gemm.h"

namespace mha {
namespace kernels {

// The seven operands of b [k, n] (k, n even) in b's 2 x 2 blocks B11 (rows [0, k/2), columns
// [0, n/2)), B12, B21, B22, each [k/2, n/2] packed by PackB, in Winograd's order:
// op[0] = B11, op[1] = B21, op[2] = B22, op[3] = T4 = T2 - B21, op[4] = T1 = B12 - B11,
// op[5] = T2 = B22 - T1, op[6] = T3 = B22 - B12 (each difference one rounded f32 subtract).
// Columns(c0, nc) selects columns [c0, c0 + nc) of every operand: c's columns c0.. of its left
// half and n/2 + c0.. of its right half.
struct StrassenPackedB {
  PackedB op[7];

  bool empty() const { return op[0].data == nullptr; }
  size_t half_k() const { return op[0].k; }
  size_t half_n() const { return op[0].n; }
  StrassenPackedB Columns(size_t c0, size_t nc) const {
    StrassenPackedB s;
    for (int i = 0; i < 7; ++i) s.op[i] = op[i].Columns(c0, nc);
    return s;
  }
};

// Floats PackBStrassen writes for b [k, n] (k, n even): seven PackedBFloats(k/2, n/2).
size_t StrassenPackedBFloats(size_t k, size_t n);

// Floats of the temporary PackBStrassen needs for b [k, n]: two [k/2, n/2] blocks.
size_t StrassenPackTmpFloats(size_t k, size_t n);

// Packs b [k, n] (any strides; k and n even and non-zero) into dst (StrassenPackedBFloats
// floats, kGemmScratchAlignment-aligned), using tmp (StrassenPackTmpFloats floats) for the
// block differences. Returns the operands (pointing into dst).
StrassenPackedB PackBStrassen(const ConstMatrixView& b, float* dst, float* tmp);

// a [m, k] (m, k even, unit column stride) in 2 x 2 blocks of [m/2, k/2] and Winograd's four
// sums of them: S1 = A21 + A22, S2 = S1 - A11, S3 = A11 - A21, S4 = A12 - S2 (each block one
// rounded f32 add per element). Made by StrassenSumsOfA; the sums live in the caller's memory,
// so one set serves every product of those rows of a (each column range of b, and each of
// several b's that multiply the same a, as q, k and v do).
struct StrassenA {
  ConstMatrixView a11, a12, a21, a22;
  ConstMatrixView s1, s2, s3, s4;
};

// Floats of the sums StrassenSumsOfA writes: 4 * (m/2) * (k/2).
size_t StrassenSumsFloats(size_t m, size_t k);

// Writes the sums of a [m, k] (m, k even, a.col_stride 1) into `sums` (StrassenSumsFloats
// floats, any alignment, not overlapping a) and returns the blocks and sums.
StrassenA StrassenSumsOfA(const ConstMatrixView& a, float* sums);

// c = a * b (+ bias on every row) for c = [c_left | c_right], each [m, b.half_n()], the left
// and right halves of the product's columns that b (possibly a Columns range) selects; bias_left
// / bias_right [b.half_n()] (contiguous, or null) are added once after the product as
// GemmDirectPackedB adds its bias. a from StrassenSumsOfA of an [m, 2 * b.half_k()] matrix; c
// halves with unit column stride, not overlapping a, its sums, b or each other. The seven
// products accumulate into c's blocks, each partial product that two blocks need stored to both
// by GemmDirectPackedBDual (no scratch, no pass over c after the products). Single-threaded, no
// allocation. Returns false, with c untouched, where GemmDirectPackedB does not run
// (GemmDirectSupported()). Shape mismatches are programming errors: debug asserts.
[[nodiscard]] bool GemmStrassenPackedB(const StrassenA& a, const StrassenPackedB& b,
                                       const float* bias_left, const float* bias_right,
                                       const MatrixView& c_left, const MatrixView& c_right);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMM_STRASSEN_H_
