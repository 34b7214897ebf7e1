// Per-target softmax kernels; the contract (layouts, masks, special values, accuracy) is in
// kernels/softmax.h. Included once per Highway target by kernels/softmax.cc (foreach_target);
// other per-target code may include it and call these functions directly, without dispatch.
//
// Each row takes three passes over its visible columns (VisibleColumns: the causal limit and the
// window with index positions; the columns outside are only written with 0):
//   1. y = x * scale + add0 + add1, or -inf where a bool mask is set; y is written in place and
//      the row max is tracked (plus whether any y is NaN: Max does not propagate NaN). With
//      per-element terms (HasElementTerms: softcap, ALiBi, a window over explicit positions) the
//      row runs the kTerms instantiation, which adds them in the documented order; without,
//      the plain instantiation runs the unchanged code.
//   2. e = exp(y - max), written in place, and its sum (f32 partial sums, double total); exp is
//      ExpNonPositive below, since y - max <= 0 always. A sink joins max and the sum.
//   3. e *= 1 / sum (reciprocal in double, rounded once).
// OnlineSoftmaxUpdate fuses passes 1 and 2 (ExpBoundedSum) for rows whose reference from earlier
// blocks bounds the block's y (see kernels/softmax.h), and falls back to them where it does not.
// y is rounded after each step (Mul, then each Add; no FMA), identically on every target, so a
// test can reproduce it exactly. The last partial vector of a row goes through a small stack
// buffer, so no load or store touches memory outside the row and no target needs masked loads
// (Highway 1.0.3 has no LoadN, and MaskedLoad may fault on lanes it masks off).

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_SOFTMAX_INL_H_
#undef MHA_KERNELS_SOFTMAX_INL_H_
#else
#define MHA_KERNELS_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "hwy/highway.h"
// hn::Tanh for the softcap (per-target, its own toggle guard).
#include "hwy/contrib/math/math-inl.h"
#include "kernels/softmax.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {
namespace softmax_detail {

namespace hn = hwy::HWY_NAMESPACE;

// Upper bound on the lanes of an f32 vector on this target (for the tail buffers).
constexpr size_t kMaxLanesF32 = HWY_MAX_BYTES / sizeof(float);

// The masks and variant terms of one row: pointers already offset to the row's first column
// (null = absent). The terms are read only by the kTerms instantiations below.
struct RowMasks {
  const float* add0;
  const float* add1;
  const uint8_t* masked0;
  const uint8_t* masked1;
  const int32_t* k_pos = nullptr;  // explicit key positions (null: index positions)
  int64_t d0 = 0;                  // index positions: d of column 0 (saturated)
  int32_t q_pos = 0;               // explicit positions: the row's query position
  // Per-element window (explicit positions only): visible iff d <= window_max, and d >= 0 when
  // window_causal; -1 = none (index positions use the column range instead).
  int32_t window_max = -1;
  bool window_causal = false;
  float softcap = 0.0f;
  float slope = 0.0f;
};

// Whether the masks carry a term that SoftmaxRows / OnlineSoftmaxUpdate evaluate per element
// (then they run their kTerms instantiation; otherwise the plain one, which ignores the terms).
inline bool HasElementTerms(const SoftmaxMasks& m) {
  return m.softcap > 0.0f || m.alibi_slope != 0.0f || (m.window > 0 && m.q_pos != nullptr);
}

inline RowMasks MasksForRow(const SoftmaxMasks& m, size_t r) {
  const ptrdiff_t ri = static_cast<ptrdiff_t>(r);
  RowMasks rm;
  rm.add0 = m.add[0] ? m.add[0] + ri * m.add_row_stride[0] : nullptr;
  rm.add1 = m.add[1] ? m.add[1] + ri * m.add_row_stride[1] : nullptr;
  rm.masked0 = m.masked[0] ? m.masked[0] + ri * m.masked_row_stride[0] : nullptr;
  rm.masked1 = m.masked[1] ? m.masked[1] + ri * m.masked_row_stride[1] : nullptr;
  rm.softcap = m.softcap;
  rm.slope = m.alibi_slope;
  rm.d0 = softmax_internal::SaturatingAdd(m.causal_offset, static_cast<int64_t>(r));
  if (m.q_pos != nullptr && m.k_pos != nullptr) {
    rm.k_pos = m.k_pos;
    rm.q_pos = m.q_pos[r];
    if (m.window > 0) {
      // |d| < 2^31 for positions in [0, 2^31), so a larger window is the same as 2^31.
      rm.window_max = static_cast<int32_t>(std::min<int64_t>(m.window - 1, INT32_MAX));
      rm.window_causal = m.causal;
    }
  }
  return rm;
}

// The masks and terms of columns [i, ...) of a row.
inline RowMasks FromColumn(const RowMasks& rm, size_t i) {
  RowMasks out = rm;
  out.add0 = rm.add0 ? rm.add0 + i : nullptr;
  out.add1 = rm.add1 ? rm.add1 + i : nullptr;
  out.masked0 = rm.masked0 ? rm.masked0 + i : nullptr;
  out.masked1 = rm.masked1 ? rm.masked1 + i : nullptr;
  out.k_pos = rm.k_pos ? rm.k_pos + i : nullptr;
  out.d0 = softmax_internal::SaturatingAdd(rm.d0, -static_cast<int64_t>(i));
  return out;
}

// The int32 position distances d of the lanes at column i: q_pos - k_pos[i + lane], or with
// index positions d0 - i - lane (clamped so that no lane overflows; index offsets stay far
// below 2^31 in practice, as positions do).
template <class DI>
HWY_INLINE hn::Vec<DI> Distances(DI di, const RowMasks& rm, size_t i) {
  if (rm.k_pos) return hn::Sub(hn::Set(di, rm.q_pos), hn::LoadU(di, rm.k_pos + i));
  const int64_t d = softmax_internal::SaturatingAdd(rm.d0, -static_cast<int64_t>(i));
  constexpr int64_t kLo = int64_t{INT32_MIN} + static_cast<int64_t>(kMaxLanesF32);
  const int64_t clamped = std::min<int64_t>(std::max(d, kLo), INT32_MAX);
  return hn::Sub(hn::Set(di, static_cast<int32_t>(clamped)), hn::Iota(di, 0));
}

// Pass 1 on one full vector at column i: returns y (see the file comment). kTerms adds the
// softcap, ALiBi and the per-element window of rm.
template <bool kTerms, class D, class V = hn::Vec<D>>
HWY_INLINE V ScaledMaskedScores(D d, const float* HWY_RESTRICT x, const RowMasks& rm, size_t i,
                                V vscale, V neg_inf) {
  V y = hn::Mul(hn::LoadU(d, x + i), vscale);
  auto hidden = hn::MaskFromVec(hn::Zero(d));  // the window's invisible lanes (kTerms only)
  if constexpr (kTerms) {
    if (rm.softcap > 0.0f) {
      const V cap = hn::Set(d, rm.softcap);
      y = hn::Mul(cap, hn::Tanh(d, hn::Div(y, cap)));
    }
    if (rm.slope != 0.0f || rm.window_max >= 0) {
      const hn::RebindToSigned<D> di;
      const auto dist = Distances(di, rm, i);
      // |d| < 2^31 (see Distances), so Abs cannot overflow.
      if (rm.slope != 0.0f) {
        y = hn::Sub(y, hn::Mul(hn::Set(d, rm.slope), hn::ConvertTo(d, hn::Abs(dist))));
      }
      if (rm.window_max >= 0) {
        const auto wmax = hn::Set(di, rm.window_max);
        const auto out = rm.window_causal ? hn::Or(hn::Lt(dist, hn::Zero(di)), hn::Gt(dist, wmax))
                                          : hn::Gt(hn::Abs(dist), wmax);
        hidden = hn::RebindMask(d, out);
      }
    }
  }
  if (rm.add0) y = hn::Add(y, hn::LoadU(d, rm.add0 + i));
  if (rm.add1) y = hn::Add(y, hn::LoadU(d, rm.add1 + i));
  if (rm.masked0 || rm.masked1) {
    // One byte per column: load Lanes(d) bytes, widen to i32 lanes, compare with 0.
    const hn::Rebind<uint8_t, D> du8;
    const hn::Rebind<int32_t, D> di32;
    auto bytes = hn::Zero(du8);
    if (rm.masked0) bytes = hn::Or(bytes, hn::LoadU(du8, rm.masked0 + i));
    if (rm.masked1) bytes = hn::Or(bytes, hn::LoadU(du8, rm.masked1 + i));
    const auto wide = hn::PromoteTo(di32, bytes);
    y = hn::IfThenElse(hn::RebindMask(d, hn::Ne(wide, hn::Zero(di32))), neg_inf, y);
  }
  if constexpr (kTerms) y = hn::IfThenElse(hidden, neg_inf, y);
  return y;
}

// A row's last len (< one vector) floats at p as a vector whose other lanes are `fill`, reading
// nothing past p + len, and its inverse, storing the first len lanes of v. x86 AVX2 and above
// have fault-free masked loads and stores: a copy through a buffer there made the vector load
// wait on memcpy's narrower stores (a failed store forward), a third of the online update's
// time at head_dim 64 with causal strips, whose rows all end in a partial vector. Elsewhere
// (Highway 1.0.3's MaskedLoad reads the whole vector there) through a buffer.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V LoadTail(D d, const float* HWY_RESTRICT p, size_t len, V fill) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const auto m = hn::FirstN(d, len);
  return hn::IfThenElse(m, hn::MaskedLoad(m, d, p), fill);
#else
  HWY_ALIGN float buf[kMaxLanesF32];
  hn::Store(fill, d, buf);
  std::memcpy(buf, p, len * sizeof(float));
  return hn::Load(d, buf);
#endif
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE void StoreTail(V v, D d, float* HWY_RESTRICT p, size_t len) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  hn::BlendedStore(v, hn::FirstN(d, len), d, p);
#else
  HWY_ALIGN float buf[kMaxLanesF32];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, len * sizeof(float));
