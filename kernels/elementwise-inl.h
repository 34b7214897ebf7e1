// Per-target element-wise kernels; the contract is in kernels/elementwise.h. Included once per
// Highway target by kernels/elementwise.cc (foreach_target); other per-target code may include
// it and call these functions directly.
//
// The 16-bit conversions are bit-exact and identical on every target:
// - bf16: Highway 1.0.3's DemoteTo to bfloat16_t truncates, so rounding is done here with
//   integer ops (add 0x7FFF plus the lowest kept bit, then shift); NaN keeps its sign and top
//   payload bits and gets the quiet bit (0x0040) so it cannot round to inf.
// - f16: on x86 AVX2 and above, Highway uses the F16C instructions (round to nearest even,
//   subnormals and inf exact, NaN quieted with its top payload bits). Highway 1.0.3's emulation
//   for the other targets truncates, flushes small values and maps inf/NaN to finite numbers, so
//   those targets use the integer/float algorithm below, which reproduces F16C bit for bit
//   (tests/elementwise_test.cc checks every target against one scalar reference).

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_ELEMENTWISE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_ELEMENTWISE_INL_H_
#undef MHA_KERNELS_ELEMENTWISE_INL_H_
#else
#define MHA_KERNELS_ELEMENTWISE_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {
namespace elementwise_detail {

namespace hn = hwy::HWY_NAMESPACE;

// Upper bound on the lanes of an f32 vector on this target (for the tail buffers).
constexpr size_t kMaxLanesF32 = HWY_MAX_BYTES / sizeof(float);

#undef MHA_KERNELS_HAVE_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define MHA_KERNELS_HAVE_F16C 1
#else
#define MHA_KERNELS_HAVE_F16C 0
#endif

// f32 -> bf16 bits, round to nearest even, in the low half of u32 lanes (the high half zero).
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToBF16BitsU32(DF /*df*/, VF v) {
  const hn::RebindToUnsigned<DF> du32;
  const hn::RebindToSigned<DF> di32;
  const auto bits = hn::BitCast(du32, v);
  const auto abs = hn::And(bits, hn::Set(du32, 0x7FFFFFFFu));
  const auto is_nan = hn::RebindMask(
      du32, hn::Gt(hn::BitCast(di32, abs), hn::Set(di32, 0x7F800000)));  // abs fits in i32
  const auto high = hn::ShiftRight<16>(bits);
  const auto lsb = hn::And(high, hn::Set(du32, 1u));
  // Overflow of the low half carries into the exponent: the largest finite values round to inf.
  const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(bits, hn::Set(du32, 0x7FFFu)), lsb));
  const auto quiet_nan = hn::Or(high, hn::Set(du32, 0x0040u));
  return hn::IfThenElse(is_nan, quiet_nan, rounded);  // every lane < 0x10000
}

// f32 -> bf16 bits, round to nearest even. Returns Lanes(df) u16 lanes.
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> F32ToBF16Bits(DF df, VF v) {
  const hn::RebindToSigned<DF> di32;
  const hn::Rebind<uint16_t, DF> du16;
  return hn::DemoteTo(du16, hn::BitCast(di32, F32ToBF16BitsU32(df, v)));
}

// bf16 bits (Lanes(df) u16 lanes) -> f32: exact.
template <class DF>
HWY_INLINE hn::Vec<DF> BF16BitsToF32(DF df, hn::Vec<hn::Rebind<uint16_t, DF>> h) {
  const hn::RebindToUnsigned<DF> du32;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, h)));
}

