// Per-target loads of quantized weights (kernels/quant.h's layout) as f32 vectors, shared by the
// dequantization of rows (quant.cc) and the GEMV over quantized weights (gemv_quant-inl.h).
// Included once per Highway target.
//
// Vectors are of kMaxQuantLanes f32 lanes at most (hn::CappedTag): a kI4 vector must lie in one
// nibble of a group's 16 words (16 consecutive elements), and a vector of that width is x86's and
// NEON's full width, so the products over these vectors order their sums as the f32 kernels do
// (gemv_quant.h). The kI4 words are loaded as little-endian (every target Highway compiles here).

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
};

// The 32-bit words of Lanes(df) consecutive kI4 words at p (quant.h's layout; any alignment).
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> I4Words(DF /* df */, const uint8_t* p) {
  const hn::RebindToUnsigned<DF> du;
  return hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
}

// The codes whose nibbles are the low 4 bits of each lane of `words` (higher bits ignored), as
// f32: the nibble or-ed into the bits of 2^23 is the f32 2^23 + nibble, and subtracting 2^23 + 8
// leaves nibble - 8, the code, exactly. No shuffle on any target (AVX-512: a shift before this,
// one ternary-logic and one subtraction).
template <class DF, class VU>
HWY_INLINE hn::Vec<DF> I4CodesOf(DF df, VU words) {
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::OrAnd(hn::Set(du, 0x4B000000u), words, hn::Set(du, 0xFu));
  return hn::Sub(hn::BitCast(df, bits), hn::Set(df, 8388616.0f));  // 2^23 + 8
}

// A run of kI8 elements from p: element i's code, a vector's from element i.
struct I8Run {
  const uint8_t* p;
  template <class DF>
  HWY_INLINE hn::Vec<DF> Load(DF df, size_t i) const {
    return I8Codes::Load(df, p + i);
  }
  HWY_INLINE int Scalar(size_t i) const { return I8Code(p[i]); }
};

// A run of kI4 elements that are nibble `shift` / 4 of consecutive words from `words`: element i
// is that nibble of word i.
struct I4Run {
  const uint8_t* words;
  int shift;
  template <class DF>
  HWY_INLINE hn::Vec<DF> Load(DF df, size_t i) const {
    return I4CodesOf(df, hn::ShiftRightSame(I4Words(df, words + 4 * i), shift));
  }
  HWY_INLINE int Scalar(size_t i) const {
    return ((words[4 * i + shift / 8] >> (shift % 8)) & 0xF) - 8;
  }
};

// Dequantized weights of elements [0, n) of a run that shares one scale (codes: an I8Run or
// I4Run) into dst: vectors of Lanes(df), then element by element.
template <class Codes, class DF>
HWY_INLINE void DequantizeRun(DF df, const Codes& codes, float scale, size_t n, float* dst) {
  const size_t N = hn::Lanes(df);
  const auto s = hn::Set(df, scale);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(codes.Load(df, i), s), df, dst + i);
  // The rest element by element: a vector would read past the run. The product is the same
  // IEEE multiplication (no FMA contraction in mha's builds).
  for (; i < n; ++i) dst[i] = static_cast<float>(codes.Scalar(i)) * scale;
}

}  // namespace quant_detail

// Elements [p0, p0 + n) of rows [r0, r0 + rows) of a quantized matrix (quant.h) dequantized into
// dst (row i at dst + i * ld): per row, kI8 in one run, kI4 in runs of one group's nibble (16
// consecutive elements, one scale).
inline void DequantizeRowsImpl(const uint8_t* codes, const float* scales, DType type, size_t block,
                               size_t row_bytes, size_t scales_per_row, size_t r0, size_t rows,
                               size_t p0, size_t n, float* dst, size_t ld) {
  namespace qd = quant_detail;
  namespace hn = hwy::HWY_NAMESPACE;
  const qd::QuantTag df;
  // kI4 blocks are powers of two (32 or 128): an element's scale by a shift, not a division
  // per run of 16 (a 64-bit division cost more than the run's dequantization).
  size_t block_shift = 0;
  while (type == DType::kI4 && (size_t{1} << block_shift) < block) ++block_shift;
  for (size_t i = 0; i < rows; ++i) {
    const uint8_t* row = codes + (r0 + i) * row_bytes;
    const float* row_scales = scales + (r0 + i) * scales_per_row;
    float* out = dst + i * ld;
    if (type == DType::kI8) {
      qd::DequantizeRun(df, qd::I8Run{row + p0}, row_scales[0], n, out);
      continue;
    }
    size_t p = p0;
    const size_t N = hn::Lanes(df);
    if (p % kI4Group == 0 && 16 % N == 0) {
      // Whole groups: each vector of a group's words loaded once for its 8 nibbles (the runs
      // below, minus their per-run bookkeeping).
      for (; p + kI4Group <= p0 + n; p += kI4Group) {
        const uint8_t* words = row + p / kI4Group * kI4GroupBytes;
        float* o = out + (p - p0);
        for (size_t k0 = 0; k0 < 16; k0 += N) {
          const auto w = qd::I4Words(df, words + 4 * k0);
          for (int nib = 0; nib < 8; ++nib) {
            const auto scale = hn::Set(df, row_scales[(p + 16 * nib) >> block_shift]);
            const auto codes = qd::I4CodesOf(df, hn::ShiftRightSame(w, 4 * nib));
            hn::StoreU(hn::Mul(codes, scale), df, o + 16 * nib + k0);
          }
        }
      }
    }
    for (; p < p0 + n;) {
      const size_t in_slice = p % 16;
      const size_t len = (16 - in_slice < p0 + n - p ? 16 - in_slice : p0 + n - p);
      const uint8_t* words = row + p / kI4Group * kI4GroupBytes + 4 * in_slice;
      const int shift = static_cast<int>(p % kI4Group / 16 * 4);
      qd::DequantizeRun(df, qd::I4Run{words, shift}, row_scales[p >> block_shift], len,
                        out + (p - p0));
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