#endif
}

// The last len (< one vector) columns of a row from column i, and of its masks, copied into
// zero-padded vector-sized buffers, so that a full-vector pass over them touches no memory
// outside the row (masks pad with 0: unmasked).
struct RowTail {
  HWY_ALIGN float x[kMaxLanesF32] = {};
  HWY_ALIGN float add0[kMaxLanesF32] = {};
  HWY_ALIGN float add1[kMaxLanesF32] = {};
  HWY_ALIGN uint8_t masked0[kMaxLanesF32] = {};
  HWY_ALIGN uint8_t masked1[kMaxLanesF32] = {};
  HWY_ALIGN int32_t k_pos[kMaxLanesF32] = {};
  RowMasks masks;  // the terms of column i; pointers into the buffers above

  RowTail(const float* src, const RowMasks& rm, size_t i, size_t len) : masks(FromColumn(rm, i)) {
    std::memcpy(x, src + i, len * sizeof(float));
    masks.add0 = rm.add0 ? static_cast<float*>(std::memcpy(add0, rm.add0 + i, len * 4)) : nullptr;
    masks.add1 = rm.add1 ? static_cast<float*>(std::memcpy(add1, rm.add1 + i, len * 4)) : nullptr;
    masks.masked0 =
        rm.masked0 ? static_cast<uint8_t*>(std::memcpy(masked0, rm.masked0 + i, len)) : nullptr;
    masks.masked1 =
        rm.masked1 ? static_cast<uint8_t*>(std::memcpy(masked1, rm.masked1 + i, len)) : nullptr;
    masks.k_pos =
        rm.k_pos ? static_cast<int32_t*>(std::memcpy(k_pos, rm.k_pos + i, len * 4)) : nullptr;
  }
};

