// Dynamic dispatch of the GEMV over quantized weights: gemv_quant-inl.h is compiled once per
// Highway target (foreach_target); one dispatch per call (a call covers a projection panel).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/gemv_quant.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/gemv_quant-inl.h"

#if HWY_ONCE
#include <cassert>

#include "kernels/gemv_quant.h"

namespace mha {
namespace kernels {

HWY_EXPORT(GemvQuantRows);
HWY_EXPORT(OrdersAsGemv);

bool GemvQuantOrdersAsGemv() { return HWY_DYNAMIC_DISPATCH(OrdersAsGemv)(); }

void GemvQuant(const ConstMatrixView& a, const QuantMatrix& w, const MatrixView& c) {
  assert(a.rows == c.rows && "GemvQuant: a.rows must equal c.rows");
  assert(w.rows == c.cols && "GemvQuant: w.rows must equal c.cols");
  assert(a.cols == w.cols && "GemvQuant: a.cols must equal w.cols");
  assert(a.col_stride == 1 && "GemvQuant: needs a.col_stride == 1");
  if (c.rows == 0 || c.cols == 0) return;
  HWY_DYNAMIC_DISPATCH(GemvQuantRows)
  (c.rows, a.data, a.row_stride, w, c.data, c.row_stride, c.col_stride);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
