// Dynamic dispatch of the GEMV kernel: gemv-inl.h is compiled once per Highway target
// (foreach_target); one dispatch per call (a call covers a whole projection panel).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemv.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/gemv-inl.h"

#if HWY_ONCE
#include <cassert>

#include "kernels/gemv.h"

namespace mha {
namespace kernels {

HWY_EXPORT(GemvRows);
HWY_EXPORT(GemvRowsBF16);
HWY_EXPORT(GemvRowsF16);

void Gemv(float alpha, const ConstMatrixView& a, const ConstMatrixView& b, float beta,
          const MatrixView& c) {
  assert(a.rows == c.rows && "Gemv: a.rows must equal c.rows");
  assert(b.cols == c.cols && "Gemv: b.cols must equal c.cols");
  assert(a.cols == b.rows && "Gemv: a.cols must equal b.rows");
  assert(GemvLayoutMatches(a, b) && "Gemv: needs a.col_stride == 1 and b.row_stride == 1");
  if (c.rows == 0 || c.cols == 0) return;
  HWY_DYNAMIC_DISPATCH(GemvRows)
  (c.rows, c.cols, a.cols, alpha, a.data, a.row_stride, b.data, b.col_stride, beta, c.data,
   c.row_stride, c.col_stride);
}

void GemvHalf(float alpha, const ConstMatrixView& a, const HalfMatrixView& b, float beta,
              const MatrixView& c) {
  assert(a.rows == c.rows && "GemvHalf: a.rows must equal c.rows");
  assert(b.cols == c.cols && "GemvHalf: b.cols must equal c.cols");
  assert(a.cols == b.rows && "GemvHalf: a.cols must equal b.rows");
  assert(a.col_stride == 1 && b.row_stride == 1 &&
         "GemvHalf: needs a.col_stride == 1 and b.row_stride == 1");
  if (c.rows == 0 || c.cols == 0) return;
  if (b.type == DType::kBF16) {
    HWY_DYNAMIC_DISPATCH(GemvRowsBF16)
    (c.rows, c.cols, a.cols, alpha, a.data, a.row_stride, b.data, b.col_stride, beta, c.data,
     c.row_stride, c.col_stride);
  } else {
    HWY_DYNAMIC_DISPATCH(GemvRowsF16)
    (c.rows, c.cols, a.cols, alpha, a.data, a.row_stride, b.data, b.col_stride, beta, c.data,
     c.row_stride, c.col_stride);
  }
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
