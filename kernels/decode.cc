// Dynamic dispatch of the decode kernels: decode-inl.h is compiled once per Highway target
// (foreach_target); each entry point dispatches once per call (one call covers a whole block of
// query rows against a block of cache rows).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/decode-inl.h"

#if HWY_ONCE
#include "kernels/decode.h"

namespace mha {
namespace kernels {

HWY_EXPORT(QueryKeyScores);
HWY_EXPORT(AccumulateWeightedValues);

void QueryKeyScores(const float* q, size_t rows, ptrdiff_t q_stride, const void* keys, DType type,
                    ptrdiff_t key_stride, const float* key_scales, size_t n, size_t hd,
                    float* scores, ptrdiff_t score_stride) {
  if (rows == 0 || n == 0) return;
  HWY_DYNAMIC_DISPATCH(QueryKeyScores)
  (q, rows, q_stride, keys, static_cast<int>(type), key_stride, key_scales, n, hd, scores,
   score_stride);
}

void AccumulateWeightedValues(const float* p, size_t rows, ptrdiff_t p_stride, const void* values,
                              DType type, ptrdiff_t value_stride, const float* value_scales,
                              size_t n, size_t hd, float* acc, ptrdiff_t acc_stride) {
  if (rows == 0 || n == 0 || hd == 0) return;
  HWY_DYNAMIC_DISPATCH(AccumulateWeightedValues)
  (p, rows, p_stride, values, static_cast<int>(type), value_stride, value_scales, n, hd, acc,
   acc_stride);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