// Result of pass 1 over a row.
struct RowStats {
  float max;     // max of y over the valid columns; -inf if all are -inf (or no columns)
  bool has_nan;  // some y is NaN
};

// Pass 1 over columns [0, n) of one row: writes y into x (unless y = x: scale 1, no masks and
// no terms) and returns its max / NaN flag.
template <bool kTerms, class D>
HWY_INLINE RowStats ScaleMaskMax(D d, float* HWY_RESTRICT x, size_t n, float scale,
                                 const RowMasks& rm) {
  using V = hn::Vec<D>;
  const size_t N = hn::Lanes(d);
  const V vscale = hn::Set(d, scale);
  const V neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  V vmax0 = neg_inf;
  V vmax1 = neg_inf;
  auto nan0 = hn::MaskFromVec(hn::Zero(d));
  auto nan1 = hn::MaskFromVec(hn::Zero(d));
  size_t i = 0;
  if (!kTerms && scale == 1.0f && !rm.add0 && !rm.add1 && !rm.masked0 && !rm.masked1) {
    // y = x (the caller applied the scale, e.g. as the scores product's alpha, which rounds
    // alike): the pass only reads, and the tail below handles the last partial vector.
    for (; i + 2 * N <= n; i += 2 * N) {
      const V y0 = hn::LoadU(d, x + i);
      const V y1 = hn::LoadU(d, x + i + N);
      vmax0 = hn::Max(vmax0, y0);
      vmax1 = hn::Max(vmax1, y1);
      nan0 = hn::Or(nan0, hn::IsNaN(y0));
      nan1 = hn::Or(nan1, hn::IsNaN(y1));
    }
  }
  // Two independent max chains hide the latency of Max.
  for (; i + 2 * N <= n; i += 2 * N) {
    const V y0 = ScaledMaskedScores<kTerms>(d, x, rm, i, vscale, neg_inf);
    const V y1 = ScaledMaskedScores<kTerms>(d, x, rm, i + N, vscale, neg_inf);
    hn::StoreU(y0, d, x + i);
    hn::StoreU(y1, d, x + i + N);
    vmax0 = hn::Max(vmax0, y0);
    vmax1 = hn::Max(vmax1, y1);
    nan0 = hn::Or(nan0, hn::IsNaN(y0));
    nan1 = hn::Or(nan1, hn::IsNaN(y1));
  }
  for (; i + N <= n; i += N) {
    const V y = ScaledMaskedScores<kTerms>(d, x, rm, i, vscale, neg_inf);
    hn::StoreU(y, d, x + i);
    vmax0 = hn::Max(vmax0, y);
    nan0 = hn::Or(nan0, hn::IsNaN(y));
  }
  if (i < n && !kTerms && !rm.add0 && !rm.add1 && !rm.masked0 && !rm.masked1) {
    // Tail without masks or terms: y = x * scale, as ScaledMaskedScores computes it.
    const size_t rem = n - i;
    V y = hn::Mul(LoadTail(d, x + i, rem, hn::Zero(d)), vscale);
    y = hn::IfThenElse(hn::FirstN(d, rem), y, neg_inf);
    // With scale 1, y is x on the real lanes (a signalling NaN turns quiet, and a NaN row is
    // all NaN anyway): not stored, since a masked store makes the next pass's masked load of
    // the same vector wait for it to reach the cache.
    if (scale != 1.0f) StoreTail(y, d, x + i, rem);
    vmax0 = hn::Max(vmax0, y);
    nan0 = hn::Or(nan0, hn::IsNaN(y));
  } else if (i < n) {
    // Tail: process one full vector from zero-padded copies of the remaining columns (and their
    // masks), force the padding lanes to -inf, and copy back only the real columns.
    const size_t rem = n - i;
    RowTail tail(x, rm, i, rem);
    V y = ScaledMaskedScores<kTerms>(d, tail.x, tail.masks, 0, vscale, neg_inf);
    y = hn::IfThenElse(hn::FirstN(d, rem), y, neg_inf);
    hn::Store(y, d, tail.x);
    std::memcpy(x + i, tail.x, rem * sizeof(float));
    vmax0 = hn::Max(vmax0, y);
    nan0 = hn::Or(nan0, hn::IsNaN(y));
  }
  RowStats stats;
  stats.max = hn::GetLane(hn::MaxOfLanes(d, hn::Max(vmax0, vmax1)));
  stats.has_nan = !hn::AllFalse(d, hn::Or(nan0, nan1));
  return stats;
}

