// Dynamic dispatch of the bf16 rounding and packing (pack_bf16.h): pack_bf16-inl.h is compiled
// once per Highway target (foreach_target); one dispatch per call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/pack_bf16.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/pack_bf16-inl.h"

#if HWY_ONCE
#include "kernels/pack_bf16.h"

namespace mha {
namespace kernels {

HWY_EXPORT(RoundRowsToBF16);
HWY_EXPORT(PackBF16Block);

void RoundRowsToBF16(const float* a, ptrdiff_t row_stride, size_t rows, size_t cols, size_t padded,
                     uint16_t* dst, size_t dst_stride) {
  if (rows == 0 || padded == 0) return;
  HWY_DYNAMIC_DISPATCH(RoundRowsToBF16)(a, row_stride, rows, cols, padded, dst, dst_stride);
}

void PackBF16Block(const float* b, ptrdiff_t row_stride, ptrdiff_t col_stride, size_t kc, size_t n,
                   uint16_t* block, size_t panel_stride) {
  if (kc == 0 || n == 0) return;
  HWY_DYNAMIC_DISPATCH(PackBF16Block)(b, row_stride, col_stride, kc, n, block, panel_stride);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
