// Int8Kernel::kAvx2: the int8-activation products (gemv_int8.h) on AVX2 without VNNI (x86 AVX2
// and AVX-512 CPUs before Ice Lake / Zen 4, and MHA_TARGETS=AVX2). x86-64 only; every function
// carries the instruction set's target attribute and runs only after Int8KernelAvailable.
//
// VPMADDUBSW multiplies 32 unsigned bytes by 32 signed bytes and adds adjacent pairs into
// saturating int16; VPMADDWD by ones then adds int16 pairs into int32: four products per 32-bit
// lane, exact when no pair sum exceeds 32767. kI4: the nibbles as stored (code + 8, <= 15) are
// the unsigned operand and the activation codes (|a| <= 127) the signed one, so a pair is at most
// 3810 and the low and high halves' pairs are added in int16 before widening; the row's
// precomputed -8 x lane sum removes the + 8. kI8: |w| unsigned and a with w's sign (VPSIGNB),
// pairs at most 2 x 127 x 127. The weights reach the lane order as in the VNNI kernel: kI4 by
// VPSHUFB within 128-bit lanes, kI8 by a 4 x 8 dword transpose of the unit's four 32-blocks.
// The 16 f32 lanes are two ymm accumulators; the epilogue is the definition's, lane by lane.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/gemv_int8.h"
#include "kernels/gemv_int8_native.h"

#define MHA_AVX2_ATTR __attribute__((target("avx2")))
#define MHA_AVX2_INLINE MHA_AVX2_ATTR inline __attribute__((always_inline))

namespace mha {
namespace kernels {
// Above-baseline code lives in this namespace and the entry point only
// (tools/cross/check-x86-baseline allows exactly those).
namespace gemv_int8_avx2 {
namespace {

// Activation rows per register tile (16 registers): kI4 4 (8 accumulators, 4 decoded weight
// vectors), kI8 2 (4 accumulators, 4 weight vectors and their magnitudes).
constexpr size_t kI4Rows = 4;
constexpr size_t kI8Rows = 2;

using Args = Int8Call;

// The definition's lane tree over lanes 0..7 (a) and 8..15 (b).
MHA_AVX2_INLINE float LaneTree(__m256 a, __m256 b) {
  const __m256 t8 = _mm256_add_ps(a, b);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

MHA_AVX2_INLINE __m256 Broadcast4(__m128 x) { return _mm256_set_m128(x, x); }

// acc += float(s) * f, each rounded.
MHA_AVX2_INLINE __m256 Accumulate(__m256 acc, __m256i s, __m256 f) {
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(s), f));
}

// A row tile's accumulators zeroed and its activation rows.
template <size_t kRows>
MHA_AVX2_INLINE void StartRows(const Args& x, size_t i0, __m256 (&acc)[kRows][2],
                               const uint8_t* (&arow)[kRows]) {
#pragma GCC unroll 4
  for (size_t i = 0; i < kRows; ++i) {
    acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    arow[i] = x.Row(i0 + i);
  }
}

template <size_t kRows>
MHA_AVX2_ATTR void TileI4(const Args& x, size_t i0, size_t r) {
  const Int8ActLayout& lay = *x.lay;
  const QuantMatrix& w = *x.w;
  const uint8_t* wrow = w.codes + r * w.row_bytes;
  const float* ws = w.scales + r * w.scales_per_row;
  const bool block32 = w.block == kI4Block;
  const size_t full_scales = w.scales_per_row / 4;
  __m256 acc[kRows][2];
  const uint8_t* arow[kRows];
  StartRows(x, i0, acc, arow);
  const __m128i gather128 = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i gather = _mm256_set_m128i(gather128, gather128);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t u = 0; u < lay.units; ++u) {
    const uint8_t* g = wrow + kI4GroupBytes * u;
    const __m256i g0 =
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)), gather);
    const __m256i g1 =
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32)), gather);
    const __m256i lo0 = _mm256_and_si256(g0, low4), lo1 = _mm256_and_si256(g1, low4);
    const __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(g0, 4), low4);
    const __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(g1, 4), low4);
    __m128 ws4;
    if (!block32) {
      ws4 = _mm_set1_ps(ws[u]);
    } else if (u < full_scales) {
      ws4 = _mm_loadu_ps(ws + 4 * u);
    } else {
      alignas(16) float tail[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (size_t j = 0; 4 * u + j < w.scales_per_row; ++j) tail[j] = ws[4 * u + j];
      ws4 = _mm_load_ps(tail);
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < kRows; ++i) {
      const __m256i* a = reinterpret_cast<const __m256i*>(arow[i] + kI4Group * u);
      const __m256i* corr = reinterpret_cast<const __m256i*>(arow[i] + lay.sums_offset + 64 * u);
      const __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo0, _mm256_load_si256(a)),
                                          _mm256_maddubs_epi16(hi0, _mm256_load_si256(a + 2)));
      const __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(lo1, _mm256_load_si256(a + 1)),
                                          _mm256_maddubs_epi16(hi1, _mm256_load_si256(a + 3)));
      const __m256i s0 = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_load_si256(corr));
      const __m256i s1 = _mm256_add_epi32(_mm256_madd_epi16(p1, ones), _mm256_load_si256(corr + 1));
      const __m128 as4 =
          _mm_load_ps(reinterpret_cast<const float*>(arow[i] + lay.scales_offset) + 4 * u);
      const __m256 f = Broadcast4(_mm_mul_ps(as4, ws4));
      acc[i][0] = Accumulate(acc[i][0], s0, f);
      acc[i][1] = Accumulate(acc[i][1], s1, f);
    }
  }
#pragma GCC unroll 4
  for (size_t i = 0; i < kRows; ++i) {
    x.Out(i0 + i, r) = LaneTree(acc[i][0], acc[i][1]);
  }
}