// f32 -> IEEE binary16 bits, round to nearest even, overflow to inf.
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> F32ToF16Bits(DF df, VF v) {
  const hn::Rebind<uint16_t, DF> du16;
#if MHA_KERNELS_HAVE_F16C
  (void)df;
  const hn::Rebind<hwy::float16_t, DF> df16;
  return hn::BitCast(du16, hn::DemoteTo(df16, v));
#else
  const hn::RebindToUnsigned<DF> du32;
  const hn::RebindToSigned<DF> di32;
  const auto bits = hn::BitCast(du32, v);
  const auto abs = hn::And(bits, hn::Set(du32, 0x7FFFFFFFu));
  const auto sign = hn::ShiftRight<16>(hn::And(bits, hn::Set(du32, 0x80000000u)));
  const auto abs_i = hn::BitCast(di32, abs);  // non-negative, so signed compares are safe
  // |v| >= 65520 rounds to inf: the normal path's carry produces 0x7C00 for [65520, 65536).
  const auto is_inf_nan = hn::RebindMask(du32, hn::Gt(abs_i, hn::Set(di32, 0x477FFFFF)));
  const auto is_nan = hn::RebindMask(du32, hn::Gt(abs_i, hn::Set(di32, 0x7F800000)));
  const auto is_small = hn::RebindMask(du32, hn::Lt(abs_i, hn::Set(di32, 0x38800000)));
  // NaN: quiet bit plus the top 9 payload bits (as F16C).
  const auto nan16 = hn::Or(hn::And(hn::ShiftRight<13>(abs), hn::Set(du32, 0x3FFu)),
                            hn::Set(du32, 0x7E00u));
  const auto inf_nan16 = hn::IfThenElse(is_nan, nan16, hn::Set(du32, 0x7C00u));
  // |v| < 2^-14 (f16 subnormal or zero): adding 0.5f aligns the f16 subnormal grid (2^-24) with
  // the f32 ulp of 0.5, so the FPU's own round-to-nearest-even does the rounding.
  const auto small16 = hn::Sub(
      hn::BitCast(du32, hn::Add(hn::BitCast(df, abs), hn::Set(df, 0.5f))),
      hn::Set(du32, 0x3F000000u));
  // Normal: rebias the exponent (127 -> 15), then round the 13 dropped bits to nearest even.
  const auto lsb = hn::And(hn::ShiftRight<13>(abs), hn::Set(du32, 1u));
  const auto normal16 = hn::ShiftRight<13>(
      hn::Add(hn::Sub(abs, hn::Set(du32, 0x37FFF001u)), lsb));  // - (112 << 23) + 0xFFF
  const auto mag = hn::IfThenElse(is_inf_nan, inf_nan16,
                                  hn::IfThenElse(is_small, small16, normal16));
  return hn::DemoteTo(du16, hn::BitCast(di32, hn::Or(mag, sign)));  // every lane < 0x10000
#endif
}

// IEEE binary16 bits (Lanes(df) u16 lanes) -> f32: exact; NaN gets the quiet bit (as F16C).
template <class DF>
HWY_INLINE hn::Vec<DF> F16BitsToF32(DF df, hn::Vec<hn::Rebind<uint16_t, DF>> h) {
#if MHA_KERNELS_HAVE_F16C
  const hn::Rebind<hwy::float16_t, DF> df16;
  return hn::PromoteTo(df, hn::BitCast(df16, h));
#else
  const hn::RebindToUnsigned<DF> du32;
  const auto bits = hn::PromoteTo(du32, h);
  const auto sign = hn::ShiftLeft<16>(hn::And(bits, hn::Set(du32, 0x8000u)));
  const auto shifted = hn::ShiftLeft<13>(hn::And(bits, hn::Set(du32, 0x7FFFu)));
  const auto exp = hn::And(shifted, hn::Set(du32, 0x0F800000u));
  const auto mantissa = hn::And(shifted, hn::Set(du32, 0x007FE000u));
  // Normal: rebias the exponent (15 -> 127).
  const auto normal = hn::Add(shifted, hn::Set(du32, 0x38000000u));
  // Inf/NaN: all-ones exponent, payload kept, quiet bit set for NaN.
  const auto quiet = hn::IfThenZeroElse(hn::Eq(mantissa, hn::Zero(du32)), hn::Set(du32, 0x00400000u));
  const auto inf_nan = hn::Or(hn::Or(shifted, hn::Set(du32, 0x7F800000u)), quiet);
  // Subnormal or zero: m * 2^-24 as (2^-14 + m * 2^-24) - 2^-14, both steps exact.
  const auto k2m14 = hn::Set(du32, 0x38800000u);
  const auto sub = hn::BitCast(
      du32, hn::Sub(hn::BitCast(df, hn::Add(shifted, k2m14)), hn::BitCast(df, k2m14)));
  const auto mag =
      hn::IfThenElse(hn::Eq(exp, hn::Set(du32, 0x0F800000u)), inf_nan,
                     hn::IfThenElse(hn::Eq(exp, hn::Zero(du32)), sub, normal));
  return hn::BitCast(df, hn::Or(mag, sign));
#endif
}

