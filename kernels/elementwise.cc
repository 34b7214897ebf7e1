// Dynamic dispatch of the element-wise kernels: elementwise-inl.h is compiled once per Highway
// target (foreach_target), and each entry point dispatches once per call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/elementwise-inl.h"

#if HWY_ONCE
#include "kernels/elementwise.h"

namespace mha {
namespace kernels {

HWY_EXPORT(AddBiasToRows);
HWY_EXPORT(WinogradSums);
HWY_EXPORT(ScaleBy);
HWY_EXPORT(AddInto);
HWY_EXPORT(F32ToBF16);
HWY_EXPORT(BF16ToF32);
HWY_EXPORT(F16ToF32);
HWY_EXPORT(F32ToF16);

void AddBiasToRows(const float* bias, float* y, size_t rows, size_t cols, ptrdiff_t row_stride) {
  if (rows == 0 || cols == 0) return;
  HWY_DYNAMIC_DISPATCH(AddBiasToRows)(bias, y, rows, cols, row_stride);
}

void WinogradSums(const float* a, ptrdiff_t lda, size_t h, size_t k2, float* s1, float* s2,
                  float* s3, float* s4, ptrdiff_t lds) {
  if (h == 0 || k2 == 0) return;
  HWY_DYNAMIC_DISPATCH(WinogradSums)(a, lda, h, k2, s1, s2, s3, s4, lds);
}

void ScaleBy(float s, float* y, size_t n) {
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(ScaleBy)(s, y, n);
}

void AddInto(const float* x, float* y, size_t n) {
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(AddInto)(x, y, n);
}

void F32ToBF16(const float* x, uint16_t* y, size_t n) {
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(F32ToBF16)(x, y, n);
}

void BF16ToF32(const uint16_t* x, float* y, size_t n) {
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(BF16ToF32)(x, y, n);
}

void F16ToF32(const uint16_t* x, float* y, size_t n) {
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(F16ToF32)(x, y, n);
}

void F32ToF16(const float* x, uint16_t* y, size_t n) {
  if (n == 0) return;
  HWY_DYNAMIC_DISPATCH(F32ToF16)(x, y, n);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