// Four products per 32-bit lane of signed w and a: |w| times a with w's sign, pairs, then
// pairs of pairs.
MHA_AVX2_INLINE __m256i Dot4(__m256i w_abs, __m256i w, __m256i a, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(a, w)), ones);
}

template <size_t kRows>
MHA_AVX2_ATTR void TileI8(const Args& x, size_t i0, size_t r) {
  const Int8ActLayout& lay = *x.lay;
  const QuantMatrix& w = *x.w;
  const uint8_t* wrow = w.codes + r * w.row_bytes;
  __m256 acc[kRows][2];
  const uint8_t* arow[kRows];
  StartRows(x, i0, acc, arow);
  const __m256i ones = _mm256_set1_epi16(1);
  const size_t full = w.cols / kI4Group;
  for (size_t u = 0; u < lay.units; ++u) {
    // The unit's four 32-blocks (rows j of a 4 x 8 dword matrix, zero past the row's end),
    // transposed into the lane order: lanes 0..7 of the low half take dwords l = 0, 1 of each
    // block, lanes 8..15 l = 2, 3; the high half l = 4..7.
    __m256i b[4];
    if (u < full) {
      for (size_t j = 0; j < 4; ++j) {
        b[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrow + kI4Group * u + 32 * j));
      }
    } else {
      alignas(32) uint8_t tail[kI4Group] = {};
      std::copy(wrow + kI4Group * u, wrow + w.cols, tail);
      for (size_t j = 0; j < 4; ++j)
        b[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail + 32 * j));
    }
    const __m256i t0 = _mm256_unpacklo_epi32(b[0], b[1]), t1 = _mm256_unpackhi_epi32(b[0], b[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(b[2], b[3]), t3 = _mm256_unpackhi_epi32(b[2], b[3]);
    const __m256i v0 = _mm256_unpacklo_epi64(t0, t2), v1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i v2 = _mm256_unpacklo_epi64(t1, t3), v3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i lo0 = _mm256_permute2x128_si256(v0, v1, 0x20);
    const __m256i lo1 = _mm256_permute2x128_si256(v2, v3, 0x20);
    const __m256i hi0 = _mm256_permute2x128_si256(v0, v1, 0x31);
    const __m256i hi1 = _mm256_permute2x128_si256(v2, v3, 0x31);
    const __m256i lo0a = _mm256_abs_epi8(lo0), lo1a = _mm256_abs_epi8(lo1);
    const __m256i hi0a = _mm256_abs_epi8(hi0), hi1a = _mm256_abs_epi8(hi1);
#pragma GCC unroll 4
    for (size_t i = 0; i < kRows; ++i) {
      const __m256i* a = reinterpret_cast<const __m256i*>(arow[i] + kI4Group * u);
      const __m256i s0 = _mm256_add_epi32(Dot4(lo0a, lo0, _mm256_load_si256(a), ones),
                                          Dot4(hi0a, hi0, _mm256_load_si256(a + 2), ones));
      const __m256i s1 = _mm256_add_epi32(Dot4(lo1a, lo1, _mm256_load_si256(a + 1), ones),
                                          Dot4(hi1a, hi1, _mm256_load_si256(a + 3), ones));
      const __m256 f =
          _mm256_broadcast_ps(reinterpret_cast<const __m128*>(arow[i] + lay.scales_offset) + u);
      acc[i][0] = Accumulate(acc[i][0], s0, f);
      acc[i][1] = Accumulate(acc[i][1], s1, f);
    }
  }
  const float ws = w.scales[r * w.scales_per_row];
#pragma GCC unroll 4
  for (size_t i = 0; i < kRows; ++i) {
    x.Out(i0 + i, r) = LaneTree(acc[i][0], acc[i][1]) * ws;
  }
}

template <size_t kMaxRows, void (*Tile1)(const Args&, size_t, size_t),
          void (*Tile2)(const Args&, size_t, size_t), void (*Tile3)(const Args&, size_t, size_t),
          void (*Tile4)(const Args&, size_t, size_t)>
MHA_AVX2_ATTR void AllTiles(const Args& x, size_t rows) {
  for (size_t b0 = 0; b0 < rows; b0 += kInt8BlockRows) {
    const size_t b1 = std::min(rows, b0 + kInt8BlockRows);
    for (size_t r = 0; r < x.w->rows; ++r) {
      for (size_t i0 = b0; i0 < b1; i0 += kMaxRows) {
        switch (std::min(kMaxRows, b1 - i0)) {
          case 1:
            Tile1(x, i0, r);
            break;
          case 2:
            Tile2(x, i0, r);
            break;
          case 3:
            Tile3(x, i0, r);
            break;
          default:
            Tile4(x, i0, r);
            break;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gemv_int8_avx2

// Blocks of 32 activation rows (L2); within a block each weight row (in L1) against the block's
// row tiles.
MHA_AVX2_ATTR void GemvInt8Avx2(const uint8_t* qa, size_t rows, const QuantMatrix& w,
                                const MatrixView& c) {
  namespace v = gemv_int8_avx2;
  const Int8ActLayout lay = Int8ActLayoutOf(w.type, w.block, w.cols);
  const Int8Call x{qa, &lay, &w, c.data, c.row_stride, c.col_stride};
  if (w.type == DType::kI8) {
    v::AllTiles<v::kI8Rows, v::TileI8<1>, v::TileI8<2>, v::TileI8<2>, v::TileI8<2>>(x, rows);
  } else {
    v::AllTiles<v::kI4Rows, v::TileI4<1>, v::TileI4<2>, v::TileI4<3>, v::TileI4<4>>(x, rows);
  }
}

}  // namespace kernels
}  // namespace mha