// exp(x) for x <= 8 (or -inf), the only arguments the softmax passes take (x <= 0 but in
// OnlineSoftmaxUpdate's fused pass): about 15 operations against ~28 for hwy::Exp, which must
// handle the whole f32 range.
// - n = round(x / ln2) by adding 1.5 * 2^23 (round to nearest even in the FMA's rounding), so
//   the low bits of t = x * log2(e) + 1.5 * 2^23 hold n: no saturating float -> int conversion;
//   r = x - n ln2 in two steps (ln2 split in a 12-bit high part and the rest).
// - exp(r) on |r| <= ln2 / 2 by a degree-5 polynomial 1 + r + r^2 (c2 + c3 r + c4 r^2 + c5 r^3)
//   whose coefficients minimize the maximum relative error (1.05e-7, fitted by Lawson's
//   iteration on 20001 points); hwy::Exp's (Cephes') polynomial is degree 7, whose accuracy f32
//   does not need, and two FMAs fewer make the exp pass faster.
// - 2^n is applied with one integer add to the exponent field of exp(r), exact while the result
//   is normal, which holds for x >= -87 (n >= -126 and exp(r) > 1 at the boundary);
// - x < -87 (exact result < 1.7e-38) and -inf give 0, as does NaN (callers exclude NaN rows).
// Max error 2 ULP against exp in double over [-87, 0] and [0, 88] (kernels/README.md, Numerics;
// tests/softmax_test.cc checks a sample on every target).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpNonPositive(D d, V x) {
  const hn::RebindToUnsigned<D> du;
  const V kMagic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23
  const V kLog2e = hn::Set(d, 1.44269504088896341f);
  // -ln2 split so that n * kLn2Hi is exact for |n| < 2^12 (kLn2Hi has 12 significant bits).
  const V kNegLn2Hi = hn::Set(d, -0.693145751953125f);
  const V kNegLn2Lo = hn::Set(d, -1.428606765330187045e-6f);
  const V t = hn::MulAdd(x, kLog2e, kMagic);
  const V n = hn::Sub(t, kMagic);
  V r = hn::MulAdd(n, kNegLn2Hi, x);
  r = hn::MulAdd(n, kNegLn2Lo, r);
  // c2 + c3 r + (c4 + c5 r) r^2 (Estrin's scheme: shorter dependency chains than Horner).
  const V r2 = hn::Mul(r, r);
  const V p23 = hn::MulAdd(hn::Set(d, 1.666711420e-01f), r, hn::Set(d, 4.999923110e-01f));
  const V p45 = hn::MulAdd(hn::Set(d, 8.312512189e-03f), r, hn::Set(d, 4.189010710e-02f));
  const V p = hn::MulAdd(p45, r2, p23);
  const V e = hn::Add(hn::MulAdd(p, r2, r), hn::Set(d, 1.0f));
  // n << 23 is the low bits of t shifted into the exponent field (t's own exponent and the
  // 1.5 * 2^23 bits shift out); unsigned lanes, so the wrap-around of negative n is defined.
  const auto bits = hn::Add(hn::BitCast(du, e), hn::ShiftLeft<23>(hn::BitCast(du, t)));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(d, -87.0f)), hn::BitCast(d, bits));
}

