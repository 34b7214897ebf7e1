// Per-target RoPE rotation and RMSNorm kernels; the contract is in kernels/rope.h. Included once
// per Highway target by kernels/rope.cc (foreach_target).
//
// Every target computes bitwise the same results: the rotation is one f32 multiply per product
// and one add or subtract per output (no FMA), and RMSNorm's sum of squares adds exact double
// products into 8 slots (column i into slot i mod 8, in column order) folded in a fixed order,
// whatever the vector width.

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_ROPE_INL_H_
#undef MHA_KERNELS_ROPE_INL_H_
#else
#define MHA_KERNELS_ROPE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "kernels/rope.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {
namespace rope_detail {

namespace hn = hwy::HWY_NAMESPACE;

// Upper bound on the lanes of an f32 vector on this target (for the tail buffers).
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

// The rotation's tails (fewer than a vector of elements) go through zero-padded buffers and the
// vector code rather than a scalar loop: GCC 12 vectorizes such a loop into fused
// multiply-add-subtract instructions despite -ffp-contract=off, which would round differently
// from the vector lanes.

// One vector of neox pairs (a[lane], b[lane]).
template <class D>
HWY_INLINE void RotateHalves(D d, float* HWY_RESTRICT a, float* HWY_RESTRICT b,
                             const float* HWY_RESTRICT c, const float* HWY_RESTRICT s) {
  const auto va = hn::LoadU(d, a);
  const auto vb = hn::LoadU(d, b);
  const auto vc = hn::LoadU(d, c);
  const auto vs = hn::LoadU(d, s);
  hn::StoreU(hn::Sub(hn::Mul(va, vc), hn::Mul(vb, vs)), d, a);
  hn::StoreU(hn::Add(hn::Mul(vb, vc), hn::Mul(va, vs)), d, b);
}

// neox: pairs (x[i], x[half + i]) of one head, i < half.
template <class D>
HWY_INLINE void RotateHalves(D d, float* HWY_RESTRICT x, size_t half, const float* HWY_RESTRICT c,
                             const float* HWY_RESTRICT s) {
  const size_t N = hn::Lanes(d);
  float* HWY_RESTRICT y = x + half;
  size_t i = 0;
  for (; i + N <= half; i += N) RotateHalves(d, x + i, y + i, c + i, s + i);
  if (i < half) {
    const size_t rem = half - i;
    HWY_ALIGN float ta[kMaxLanes] = {}, tb[kMaxLanes] = {}, tc[kMaxLanes] = {}, ts[kMaxLanes] = {};
    std::memcpy(ta, x + i, rem * sizeof(float));
    std::memcpy(tb, y + i, rem * sizeof(float));
    std::memcpy(tc, c + i, rem * sizeof(float));
    std::memcpy(ts, s + i, rem * sizeof(float));
    RotateHalves(d, ta, tb, tc, ts);
    std::memcpy(x + i, ta, rem * sizeof(float));
    std::memcpy(y + i, tb, rem * sizeof(float));
  }
}

// gptj: pairs (x[2i], x[2i + 1]) of one head, i < pairs; cdup = (c_i, c_i), sneg = (-s_i, s_i)
// per pair, readable up to a vector past 2 * pairs. Lane 2i gets x[2i] * c + x[2i + 1] * (-s),
// which equals x[2i] * c - x[2i + 1] * s bitwise (negation is exact).
template <class D>
HWY_INLINE void RotatePairs(D d, float* HWY_RESTRICT x, size_t pairs,
                            const float* HWY_RESTRICT cdup, const float* HWY_RESTRICT sneg) {
#if HWY_TARGET != HWY_SCALAR
  // Shuffle2301 swaps neighbouring lanes (within 128-bit blocks, which hold whole pairs).
  const size_t N = hn::Lanes(d);
  auto rotate = [&](float* HWY_RESTRICT v, size_t i) {
    const auto vx = hn::LoadU(d, v);
    const auto prod_c = hn::Mul(vx, hn::LoadU(d, cdup + i));
    hn::StoreU(hn::Add(prod_c, hn::Mul(hn::Shuffle2301(vx), hn::LoadU(d, sneg + i))), d, v);
  };
  size_t i = 0;
  for (; i + N <= 2 * pairs; i += N) rotate(x + i, i);
  if (i < 2 * pairs) {
    const size_t rem = 2 * pairs - i;  // even
    HWY_ALIGN float t[kMaxLanes] = {};
    std::memcpy(t, x + i, rem * sizeof(float));
    rotate(t, i);
    std::memcpy(x + i, t, rem * sizeof(float));
  }
#else
  // One lane: no vector holds a pair. The baseline has no FMA to fuse into.
  (void)d;
  for (size_t i = 0; i < 2 * pairs; i += 2) {
    const float a = x[i], b = x[i + 1];
    const float c = cdup[i], s = sneg[i + 1];
    x[i] = a * c - b * s;
    x[i + 1] = b * c + a * s;
  }
#endif
}

// 8-slot sum of squares in double (see the file comment); each product is exact.
inline double SumOfSquares(const float* HWY_RESTRICT x, size_t n) {
  double slot[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t k = 0; k < 8; ++k) {
      const double v = x[i + k];
      slot[k] += v * v;
    }
  }
  for (size_t k = 0; i < n; ++i, ++k) {
    const double v = x[i];
    slot[k] += v * v;
  }
  return ((slot[0] + slot[1]) + (slot[2] + slot[3])) + ((slot[4] + slot[5]) + (slot[6] + slot[7]));
}