// Applies `convert` (f32 vector -> u16 vector) to n floats; the tail goes through buffers.
template <class DF, class Func>
HWY_INLINE void ConvertF32To16(DF df, const float* HWY_RESTRICT x, uint16_t* HWY_RESTRICT y,
                               size_t n, Func convert) {
  const hn::Rebind<uint16_t, DF> du16;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(convert(df, hn::LoadU(df, x + i)), du16, y + i);
  if (i < n) {
    const size_t rem = n - i;
    HWY_ALIGN float in[kMaxLanesF32] = {};
    HWY_ALIGN uint16_t out[kMaxLanesF32];
    std::memcpy(in, x + i, rem * sizeof(float));
    hn::Store(convert(df, hn::Load(df, in)), du16, out);
    std::memcpy(y + i, out, rem * sizeof(uint16_t));
  }
}

// Applies `convert` (u16 vector -> f32 vector) to n 16-bit values; the tail goes through buffers.
template <class DF, class Func>
HWY_INLINE void Convert16ToF32(DF df, const uint16_t* HWY_RESTRICT x, float* HWY_RESTRICT y,
                               size_t n, Func convert) {
  const hn::Rebind<uint16_t, DF> du16;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(convert(df, hn::LoadU(du16, x + i)), df, y + i);
  if (i < n) {
    const size_t rem = n - i;
    HWY_ALIGN uint16_t in[kMaxLanesF32] = {};
    HWY_ALIGN float out[kMaxLanesF32];
    std::memcpy(in, x + i, rem * sizeof(uint16_t));
    hn::Store(convert(df, hn::Load(du16, in)), df, out);
    std::memcpy(y + i, out, rem * sizeof(float));
  }
}

// Row readers for kernels that stream f32, bf16 or f16 rows (decode, GEMV): Load widens Lanes(df) elements at p to f32; Scalar widens one (for the
// hd % lanes tail). All conversions are exact.
struct F32Row {
  using T = float;
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const T* p) {
    return hn::LoadU(df, p);
  }
  static HWY_INLINE float Scalar(T x) { return x; }
};

struct BF16Row {
  using T = uint16_t;
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const T* p) {
    return elementwise_detail::BF16BitsToF32(df, hn::LoadU(hn::Rebind<uint16_t, DF>(), p));
  }
  static HWY_INLINE float Scalar(T x) {
    const uint32_t bits = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
};

struct F16Row {
  using T = uint16_t;
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const T* p) {
    return elementwise_detail::F16BitsToF32(df, hn::LoadU(hn::Rebind<uint16_t, DF>(), p));
  }
  static HWY_INLINE float Scalar(T x) {
    const uint32_t sign = static_cast<uint32_t>(x & 0x8000u) << 16;
    const uint32_t exp = (x >> 10) & 0x1Fu;
    const uint32_t mantissa = x & 0x3FFu;
    uint32_t bits;
    if (exp == 0) {
      // Zero or subnormal: mantissa * 2^-24, exact in f32.
      const float mag = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
      std::memcpy(&bits, &mag, sizeof(bits));
      bits |= sign;
    } else if (exp == 31) {
      bits = sign | 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
    } else {
      bits = sign | ((exp + 112) << 23) | (mantissa << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
};

}  // namespace elementwise_detail

// See kernels/elementwise.h. The scalar tails round exactly as the vector lanes do.
inline void AddBiasToRows(const float* HWY_RESTRICT bias, float* HWY_RESTRICT y, size_t rows,
                          size_t cols, ptrdiff_t row_stride) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t r = 0; r < rows; ++r) {
    float* HWY_RESTRICT row = y + static_cast<ptrdiff_t>(r) * row_stride;
    size_t i = 0;
    for (; i + N <= cols; i += N) {
      hn::StoreU(hn::Add(hn::LoadU(d, row + i), hn::LoadU(d, bias + i)), d, row + i);
    }
    for (; i < cols; ++i) row[i] += bias[i];
  }
}