// Pass 2 over columns [0, n): x = exp(x - max) in place; returns the sum. Requires max finite.
// -inf entries give exactly 0 (ExpNonPositive returns 0 below -87).
//
// Summation error: each iteration adds its two exp vectors (e0 + e1) to one partial-sum vector,
// which is folded into a double total every kChunkIters iterations, so each f32 partial sum
// chains at most 16 additions of depth-1 trees before a reduction of depth log2(Lanes). For
// positive terms that bounds the relative error of the sum by about (17 + log2(Lanes)) * 2^-24
// (<= 1.3e-6 on 16 lanes) at any row length. Two vectors per iteration, one loop-carried sum:
// with four (and the exp's 13 constants) AVX2's 16 registers overflowed, and GCC 12 reloaded
// constants and kept the sum on the stack in every iteration. Not inlined for
// the same reason: inlined into the row loop, even one sum went to the stack on every
// iteration.
template <class D>
HWY_NOINLINE double ExpSubtractSum(D d, float* HWY_RESTRICT x, size_t n, float max) {
  using V = hn::Vec<D>;
  constexpr size_t kChunkIters = 16;
  const size_t N = hn::Lanes(d);
  const V vmax = hn::Set(d, max);
  double total = 0.0;
  size_t i = 0;
  while (i + 2 * N <= n) {
    V sum = hn::Zero(d);
    for (size_t it = 0; it < kChunkIters && i + 2 * N <= n; ++it, i += 2 * N) {
      const V e0 = ExpNonPositive(d, hn::Sub(hn::LoadU(d, x + i), vmax));
      const V e1 = ExpNonPositive(d, hn::Sub(hn::LoadU(d, x + i + N), vmax));
      hn::StoreU(e0, d, x + i);
      hn::StoreU(e1, d, x + i + N);
      sum = hn::Add(sum, hn::Add(e0, e1));
    }
    total += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, sum)));
  }
  // At most one full vector and a partial one remain.
  V sum = hn::Zero(d);
  if (i + N <= n) {
    const V e = ExpNonPositive(d, hn::Sub(hn::LoadU(d, x + i), vmax));
    hn::StoreU(e, d, x + i);
    sum = e;
    i += N;
  }
  if (i < n) {
    // Padding lanes hold -inf, whose exp is 0.
    const size_t rem = n - i;
    const V y = LoadTail(d, x + i, rem, hn::Set(d, -std::numeric_limits<float>::infinity()));
    const V e = ExpNonPositive(d, hn::Sub(y, vmax));
    StoreTail(e, d, x + i, rem);
    sum = hn::Add(sum, e);
  }
  total += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, sum)));
  return total;
}

