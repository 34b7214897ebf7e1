// Per-target loads of quantized weights (kernels/quant.h's layout) as f32 vectors, shared by the
// dequantization of rows (quant.cc) and the GEMV over quantized weights (gemv_quant-inl.h).
// Included once per Highway target.
//
// Vectors are of kMaxQuantLanes f32 lanes at most (hn::CappedTag): a kI4 vector must lie in one
// half of a block (16 elements at block 32), and a vector of that width is x86's and NEON's full
// width, so the products over these vectors order their sums as the f32 kernels do
// (gemv_quant.h).

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_QUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_QUANT_INL_H_
#undef MHA_KERNELS_QUANT_INL_H_
#else
#define MHA_KERNELS_QUANT_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/quant.h"
#include "mha/types.hpp"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {
namespace quant_detail {

namespace hn = hwy::HWY_NAMESPACE;

constexpr size_t kMaxQuantLanes = 16;
using QuantTag = hn::CappedTag<float, kMaxQuantLanes>;

// Codes of Lanes(df) consecutive kI8 elements (signed bytes at p) as f32 (exact).
struct I8Codes {
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const uint8_t* p) {
    const hn::RebindToSigned<DF> di;
    const auto bytes = hn::LoadU(hn::Rebind<int8_t, DF>(), reinterpret_cast<const int8_t*>(p));
    return hn::ConvertTo(df, hn::PromoteTo(di, bytes));
  }
  static HWY_INLINE int Scalar(const uint8_t* p) { return I8Code(*p); }
};

// Codes in the low nibbles of Lanes(df) consecutive kI4 bytes at p: masked and offset at byte
// width (one 16-byte register on x86 for AVX-512's 16 lanes), then sign-extended to 32 bits.
struct I4LowCodes {
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const uint8_t* p) {
    const hn::Rebind<uint8_t, DF> du8;
    const auto b = hn::LoadU(du8, p);
    const auto codes = hn::Sub(hn::And(b, hn::Set(du8, 0x0F)), hn::Set(du8, 8));  // wraps
    return hn::ConvertTo(
        df, hn::PromoteTo(hn::RebindToSigned<DF>(), hn::BitCast(hn::Rebind<int8_t, DF>(), codes)));
  }
  static HWY_INLINE int Scalar(const uint8_t* p) { return I4LowCode(*p); }
};

// Codes in the high nibbles: shifted down and offset at byte width, then sign-extended.
struct I4HighCodes {
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Load(DF df, const uint8_t* p) {
    const hn::Rebind<uint8_t, DF> du8;
    const auto b = hn::LoadU(du8, p);
    const auto codes = hn::Sub(hn::ShiftRight<4>(b), hn::Set(du8, 8));  // wraps
    return hn::ConvertTo(
        df, hn::PromoteTo(hn::RebindToSigned<DF>(), hn::BitCast(hn::Rebind<int8_t, DF>(), codes)));
  }
  static HWY_INLINE int Scalar(const uint8_t* p) { return I4HighCode(*p); }
};

// Dequantized weights of elements [p, p + n) of one row into dst, for a run that shares one
// scale and one kind of code (Codes): vectors of Lanes(df), then element by element.
template <class Codes, class DF>
HWY_INLINE void DequantizeRun(DF df, const uint8_t* bytes, float scale, size_t n, float* dst) {
  const size_t N = hn::Lanes(df);
  const auto s = hn::Set(df, scale);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(Codes::Load(df, bytes + i), s), df, dst + i);
  // The rest element by element: a vector would read past the run. The product is the same
  // IEEE multiplication (no FMA contraction in mha's builds).
  for (; i < n; ++i) dst[i] = static_cast<float>(Codes::Scalar(bytes + i)) * scale;
}

}  // namespace quant_detail

// Elements [p0, p0 + n) of rows [r0, r0 + rows) of a quantized matrix (quant.h) dequantized into
// dst (row i at dst + i * ld): per row, runs of one scale and one nibble half.
inline void DequantizeRowsImpl(const uint8_t* codes, const float* scales, DType type, size_t block,
                               size_t row_bytes, size_t scales_per_row, size_t r0, size_t rows,
                               size_t p0, size_t n, float* dst, size_t ld) {
  namespace qd = quant_detail;
  const qd::QuantTag df;
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* row = codes + (r0 + i) * row_bytes;
    const float* row_scales = scales + (r0 + i) * scales_per_row;
    float* out = dst + i * ld;
    if (type == DType::kI8) {
      qd::DequantizeRun<qd::I8Codes>(df, row + p0, row_scales[0], n, out);
      continue;
    }
    const size_t half = block / 2;
    for (size_t p = p0; p < p0 + n;) {
      const size_t in_block = p % block;
      const size_t run_end = p - in_block + (in_block < half ? half : block);
      const size_t len = (run_end < p0 + n ? run_end : p0 + n) - p;
      const uint8_t* bytes = row + p / block * half + in_block % half;
      if (in_block < half) {
        qd::DequantizeRun<qd::I4LowCodes>(df, bytes, row_scales[p / block], len, out + (p - p0));
      } else {
        qd::DequantizeRun<qd::I4HighCodes>(df, bytes, row_scales[p / block], len, out + (p - p0));
      }
      p += len;
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_QUANT_INL_H_
