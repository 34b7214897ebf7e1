// A few rows of activations times quantized weights: c = a * w^T for w [n, k] in quant.h's
// layout (kI8 / kI4), the decode step's projections. Plain declaration; per-target code in
// gemv_quant-inl.h, dispatch in gemv_quant.cc.
//
// Why: a decoded token multiplies 1..8 rows by every projection matrix, so the step reads every
// weight once: quantized weights are 1/4 (kI8) or 5/32 (kI4, block 32) of the f32 bytes to
// stream. Each weight row is read from memory once per call and dequantized in registers (codes
// widened to f32, times the row's or block's scale) into the same multiply-adds as Gemv's.
//
// Layout: a [m, k] with contiguous rows (a.col_stride == 1, any row stride), w rows [0, n) of a
// quantized matrix with k == w.cols, c [m, n] with any strides (no overlap with a). No alignment.
//
// Numerics: each element is bitwise what kernels::Gemv (gemv.h, alpha 1, beta 0) gives for the
// dequantized weights (code * scale rounded to f32, quant.h) wherever the target's f32 vectors
// have at most 16 lanes (every x86 target, NEON, SVE up to 512 bits; wider SVE vectors are
// capped at 16 lanes here, so the lane sums are ordered differently there): the same lane-wise
// fused multiply-adds over k in increasing order, the same lane sum, the same scalar tail. Its
// error bound is therefore Gemv's, against the dequantized weights. Results do not depend on
// how c is split, on threads or on alignment. Tested on every target in tests/quant_test.cc.
#ifndef MHA_KERNELS_GEMV_QUANT_H_
#define MHA_KERNELS_GEMV_QUANT_H_

#include "kernels/gemm.h"
#include "kernels/quant.h"

namespace mha {
namespace kernels {

// c = a * w^T for a [m, k], w [n, k] (n = w.rows, k = w.cols), c [m, n]: c is overwritten, not
// read. Single-threaded, no allocation, no scratch. Shape mismatches are programming errors
// (debug asserts).
void GemvQuant(const ConstMatrixView& a, const QuantMatrix& w, const MatrixView& c);

// Whether GemvQuant's sums are ordered as Gemv's on the dispatched target (its f32 vectors have
// at most 16 lanes), so that its results are Gemv's bits on the dequantized weights.
bool GemvQuantOrdersAsGemv();

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMV_QUANT_H_