// The online update's fused pass over columns [0, n) of one row, for a row with a finite running
// reference ref (see OnlineSoftmaxUpdate): while every y (pass 1's scaled, masked scores) is at
// most limit = ref + kOnlineHeadroom, x = exp(y - ref) in place and *sum accumulates it (as
// ExpSubtractSum sums). Stops at the first pair of vectors holding a y above limit or a NaN (the
// comparison is false for NaN) and returns the columns done; [done, n) are untouched raw x. One
// pass instead of pass 1 (max) plus pass 2 (exp): without a new max the block's max is not
// needed, since exp(y - ref) <= exp(kOnlineHeadroom) cannot overflow.
// kPlain: scale 1, no masks and no terms (y = x: the pass only loads); kTerms: see
// ScaledMaskedScores.
template <bool kPlain, bool kTerms, class D>
HWY_NOINLINE size_t ExpBoundedSum(D d, float* HWY_RESTRICT x, size_t n, float scale,
                                  const RowMasks& rm, float ref, float limit, double* sum) {
  using V = hn::Vec<D>;
  constexpr size_t kChunkIters = 16;
  const size_t N = hn::Lanes(d);
  const V vref = hn::Set(d, ref);
  const V vlimit = hn::Set(d, limit);
  const V vscale = hn::Set(d, scale);
  const V neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  auto y_at = [&](const float* HWY_RESTRICT src, const RowMasks& masks, size_t i) {
    if constexpr (kPlain) return hn::LoadU(d, src + i);
    return ScaledMaskedScores<kTerms>(d, src, masks, i, vscale, neg_inf);
  };
  double total = 0.0;
  size_t i = 0;
  bool stopped = false;
  while (!stopped && i + 2 * N <= n) {
    V part = hn::Zero(d);
    for (size_t it = 0; it < kChunkIters && i + 2 * N <= n; ++it, i += 2 * N) {
      const V y0 = y_at(x, rm, i);
      const V y1 = y_at(x, rm, i + N);
      if (!hn::AllTrue(d, hn::And(hn::Le(y0, vlimit), hn::Le(y1, vlimit)))) {
        stopped = true;
        break;
      }
      const V e0 = ExpNonPositive(d, hn::Sub(y0, vref));
      const V e1 = ExpNonPositive(d, hn::Sub(y1, vref));
      hn::StoreU(e0, d, x + i);
      hn::StoreU(e1, d, x + i + N);
      part = hn::Add(part, hn::Add(e0, e1));
    }
    total += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, part)));
  }
  // The last columns (fewer than two vectors) one vector at a time through RowTail, whose
  // padding lanes are set to -inf (exp 0).
  const bool unmasked = !kTerms && !rm.add0 && !rm.add1 && !rm.masked0 && !rm.masked1;
  while (!stopped && i < n) {
    const size_t len = std::min(N, n - i);
    V y;
    if (unmasked) {
      // y as y_at computes it without masks: x, or x * scale.
      y = LoadTail(d, x + i, len, hn::Zero(d));
      if constexpr (!kPlain) y = hn::Mul(y, vscale);
    } else {
      const RowTail tail(x, rm, i, len);
      y = y_at(tail.x, tail.masks, 0);
    }
    y = hn::IfThenElse(hn::FirstN(d, len), y, neg_inf);
    if (!hn::AllTrue(d, hn::Le(y, vlimit))) break;
    const V e = ExpNonPositive(d, hn::Sub(y, vref));
    StoreTail(e, d, x + i, len);
    total += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, e)));
    i += len;
  }
  *sum = total;
  return i;
}

// x[i] *= s for i < n (also pass 3). The scalar tail rounds exactly as the vector lanes do.
template <class D>
HWY_INLINE void MulRow(D d, float* HWY_RESTRICT x, size_t n, float s) {
  const size_t N = hn::Lanes(d);
  const auto vs = hn::Set(d, s);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, x + i);
  for (; i < n; ++i) x[i] *= s;
}

inline void FillRow(float* x, size_t n, float value) {
  for (size_t i = 0; i < n; ++i) x[i] = value;
}

// Passes 1 and 2 of row r over its visible columns c: x[c.begin, c.end) = exp(y - max), with
// max over y and the sink; the columns outside c untouched (ExpRow zeroes them). Returns the sum of
// the exps plus exp(sink - max); 0 for a row with no unmasked entry (x all 0, whatever the sink),
// NaN for a NaN row (x NaN on c; also a NaN or +inf sink).
template <bool kTerms, class D>
HWY_INLINE double ExpVisible(D d, float* HWY_RESTRICT x, size_t r, float scale,
                             const SoftmaxMasks& masks, ColumnRange c) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  if (c.begin == c.end) return 0.0;
  float* HWY_RESTRICT xs = x + c.begin;
  const size_t n = c.end - c.begin;
  const RowStats stats =
      ScaleMaskMax<kTerms>(d, xs, n, scale, FromColumn(MasksForRow(masks, r), c.begin));
  if (stats.has_nan || stats.max == kInf) {
    // NaN anywhere, or +inf (exp(inf - inf) is NaN, as in PyTorch): the row is NaN.
    FillRow(xs, n, kNaN);
    return static_cast<double>(kNaN);
  }
  if (stats.max == -kInf) {
    // Nothing unmasked: zeros, not 0/0.
    FillRow(xs, n, 0.0f);
    return 0.0;
  }
  const float sink = masks.sink;
  // >= 1: the max element contributes exp(0) = 1.
  if (sink == -kInf) return ExpSubtractSum(d, xs, n, stats.max);
  if (std::isnan(sink) || sink == kInf) {
    FillRow(xs, n, kNaN);
    return static_cast<double>(kNaN);
  }
  // The sink joins the max and the sum (>= 1 again); its exp in double, the same on every target.
  const float max = sink > stats.max ? sink : stats.max;
  return ExpSubtractSum(d, xs, n, max) +
         std::exp(static_cast<double>(sink) - static_cast<double>(max));
}

// Zeroes the columns of a row of `cols` outside c (never read by the passes). Callers run it
// after the row's passes: a row's last partial vector is read with a masked load, which waits
// for any older store to the same vector, masked-off lanes included, to reach the cache; zeroes
// stored first made every row that ends inside a vector (causal rows) wait (a causal 64-token
// head's online softmax 1.8x the non-causal one's time for half the elements,
// bench/kernels_bench OnlineSoftmaxHead64).
inline void ZeroInvisible(float* x, size_t cols, ColumnRange c) {
  FillRow(x, c.begin, 0.0f);
  FillRow(x + c.end, cols - c.end, 0.0f);
}

