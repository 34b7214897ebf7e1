// Int8Kernel::kAvx512Vnni: the int8-activation products (gemv_int8.h) on AVX512_VNNI
// (VPDPBUSD). x86-64 only; every function carries the instruction set's target attribute (the
// rest of the library is compiled for baseline x86-64) and runs only after Int8KernelAvailable.
//
// VPDPBUSD multiplies 4 unsigned bytes of its first operand by 4 signed bytes of its second and
// adds the 4 products to a 32-bit lane: one instruction is the 16 lane sums of one unit
// (gemv_int8.h) for kI8, two for kI4 (the low and the high nibbles). The unsigned operand is the
// weight: kI8 codes + 128 (an xor of the sign bit), kI4 nibbles as stored (code + 8); the
// accumulator starts at the activation row's precomputed -128 or -8 times its lane's code sum,
// so each lane ends at the exact int sum of code(a) * code(w). kI4's words hold the four
// 32-blocks' elements in one 32-bit lane (quant.h); a byte shuffle within each 128-bit lane
// (VPSHUFB) gathers each block's bytes into one lane first (lane 4l + j: block j). The f32
// epilogue is the definition's, lane by lane, then the lane tree by halving.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/gemv_int8.h"

#define MHA_VNNI_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define MHA_VNNI_INLINE MHA_VNNI_ATTR inline __attribute__((always_inline))

namespace mha {
namespace kernels {
// Above-baseline code lives in this namespace and the entry point only
// (tools/cross/check-x86-baseline allows exactly those).
namespace gemv_int8_avx512vnni {
namespace {

// Register tile: up to kMaxRows rows of activations x kMaxCols weight rows (8 accumulators,
// 2 x 2 decoded weight vectors for kI4).
constexpr size_t kMaxRows = 4;
constexpr size_t kMaxCols = 2;
// All 16 lanes: the zero-masking forms of the intrinsics whose plain forms start from
// _mm512_undefined_*, which GCC 12 reports as maybe-uninitialized.
constexpr __mmask16 kAll = 0xFFFF;

// The definition's lane tree: lanes L + 8, then L + 4, L + 2, L + 1.
MHA_VNNI_INLINE float LaneTree(__m512 acc) {
  const __m256 t8 = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, acc, 0), _mm512_maskz_extractf32x8_ps(0xFF, acc, 1));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

struct Args {
  const uint8_t* qa;
  const Int8ActLayout* lay;
  const QuantMatrix* w;
  float* c;
  ptrdiff_t c_rs, c_cs;
};

// A tile's accumulators zeroed, its weight rows' and activation rows' first bytes.
template <size_t kRows, size_t kCols>
MHA_VNNI_INLINE void StartTile(const Args& x, size_t i0, size_t r0, __m512 (&acc)[kRows][kCols],
                               const uint8_t* (&wrow)[kCols], const uint8_t* (&arow)[kRows]) {
#pragma GCC unroll 4
  for (size_t i = 0; i < kRows; ++i) {
#pragma GCC unroll 2
    for (size_t j = 0; j < kCols; ++j) acc[i][j] = _mm512_setzero_ps();
    arow[i] = x.qa + (i0 + i) * x.lay->row_bytes;
  }
#pragma GCC unroll 2
  for (size_t j = 0; j < kCols; ++j) wrow[j] = x.w->codes + (r0 + j) * x.w->row_bytes;
}

template <size_t kRows, size_t kCols>
MHA_VNNI_ATTR void TileI8(const Args& x, size_t i0, size_t r0) {
  const Int8ActLayout& lay = *x.lay;
  const QuantMatrix& w = *x.w;
  __m512 acc[kRows][kCols];
  const uint8_t* wrow[kCols];
  const uint8_t* arow[kRows];
  StartTile(x, i0, r0, acc, wrow, arow);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const size_t full = w.cols / 64;
  for (size_t u = 0; u < lay.units; ++u) {
    __m512i wv[kCols];
    if (u < full) {
#pragma GCC unroll 2
      for (size_t j = 0; j < kCols; ++j) {
        wv[j] = _mm512_xor_si512(_mm512_loadu_si512(wrow[j] + 64 * u), sign);
      }
    } else {
      const __mmask64 m = (1ull << (w.cols - 64 * u)) - 1ull;  // 1..63 bytes
#pragma GCC unroll 2
      for (size_t j = 0; j < kCols; ++j) {
        wv[j] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, wrow[j] + 64 * u), sign);
      }
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < kRows; ++i) {
      const __m512i av = _mm512_load_si512(arow[i] + 64 * u);
      const __m512i corr = _mm512_load_si512(arow[i] + lay.sums_offset + 64 * u);
      const __m512 sc =
          _mm512_load_ps(reinterpret_cast<const float*>(arow[i] + lay.scales_offset) + 16 * u);
#pragma GCC unroll 2
      for (size_t j = 0; j < kCols; ++j) {
        const __m512i s = _mm512_dpbusd_epi32(corr, wv[j], av);
        acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(kAll, s), sc));
      }
    }
  }
#pragma GCC unroll 4
  for (size_t i = 0; i < kRows; ++i) {
#pragma GCC unroll 2
    for (size_t j = 0; j < kCols; ++j) {
      const float ws = w.scales[(r0 + j) * w.scales_per_row];
      x.c[static_cast<ptrdiff_t>(i0 + i) * x.c_rs + static_cast<ptrdiff_t>(r0 + j) * x.c_cs] =
          LaneTree(acc[i][j]) * ws;
    }
  }
}