// See kernels/elementwise.h. One pass reads the four blocks once (four separate add/subtract
// passes read eight blocks and write four: StrassenSumsOfA of [128, 512], one thread, in
// cache, 10.0 us as four passes, 7.9 us as one).
inline void WinogradSums(const float* HWY_RESTRICT a, ptrdiff_t lda, size_t h, size_t k2,
                         float* HWY_RESTRICT s1, float* HWY_RESTRICT s2, float* HWY_RESTRICT s3,
                         float* HWY_RESTRICT s4, ptrdiff_t lds) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t r = 0; r < h; ++r) {
    const float* HWY_RESTRICT a1 = a + static_cast<ptrdiff_t>(r) * lda;      // row r of A11 | A12
    const float* HWY_RESTRICT a2 = a + static_cast<ptrdiff_t>(r + h) * lda;  // of A21 | A22
    const ptrdiff_t o = static_cast<ptrdiff_t>(r) * lds;
    size_t i = 0;
    for (; i + N <= k2; i += N) {
      const auto a11 = hn::LoadU(d, a1 + i), a12 = hn::LoadU(d, a1 + k2 + i);
      const auto a21 = hn::LoadU(d, a2 + i), a22 = hn::LoadU(d, a2 + k2 + i);
      const auto v1 = hn::Add(a21, a22);
      const auto v2 = hn::Sub(v1, a11);
      hn::StoreU(v1, d, s1 + o + i);
      hn::StoreU(v2, d, s2 + o + i);
      hn::StoreU(hn::Sub(a11, a21), d, s3 + o + i);
      hn::StoreU(hn::Sub(a12, v2), d, s4 + o + i);
    }
    for (; i < k2; ++i) {
      const float v1 = a2[i] + a2[k2 + i];
      const float v2 = v1 - a1[i];
      s1[o + i] = v1;
      s2[o + i] = v2;
      s3[o + i] = a1[i] - a2[i];
      s4[o + i] = a1[k2 + i] - v2;
    }
  }
}

inline void ScaleBy(float s, float* HWY_RESTRICT y, size_t n) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto vs = hn::Set(d, s);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, y + i), vs), d, y + i);
  for (; i < n; ++i) y[i] *= s;
}

inline void AddInto(const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::StoreU(hn::Add(hn::LoadU(d, y + i), hn::LoadU(d, x + i)), d, y + i);
  }
  for (; i < n; ++i) y[i] += x[i];
}

inline void F32ToBF16(const float* HWY_RESTRICT x, uint16_t* HWY_RESTRICT y, size_t n) {
  namespace ed = elementwise_detail;
  ed::ConvertF32To16(hwy::HWY_NAMESPACE::ScalableTag<float>(), x, y, n,
                     [](auto df, auto v) HWY_ATTR { return ed::F32ToBF16Bits(df, v); });
}

inline void BF16ToF32(const uint16_t* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  namespace ed = elementwise_detail;
  ed::Convert16ToF32(hwy::HWY_NAMESPACE::ScalableTag<float>(), x, y, n,
                     [](auto df, auto h) HWY_ATTR { return ed::BF16BitsToF32(df, h); });
}

inline void F32ToF16(const float* HWY_RESTRICT x, uint16_t* HWY_RESTRICT y, size_t n) {
  namespace ed = elementwise_detail;
  ed::ConvertF32To16(hwy::HWY_NAMESPACE::ScalableTag<float>(), x, y, n,
                     [](auto df, auto v) HWY_ATTR { return ed::F32ToF16Bits(df, v); });
}

inline void F16ToF32(const uint16_t* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  namespace ed = elementwise_detail;
  ed::Convert16ToF32(hwy::HWY_NAMESPACE::ScalableTag<float>(), x, y, n,
                     [](auto df, auto h) HWY_ATTR { return ed::F16BitsToF32(df, h); });
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_ELEMENTWISE_INL_H_