// ExpVisible, then the columns outside c zeroed.
template <bool kTerms, class D>
HWY_INLINE double ExpRow(D d, float* HWY_RESTRICT x, size_t r, size_t cols, float scale,
                         const SoftmaxMasks& masks, ColumnRange c) {
  const double sum = ExpVisible<kTerms>(d, x, r, scale, masks, c);
  ZeroInvisible(x, cols, c);
  return sum;
}

template <bool kTerms, class D>
HWY_INLINE void SoftmaxRowsT(D d, float* HWY_RESTRICT scores, size_t rows, size_t cols,
                             ptrdiff_t row_stride, float scale, const SoftmaxMasks& masks) {
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT x = scores + static_cast<ptrdiff_t>(r) * row_stride;
    const ColumnRange c = VisibleColumns(masks, r, cols);
    const double sum = ExpRow<kTerms>(d, x, r, cols, scale, masks, c);
    // Zero and NaN rows are final already; otherwise one rounding for the reciprocal.
    if (sum > 0.0) MulRow(d, x + c.begin, c.end - c.begin, static_cast<float>(1.0 / sum));
  }
}

// One row of OnlineSoftmaxUpdateT over its visible columns c (non-empty or not); leaves the
// columns outside c untouched.
template <bool kTerms, class D>
HWY_INLINE void OnlineRowUpdate(D d, float* HWY_RESTRICT x, size_t r, float scale,
                                const SoftmaxMasks& masks, bool plain, ColumnRange c,
                                float* HWY_RESTRICT row_max, float* HWY_RESTRICT row_sum,
                                float* HWY_RESTRICT acc_row, size_t acc_cols) {
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  if (c.begin == c.end) return;  // no key of this block is visible: state unchanged
  float* HWY_RESTRICT xs = x + c.begin;
  const size_t n = c.end - c.begin;
  // A plain row (scale 1, no masks or terms) reads none of its RowMasks, so none is built: two
  // struct builds per row were a good part of a short row's time (kernels/README).
  const RowMasks rm = plain ? RowMasks{} : FromColumn(MasksForRow(masks, r), c.begin);
  const float m_old = row_max[r];
  // A finite reference from earlier blocks (or a sink): one fused pass while the block stays
  // within the headroom (the common case after the first block), the remaining columns
  // otherwise.
  size_t done = 0;
  double done_sum = 0.0;
  // m_old is -inf (no visible key yet), NaN, or finite, and a finite m_old + 8 stays finite.
  const float limit = m_old + kOnlineSoftmaxHeadroom;
  if (m_old > -kInf) {
    done = plain ? ExpBoundedSum<true, false>(d, xs, n, scale, rm, m_old, limit, &done_sum)
                 : ExpBoundedSum<false, kTerms>(d, xs, n, scale, rm, m_old, limit, &done_sum);
    if (done == n) {
      row_sum[r] += static_cast<float>(done_sum);
      return;
    }
  }
  // Passes 1 and 2 over [done, n): columns [0, done) already hold exp(y - m_old).
  const RowStats stats =
      ScaleMaskMax<kTerms>(d, xs + done, n - done, scale, plain ? rm : FromColumn(rm, done));
  if (stats.has_nan || stats.max == kInf || std::isnan(m_old)) {
    // The row's output is NaN (see SoftmaxRows); NaN state makes later blocks and
    // OnlineSoftmaxFinish keep it NaN.
    FillRow(xs, n, kNaN);
    FillRow(acc_row, acc_cols, kNaN);
    row_max[r] = kNaN;
    row_sum[r] = kNaN;
    return;
  }
  const float m_new = stats.max > m_old ? stats.max : m_old;
  if (m_new == -kInf) {
    // Every key so far is masked: p = 0, and the state stays (-inf, 0).
    FillRow(xs, n, 0.0f);
    return;
  }
  const float block_sum = static_cast<float>(ExpSubtractSum(d, xs + done, n - done, m_new));
  if (m_old == -kInf) {
    // First visible keys: nothing accumulated yet (acc is overwritten, not scaled, so it
    // need not be initialized before the first block that has a visible key).
    FillRow(acc_row, acc_cols, 0.0f);
    row_sum[r] = block_sum;
  } else {
    // m_old is finite, so the fused pass ran and stopped at a y above m_old + headroom (NaN and
    // +inf left above): m_new > m_old. Rescale what it did, acc and the sum to m_new.
    const float alpha = std::exp(m_old - m_new);  // in [0, 1)
    MulRow(d, acc_row, acc_cols, alpha);
    MulRow(d, xs, done, alpha);
    row_sum[r] = (row_sum[r] + static_cast<float>(done_sum)) * alpha + block_sum;
  }
  row_max[r] = m_new;
}

