// Dynamic dispatch of the RoPE rotation and RMSNorm kernels: rope-inl.h is compiled once per
// Highway target (foreach_target), and each entry point dispatches once per call. RopeAngles is
// plain scalar code (libm's sin and cos in double), the same on every target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/rope.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/rope-inl.h"

#if HWY_ONCE
#include <cmath>

#include "kernels/rope.h"

namespace mha {
namespace kernels {

HWY_EXPORT(ApplyRope);
HWY_EXPORT(RmsNormRows);

void RopeAngles(const int32_t* positions, int64_t pos0, size_t rows, const double* inv_freq,
                size_t half, float* cos, float* sin, double attention) {
  for (size_t r = 0; r < rows; ++r) {
    const double p = static_cast<double>(positions ? positions[r] : pos0 + static_cast<int64_t>(r));
    float* c = cos + r * half;
    float* s = sin + r * half;
    for (size_t i = 0; i < half; ++i) {
      // libm reduces the argument exactly, so the only error before the f32 rounding is the
      // product's (relative 2^-53) and libm's (< 1 ULP in double).
      // HF multiplies the f32 cos and sin by attention_scaling; here one rounding, after it.
      const double angle = p * inv_freq[i];
      c[i] = static_cast<float>(std::cos(angle) * attention);
      s[i] = static_cast<float>(std::sin(angle) * attention);
    }
  }
}

void ApplyRope(float* x, size_t rows, ptrdiff_t row_stride, size_t heads, size_t head_dim,
               size_t rotary_dim, bool interleaved, const float* cos, const float* sin) {
  if (rows == 0 || heads == 0 || rotary_dim < 2) return;
  HWY_DYNAMIC_DISPATCH(ApplyRope)
  (x, rows, row_stride, heads, head_dim, rotary_dim, interleaved, cos, sin);
}

void RmsNormRows(float* x, size_t rows, ptrdiff_t row_stride, size_t groups, size_t group_size,
                 const float* weight, float eps) {
  if (rows == 0 || groups == 0 || group_size == 0) return;
  HWY_DYNAMIC_DISPATCH(RmsNormRows)(x, rows, row_stride, groups, group_size, weight, eps);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