// x[i] = (x[i] * factor) * w[i] for i < n.
template <class D>
HWY_INLINE void ScaleByWeight(D d, float* HWY_RESTRICT x, size_t n, float factor,
                              const float* HWY_RESTRICT w) {
  const size_t N = hn::Lanes(d);
  const auto vf = hn::Set(d, factor);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), vf), hn::LoadU(d, w + i)), d, x + i);
  }
  for (; i < n; ++i) x[i] = (x[i] * factor) * w[i];
}

}  // namespace rope_detail

// See kernels/rope.h.
inline void ApplyRope(float* HWY_RESTRICT x, size_t rows, ptrdiff_t row_stride, size_t heads,
                      size_t head_dim, size_t rotary_dim, bool interleaved,
                      const float* HWY_RESTRICT cos, const float* HWY_RESTRICT sin) {
  namespace rd = rope_detail;
  const hwy::HWY_NAMESPACE::ScalableTag<float> d;
  const size_t half = rotary_dim / 2;
  if (!interleaved) {
    for (size_t r = 0; r < rows; ++r) {
      float* row = x + static_cast<ptrdiff_t>(r) * row_stride;
      for (size_t h = 0; h < heads; ++h) {
        rd::RotateHalves(d, row + h * head_dim, half, cos + r * half, sin + r * half);
      }
    }
    return;
  }
  // gptj: the row's cos/sin duplicated per pair, a chunk of pairs at a time, shared by the heads.
  // Padded by a vector of zeros for RotatePairs's tail.
  constexpr size_t kChunkPairs = 128;
  HWY_ALIGN float cdup[2 * kChunkPairs + rd::kMaxLanes] = {};
  HWY_ALIGN float sneg[2 * kChunkPairs + rd::kMaxLanes] = {};
  for (size_t r = 0; r < rows; ++r) {
    float* row = x + static_cast<ptrdiff_t>(r) * row_stride;
    const float* c = cos + r * half;
    const float* s = sin + r * half;
    for (size_t p0 = 0; p0 < half; p0 += kChunkPairs) {
      const size_t pairs = std::min(kChunkPairs, half - p0);
      for (size_t i = 0; i < pairs; ++i) {
        cdup[2 * i] = cdup[2 * i + 1] = c[p0 + i];
        sneg[2 * i] = -s[p0 + i];
        sneg[2 * i + 1] = s[p0 + i];
      }
      for (size_t h = 0; h < heads; ++h) {
        rd::RotatePairs(d, row + h * head_dim + 2 * p0, pairs, cdup, sneg);
      }
    }
  }
}

// See kernels/rope.h.
inline void RmsNormRows(float* HWY_RESTRICT x, size_t rows, ptrdiff_t row_stride, size_t groups,
                        size_t group_size, const float* HWY_RESTRICT weight, float eps) {
  namespace rd = rope_detail;
  const hwy::HWY_NAMESPACE::ScalableTag<float> d;
  for (size_t r = 0; r < rows; ++r) {
    float* row = x + static_cast<ptrdiff_t>(r) * row_stride;
    for (size_t g = 0; g < groups; ++g) {
      float* v = row + g * group_size;
      const double mean = rd::SumOfSquares(v, group_size) / static_cast<double>(group_size);
      const float factor = static_cast<float>(1.0 / std::sqrt(mean + static_cast<double>(eps)));
      rd::ScaleByWeight(d, v, group_size, factor, weight);
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_ROPE_INL_H_