// OnlineSoftmaxUpdate (see kernels/softmax.h) with kTerms as in ScaledMaskedScores.
template <bool kTerms, class D>
HWY_INLINE void OnlineSoftmaxUpdateT(D d, float* HWY_RESTRICT scores, size_t rows, size_t cols,
                                     ptrdiff_t row_stride, float scale, const SoftmaxMasks& masks,
                                     float* HWY_RESTRICT row_max, float* HWY_RESTRICT row_sum,
                                     float* HWY_RESTRICT acc, size_t acc_cols,
                                     ptrdiff_t acc_row_stride) {
  const bool plain = !kTerms && scale == 1.0f && !masks.add[0] && !masks.add[1] &&
                     !masks.masked[0] && !masks.masked[1];
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT x = scores + static_cast<ptrdiff_t>(r) * row_stride;
    const ColumnRange c = VisibleColumns(masks, r, cols);
    OnlineRowUpdate<kTerms>(d, x, r, scale, masks, plain, c, row_max, row_sum,
                            acc + static_cast<ptrdiff_t>(r) * acc_row_stride, acc_cols);
    ZeroInvisible(x, cols, c);  // after the row's passes (why: there)
  }
}

}  // namespace softmax_detail

// See kernels/softmax.h.
inline void ExpNonPositiveRow(const float* x, float* y, size_t n) {
  namespace sd = softmax_detail;
  const hwy::HWY_NAMESPACE::ScalableTag<float> d;
  const size_t N = hwy::HWY_NAMESPACE::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hwy::HWY_NAMESPACE::StoreU(sd::ExpNonPositive(d, hwy::HWY_NAMESPACE::LoadU(d, x + i)), d,
                               y + i);
  }
  if (i < n) {
    HWY_ALIGN float buf[sd::kMaxLanesF32] = {};
    std::memcpy(buf, x + i, (n - i) * sizeof(float));
    hwy::HWY_NAMESPACE::Store(sd::ExpNonPositive(d, hwy::HWY_NAMESPACE::Load(d, buf)), d, buf);
    std::memcpy(y + i, buf, (n - i) * sizeof(float));
  }
}

// See kernels/softmax.h.
inline void SoftmaxRows(float* HWY_RESTRICT scores, size_t rows, size_t cols, ptrdiff_t row_stride,
                        float scale, const SoftmaxMasks& masks) {
  namespace sd = softmax_detail;
  const hwy::HWY_NAMESPACE::ScalableTag<float> d;
  if (sd::HasElementTerms(masks)) {
    sd::SoftmaxRowsT<true>(d, scores, rows, cols, row_stride, scale, masks);
  } else {
    sd::SoftmaxRowsT<false>(d, scores, rows, cols, row_stride, scale, masks);
  }
}

// See kernels/softmax.h.
inline void OnlineSoftmaxUpdate(float* HWY_RESTRICT scores, size_t rows, size_t cols,
                                ptrdiff_t row_stride, float scale, const SoftmaxMasks& masks,
                                float* HWY_RESTRICT row_max, float* HWY_RESTRICT row_sum,
                                float* HWY_RESTRICT acc, size_t acc_cols,
                                ptrdiff_t acc_row_stride) {
  namespace sd = softmax_detail;
  const hwy::HWY_NAMESPACE::ScalableTag<float> d;
  if (sd::HasElementTerms(masks)) {
    sd::OnlineSoftmaxUpdateT<true>(d, scores, rows, cols, row_stride, scale, masks, row_max,
                                   row_sum, acc, acc_cols, acc_row_stride);
  } else {
    sd::OnlineSoftmaxUpdateT<false>(d, scores, rows, cols, row_stride, scale, masks, row_max,
                                    row_sum, acc, acc_cols, acc_row_stride);
  }
}

// See kernels/softmax.h.
inline void OnlineSoftmaxFinish(float* HWY_RESTRICT acc, size_t rows, size_t acc_cols,
                                ptrdiff_t acc_row_stride, const float* HWY_RESTRICT row_sum) {
  namespace sd = softmax_detail;
  const hwy::HWY_NAMESPACE::ScalableTag<float> d;
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT acc_row = acc + static_cast<ptrdiff_t>(r) * acc_row_stride;
    const float sum = row_sum[r];
    if (sum == 0.0f) {
      sd::FillRow(acc_row, acc_cols, 0.0f);  // fully masked row
    } else {
      sd::MulRow(d, acc_row, acc_cols, 1.0f / sum);  // NaN sum gives NaN
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_SOFTMAX_INL_H_