template <size_t kRows, size_t kCols>
MHA_VNNI_ATTR void TileI4(const Args& x, size_t i0, size_t r0) {
  const Int8ActLayout& lay = *x.lay;
  const QuantMatrix& w = *x.w;
  const bool block32 = w.block == kI4Block;
  __m512 acc[kRows][kCols];
  const uint8_t* wrow[kCols];
  const uint8_t* arow[kRows];
  StartTile(x, i0, r0, acc, wrow, arow);
  const float* wsrow[kCols];
#pragma GCC unroll 2
  for (size_t j = 0; j < kCols; ++j) wsrow[j] = w.scales + (r0 + j) * w.scales_per_row;
  // Within each 128-bit lane, byte 4j + i <- byte 4i + j: word 4l + i's byte j (block j).
  const __m512i gather = _mm512_maskz_broadcast_i32x4(kAll,
      _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const size_t full_scales = w.scales_per_row / 4;  // units whose four 32-block scales exist
  for (size_t u = 0; u < lay.units; ++u) {
    __m512i lo[kCols], hi[kCols];
    __m128 ws4[kCols];
#pragma GCC unroll 2
    for (size_t j = 0; j < kCols; ++j) {
      const __m512i g = _mm512_shuffle_epi8(_mm512_loadu_si512(wrow[j] + kI4GroupBytes * u), gather);
      lo[j] = _mm512_and_si512(g, low4);
      hi[j] = _mm512_and_si512(_mm512_srli_epi16(g, 4), low4);
      if (!block32) {
        ws4[j] = _mm_set1_ps(wsrow[j][u]);
      } else if (u < full_scales) {
        ws4[j] = _mm_loadu_ps(wsrow[j] + 4 * u);
      } else {
        const __mmask8 m = static_cast<__mmask8>((1u << (w.scales_per_row - 4 * u)) - 1u);
        ws4[j] = _mm_maskz_loadu_ps(m, wsrow[j] + 4 * u);
      }
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < kRows; ++i) {
      const __m512i alo = _mm512_load_si512(arow[i] + kI4Group * u);
      const __m512i ahi = _mm512_load_si512(arow[i] + kI4Group * u + 64);
      const __m512i corr = _mm512_load_si512(arow[i] + lay.sums_offset + 64 * u);
      const __m128 as4 =
          _mm_load_ps(reinterpret_cast<const float*>(arow[i] + lay.scales_offset) + 4 * u);
#pragma GCC unroll 2
      for (size_t j = 0; j < kCols; ++j) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo[j], alo), hi[j], ahi);
        const __m512 f = _mm512_maskz_broadcast_f32x4(kAll, _mm_mul_ps(as4, ws4[j]));
        acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(kAll, s), f));
      }
    }
  }
#pragma GCC unroll 4
  for (size_t i = 0; i < kRows; ++i) {
#pragma GCC unroll 2
    for (size_t j = 0; j < kCols; ++j) {
      x.c[static_cast<ptrdiff_t>(i0 + i) * x.c_rs + static_cast<ptrdiff_t>(r0 + j) * x.c_cs] =
          LaneTree(acc[i][j]);
    }
  }
}

template <size_t kRows, size_t kCols>
MHA_VNNI_ATTR void Tile(const Args& x, size_t i0, size_t r0) {
  if (x.w->type == DType::kI8) {
    TileI8<kRows, kCols>(x, i0, r0);
  } else {
    TileI4<kRows, kCols>(x, i0, r0);
  }
}

template <size_t kCols>
MHA_VNNI_ATTR void Rows(const Args& x, size_t i0, size_t rows, size_t r0) {
  switch (rows) {
    case 1:
      return Tile<1, kCols>(x, i0, r0);
    case 2:
      return Tile<2, kCols>(x, i0, r0);
    case 3:
      return Tile<3, kCols>(x, i0, r0);
    default:
      return Tile<4, kCols>(x, i0, r0);
  }
}

}  // namespace
}  // namespace gemv_int8_avx512vnni

// Weight rows in pairs (the last alone), each pair against the activation rows in tiles of 4:
// the pair's codes come from memory for the first tile and from L1 for the others.
MHA_VNNI_ATTR void GemvInt8Avx512Vnni(const uint8_t* qa, size_t rows, const QuantMatrix& w,
                                      const MatrixView& c) {
  namespace v = gemv_int8_avx512vnni;
  const Int8ActLayout lay = Int8ActLayoutOf(w.type, w.block, w.cols);
  const v::Args x{qa, &lay, &w, c.data, c.row_stride, c.col_stride};
  for (size_t r0 = 0; r0 < w.rows; r0 += v::kMaxCols) {
    const size_t cols = std::min(v::kMaxCols, w.rows - r0);
    for (size_t i0 = 0; i0 < rows; i0 += v::kMaxRows) {
      const size_t n = std::min(v::kMaxRows, rows - i0);
      if (cols == 2) {
        v::Rows<2>(x, i0, n, r0);
      } else {
        v::Rows<1>(x, i0, n, r0);
      }
    }
  }
}

}  // namespace kernels
}  // namespace mha
