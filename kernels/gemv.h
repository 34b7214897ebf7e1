// Matrix times transposed weights for a few rows: c = alpha * a * w^T + beta * c, with w in
// nn.Linear layout ([out, in] row-major), i.e. GEMM with b = w^T viewed with unit row stride.
// Plain declaration; per-target code in gemv-inl.h, dispatch in gemv.cc.
//
// Why: decoding one token multiplies 1..8 input rows by every projection matrix. kernels::Gemm
// would pack all of b (a transpose of the whole weight matrix) for those few rows; here each
// weight row (a column of b, contiguous) is streamed once from memory and multiplied with every
// row of a while in registers/L1, so the cost is one read of w: memory bound, near copy
// bandwidth. kernels::Gemm calls this for a.rows <= kGemvMaxRows (gemm_route.h) when the layouts
// match.
//
// Layout: a [m, k] with contiguous rows (a.col_stride == 1), b [k, n] with contiguous columns
// (b.row_stride == 1: column j of b = row j of w, k floats at b.data + j * b.col_stride), c
// [m, n] with any strides (must not overlap a or b). No alignment required.
//
// Numerics: every element is c_ij = alpha * dot_ij + beta * c_ij (beta == 0: alpha * dot_ij,
// c not read). dot_ij = lane-wise fused multiply-adds over k in increasing order, one vector of
// V lanes at a time (V: the target's f32 lanes), then the sum of the V lanes (Highway's
// SumOfLanes), then the k % V remaining products added in order. The same operations run for
// an element wherever it sits (any m, n, block of rows or columns), so results do not depend
// on how a caller splits c, on threads or on alignment; they differ between SIMD targets (V and
// the lane sum's order change). Error against the exact dot product of the f32 inputs, to first
// order: |dot - exact| <= (k / V + log2(V) + 2 * (k % V) + 2) * 2^-24 * sum_p |a_ip b_pj|, which
// is <= (2 k + 8) * 2^-24 * sum_p |a_ip b_pj| for any V <= 64; then alpha * dot and beta * c
// round once each and their sum once.
// Tested on every target against a double reference in tests/gemv_test.cc.
#ifndef MHA_KERNELS_GEMV_H_
#define MHA_KERNELS_GEMV_H_

#include <cstddef>

#include "kernels/gemm.h"
#include "kernels/gemm_route.h"  // kGemvMaxRows

namespace mha {
namespace kernels {

// True if Gemv accepts these operands' layouts: a.col_stride == 1 and b.row_stride == 1.
inline bool GemvLayoutMatches(const ConstMatrixView& a, const ConstMatrixView& b) {
  return a.col_stride == 1 && b.row_stride == 1;
}

// c = alpha * a * b + beta * c for a [m, k], b [k, n], c [m, n] with GemvLayoutMatches(a, b);
// any m (rows are processed a few at a time, each column of b read from memory once per call).
// beta == 0 overwrites c without reading it. Single-threaded, no allocation, no scratch. Shape
// and layout mismatches are programming errors: checked by debug asserts.
void Gemv(float alpha, const ConstMatrixView& a, const ConstMatrixView& b, float beta,
          const MatrixView& c);

// The same with 16-bit weights (b.row_stride == 1), widened exactly to f32 as they are loaded:
// bitwise the result of Gemv on the widened matrix. Half the bytes of w to stream.
void GemvHalf(float alpha, const ConstMatrixView& a, const HalfMatrixView& b, float beta,
              const MatrixView& c);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMV_H_
