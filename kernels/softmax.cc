// Dynamic dispatch of the softmax kernels: softmax-inl.h is compiled once per Highway target
// (foreach_target), and each entry point dispatches once per call to the best target the CPU
// supports. The per-row loops live in the per-target code.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/softmax.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/softmax-inl.h"

#if HWY_ONCE
#include "kernels/softmax.h"

namespace mha {
namespace kernels {

HWY_EXPORT(ExpNonPositiveRow);
HWY_EXPORT(SoftmaxRows);
HWY_EXPORT(OnlineSoftmaxUpdate);
HWY_EXPORT(OnlineSoftmaxFinish);

void ExpNonPositiveRow(const float* x, float* y, size_t n) {
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(ExpNonPositiveRow)(x, y, n);
}

void SoftmaxRows(float* scores, size_t rows, size_t cols, ptrdiff_t row_stride, float scale,
                 const SoftmaxMasks& masks) {
  if (rows == 0 || cols == 0) return;
  HWY_DYNAMIC_DISPATCH(SoftmaxRows)(scores, rows, cols, row_stride, scale, masks);
}

void OnlineSoftmaxUpdate(float* scores, size_t rows, size_t cols, ptrdiff_t row_stride,
                         float scale, const SoftmaxMasks& masks, float* row_max, float* row_sum,
                         float* acc, size_t acc_cols, ptrdiff_t acc_row_stride) {
  if (rows == 0 || cols == 0) return;
  HWY_DYNAMIC_DISPATCH(OnlineSoftmaxUpdate)(scores, rows, cols, row_stride, scale, masks,
                                            row_max, row_sum, acc, acc_cols, acc_row_stride);
}

void OnlineSoftmaxFinish(float* acc, size_t rows, size_t acc_cols, ptrdiff_t acc_row_stride,
                         const float* row_sum) {
  if (rows == 0 || acc_cols == 0) return;
  HWY_DYNAMIC_DISPATCH(OnlineSoftmaxFinish)(acc, rows, acc_cols, acc_row_stride, row_sum);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
