// Per-target bf16 rounding and packing; the contract is in kernels/pack_bf16.h. Included once
// per Highway target by kernels/pack_bf16.cc (foreach_target).
//
// Rows of a round through elementwise-inl.h's F32ToBF16 (the one rounding of every bf16 path).
// A b with contiguous rows (V, weights' w^T views with col_stride 1) packs two rows at a time:
// a pair row's word j is bf16(row 2p)[j] | bf16(row 2p + 1)[j] << 16, whole vectors of u32
// lanes, no shuffle. A b with contiguous columns (K^T: a key's head_dim values) rounds each
// column once and stores its pairs one 32-bit word apart per pair row.

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_PACK_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_PACK_BF16_INL_H_
#undef MHA_KERNELS_PACK_BF16_INL_H_
#else
#define MHA_KERNELS_PACK_BF16_INL_H_
#endif

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "kernels/elementwise-inl.h"
#include "kernels/gemm_bf16.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {
namespace pack_bf16_detail {

namespace hn = hwy::HWY_NAMESPACE;

// One f32 to bf16 bits, as elementwise_detail::F32ToBF16Bits rounds (for tails).
inline uint16_t RoundOne(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// Element j of a pair row starting at `pair_row` (column j of the packing's block).
inline uint16_t* PairAt(uint16_t* pair_row, size_t j, size_t panel_stride) {
  return pair_row + (j / kBf16PanelCols) * panel_stride + (j % kBf16PanelCols) * 2;
}

// b rows contiguous (col_stride 1).
inline void PackPairRows(const float* HWY_RESTRICT b, ptrdiff_t row_stride, size_t kc, size_t n,
                         uint16_t* HWY_RESTRICT block, size_t panel_stride) {
  // At most half a panel per vector, so a vector of columns never straddles two panels.
  const hn::CappedTag<float, kBf16PanelCols / 2> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t N = hn::Lanes(df);
  const bool whole_vectors = kBf16PanelCols % N == 0;
  for (size_t kk = 0; kk < kc; kk += 2) {
    const float* r0 = b + static_cast<ptrdiff_t>(kk) * row_stride;
    const float* r1 = kk + 1 < kc ? r0 + row_stride : nullptr;
    uint16_t* pair_row = block + (kk / 2) * 2 * kBf16PanelCols;
    size_t j = 0;
    if (whole_vectors) {
      for (; j + N <= n; j += N) {
        auto w = elementwise_detail::F32ToBF16BitsU32(df, hn::LoadU(df, r0 + j));
        if (r1 != nullptr) {
          w = hn::Or(w, hn::ShiftLeft<16>(
                            elementwise_detail::F32ToBF16BitsU32(df, hn::LoadU(df, r1 + j))));
        }
        hn::StoreU(w, du, reinterpret_cast<uint32_t*>(PairAt(pair_row, j, panel_stride)));
      }
    }
    for (; j < n; ++j) {
      uint16_t* dst = PairAt(pair_row, j, panel_stride);
      dst[0] = RoundOne(r0[j]);
      if (r1 != nullptr) dst[1] = RoundOne(r1[j]);
    }
  }
}

// b columns contiguous (row_stride 1): column j at b + j * col_stride, kc <= kBf16BlockDepth.
inline void PackColumns(const float* HWY_RESTRICT b, ptrdiff_t col_stride, size_t kc, size_t n,
                        uint16_t* HWY_RESTRICT block, size_t panel_stride) {
  assert(kc <= kBf16BlockDepth && "PackBF16Block: one k block");
  uint16_t col[kBf16BlockDepth];
  for (size_t j = 0; j < n; ++j) {
    F32ToBF16(b + static_cast<ptrdiff_t>(j) * col_stride, col, kc);
    uint16_t* dst = PairAt(block, j, panel_stride);
    size_t kk = 0;
    for (; kk + 1 < kc; kk += 2) {
      std::memcpy(dst + kk * kBf16PanelCols, col + kk, 2 * sizeof(uint16_t));
    }
    if (kk < kc) dst[kk * kBf16PanelCols] = col[kk];
  }
}

}  // namespace pack_bf16_detail

inline void RoundRowsToBF16(const float* HWY_RESTRICT a, ptrdiff_t row_stride, size_t rows,
                            size_t cols, size_t padded, uint16_t* HWY_RESTRICT dst,
                            size_t dst_stride) {
  for (size_t i = 0; i < rows; ++i) {
    uint16_t* out = dst + i * dst_stride;
    F32ToBF16(a + static_cast<ptrdiff_t>(i) * row_stride, out, cols);
    std::memset(out + cols, 0, (padded - cols) * sizeof(uint16_t));
  }
}

inline void PackBF16Block(const float* HWY_RESTRICT b, ptrdiff_t row_stride, ptrdiff_t col_stride,
                          size_t kc, size_t n, uint16_t* HWY_RESTRICT block, size_t panel_stride) {
  namespace pd = pack_bf16_detail;
  if (col_stride == 1) {
    pd::PackPairRows(b, row_stride, kc, n, block, panel_stride);
  } else if (row_stride == 1) {
    pd::PackColumns(b, col_stride, kc, n, block, panel_stride);
  } else {
    for (size_t kk = 0; kk < kc; ++kk) {
      uint16_t* pair_row = block + (kk / 2) * 2 * kBf16PanelCols + kk % 2;
      for (size_t j = 0; j < n; ++j) {
        *pd::PairAt(pair_row, j, panel_stride) = pd::RoundOne(
            b[static_cast<ptrdiff_t>(kk) * row_stride + static_cast<ptrdiff_t>(j) * col_stride]);
      }
    }
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_PACK_BF16_INL_H_
