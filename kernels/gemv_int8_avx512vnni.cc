// Int8Kernel::kAvx512Vnni: the int8-activation products (gemv_int8.h) on AVX512_VNNI
// (VPDPBUSD). x86-64 only; every function carries the instruction set's target attribute (the
// rest of the library is compiled for baseline x86-64) and runs only after Int8KernelAvailable.
//
// VPDPBUSD multiplies 4 unsigned bytes of its first operand by 4 signed bytes of its second and
// adds the 4 products to a 32-bit lane: two instructions (the unit's low and high halves) are
// the 16 lane sums of one unit (gemv_int8.h). The unsigned operand is the weight: kI8 codes +
// 128 (an xor of the sign bit), kI4 nibbles as stored (code + 8); the accumulator starts at the
// activation row's precomputed -128 or -8 times its lane's code sum, so each lane ends at the
// exact int sum of code(a) * code(w). The weights reach the lane order by one shuffle per
// vector: kI8's 32-blocks are 8 consecutive dwords (VPERMT2D picks dword l of each block into
// lane 4l + j); kI4's words hold the four 32-blocks' nibbles in one dword (quant.h), gathered
// per block within each 128-bit lane by VPSHUFB. The f32 epilogue is the definition's, lane by
// lane, then the lane tree by halving. Activation rows are blocked for the caches (AllTiles).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/gemv_int8.h"
#include "kernels/gemv_int8_native.h"

#define MHA_VNNI_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define MHA_VNNI_INLINE MHA_VNNI_ATTR inline __attribute__((always_inline))

namespace mha {
namespace kernels {
// Above-baseline code lives in this namespace and the entry point only
// (tools/cross/check-x86-baseline allows exactly those).
namespace gemv_int8_avx512vnni {
namespace {

// Register tiles: up to kMaxRows rows of activations x kI8Cols weight rows (16 accumulators, 4
// weight vectors) or kI4Cols (8 accumulators, 2 x 2 decoded weight vectors).
constexpr size_t kMaxRows = 4;
constexpr size_t kI8Cols = 4;
constexpr size_t kI4Cols = 2;
// Decode: products of at most kInt8FewRows rows read their weights one row at a time
// (Int8FewRows::kOneWeightRow) or in the tiles above (kTiled); which streams faster from memory
// differs by CPU. Zen 4 VM, one weight row faster: kI4, one thread, 50 MB of weights, [1, 4096] x
// [24576, 4096] in 256-row panels: two rows 5.9-6.1 ms, one 3.8-3.9, while prefill's 128-row
// panels gain from the pair (47 ms against 59 for [128, 4096] x [6144, 4096]). kI8, a
// Llama-3-8B-shaped decode step (mha-bench --decode-shape 4096,32,8, 512 positions, f32 cache,
// three alternating rounds): batch 1, 2 threads, four rows 1.41-1.97 ms, one 0.97-1.20; one thread
// 2.64-3.05 against 1.66-2.35; batch 2, 2 threads 1.81-2.08 against 1.40-1.96; 70B-shaped
// (8192,64,8), batch 1, 2 threads 4.90-5.61 against 4.69-5.15, two rows 5.17-5.72. Intel Xeon VM
// with AMX, tiles faster where the weights come from memory: the 70B-shaped step (151 MB of kI8,
// 94 MB of kI4, same command and rounds) kI8 7.47 -> 4.77 ms, kI4 4.04 -> 3.00; the 8B-shaped one,
// whose weights this VM's L3 holds, kI8 0.93 -> 0.89, kI4 0.60 -> 0.66. A core of Intel's mesh
// streams one sequential row slower than several at once; the ISA that tells the two measured
// families apart is AMX (Int8FewRowsOnThisCpu).

// All 16 lanes: the zero-masking forms of the intrinsics whose plain forms start from
// _mm512_undefined_*, which GCC 12 reports as maybe-uninitialized.
constexpr __mmask16 kAll = 0xFFFF;

// The definition's lane tree: lanes L + 8, then L + 4, L + 2, L + 1.
MHA_VNNI_INLINE float LaneTree(__m512 acc) {
  const __m256 t8 = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, acc, 0),
                                  _mm512_maskz_extractf32x8_ps(0xFF, acc, 1));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

using Args = Int8Call;

// A tile's accumulators zeroed, its weight rows' and activation rows' first bytes.
template <size_t kRows, size_t kCols>
MHA_VNNI_INLINE void StartTile(const Args& x, size_t i0, size_t r0, __m512 (&acc)[kRows][kCols],
                               const uint8_t* (&wrow)[kCols], const uint8_t* (&arow)[kRows]) {
#pragma GCC unroll 4
  for (size_t i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
    for (size_t j = 0; j < kCols; ++j) acc[i][j] = _mm512_setzero_ps();
    arow[i] = x.Row(i0 + i);
  }
#pragma GCC unroll 4
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
  // A unit's 128 codes are dwords 0..31 of two vectors; lane 4l + j takes block j's dword l
  // (inputs 32j + 4l ..) for the low half, dword l + 4 (inputs 32j + 16 + 4l ..) for the high.
  const __m512i lo_dwords =
      _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
  const __m512i hi_dwords = _mm512_add_epi32(lo_dwords, _mm512_set1_epi32(4));
  const size_t full = w.cols / kI4Group;
  for (size_t u = 0; u < lay.units; ++u) {
    __m512i lo[kCols], hi[kCols];
    __mmask64 m0 = ~0ull, m1 = ~0ull;
    if (u >= full) {  // 1..127 bytes
      const size_t valid = w.cols - kI4Group * u;
      m0 = valid >= 64 ? ~0ull : (1ull << valid) - 1ull;
      m1 = valid <= 64 ? 0ull : (1ull << (valid - 64)) - 1ull;
    }
#pragma GCC unroll 4
    for (size_t j = 0; j < kCols; ++j) {
      const __m512i z0 = _mm512_maskz_loadu_epi8(m0, wrow[j] + kI4Group * u);
      const __m512i z1 = _mm512_maskz_loadu_epi8(m1, wrow[j] + kI4Group * u + 64);
      lo[j] = _mm512_xor_si512(_mm512_permutex2var_epi32(z0, lo_dwords, z1), sign);
      hi[j] = _mm512_xor_si512(_mm512_permutex2var_epi32(z0, hi_dwords, z1), sign);
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < kRows; ++i) {
      const __m512i alo = _mm512_load_si512(arow[i] + kI4Group * u);
      const __m512i ahi = _mm512_load_si512(arow[i] + kI4Group * u + 64);
      const __m512i corr = _mm512_load_si512(arow[i] + lay.sums_offset + 64 * u);
      const __m512 f = _mm512_maskz_broadcast_f32x4(
          kAll, _mm_load_ps(reinterpret_cast<const float*>(arow[i] + lay.scales_offset) + 4 * u));
#pragma GCC unroll 4
      for (size_t j = 0; j < kCols; ++j) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo[j], alo), hi[j], ahi);
        acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(kAll, s), f));
      }
    }
  }
#pragma GCC unroll 4
  for (size_t i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
    for (size_t j = 0; j < kCols; ++j) {
      const float ws = w.scales[(r0 + j) * w.scales_per_row];
      x.Out(i0 + i, r0 + j) = LaneTree(acc[i][j]) * ws;
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
#pragma GCC unroll 4
  for (size_t j = 0; j < kCols; ++j) wsrow[j] = w.scales + (r0 + j) * w.scales_per_row;
  // Within each 128-bit lane, byte 4j + i <- byte 4i + j: word 4l + i's byte j (block j).
  const __m512i gather = _mm512_maskz_broadcast_i32x4(
      kAll, _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const size_t full_scales = w.scales_per_row / 4;  // units whose four 32-block scales exist
  for (size_t u = 0; u < lay.units; ++u) {
    __m512i lo[kCols], hi[kCols];
    __m128 ws4[kCols];
#pragma GCC unroll 4
    for (size_t j = 0; j < kCols; ++j) {
      const __m512i g =
          _mm512_shuffle_epi8(_mm512_loadu_si512(wrow[j] + kI4GroupBytes * u), gather);
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
#pragma GCC unroll 4
      for (size_t j = 0; j < kCols; ++j) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(corr, lo[j], alo), hi[j], ahi);
        const __m512 f = _mm512_maskz_broadcast_f32x4(kAll, _mm_mul_ps(as4, ws4[j]));
        acc[i][j] = _mm512_add_ps(acc[i][j], _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(kAll, s), f));
      }
    }
  }
#pragma GCC unroll 4
  for (size_t i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
    for (size_t j = 0; j < kCols; ++j) {
      x.Out(i0 + i, r0 + j) = LaneTree(acc[i][j]);
    }
  }
}

// One row tile (1..kMaxRows rows) against weight rows [r0, r0 + kCols).
template <size_t kCols, template <size_t, size_t> class Kernel>
MHA_VNNI_ATTR void RowTile(const Args& x, size_t i0, size_t rows, size_t r0) {
  switch (rows) {
    case 1:
      return Kernel<1, kCols>::Run(x, i0, r0);
    case 2:
      return Kernel<2, kCols>::Run(x, i0, r0);
    case 3:
      return Kernel<3, kCols>::Run(x, i0, r0);
    default:
      return Kernel<4, kCols>::Run(x, i0, r0);
  }
}

template <size_t kRows, size_t kCols>
struct I8Kernel {
  MHA_VNNI_INLINE static void Run(const Args& x, size_t i0, size_t r0) {
    TileI8<kRows, kCols>(x, i0, r0);
  }
};
template <size_t kRows, size_t kCols>
struct I4Kernel {
  MHA_VNNI_INLINE static void Run(const Args& x, size_t i0, size_t r0) {
    TileI4<kRows, kCols>(x, i0, r0);
  }
};

// Rows [b0, b0 + rows) in tiles of kMaxRows against weight rows [r0, r0 + kCols).
template <size_t kCols, template <size_t, size_t> class Kernel>
MHA_VNNI_ATTR void RowBlock(const Args& x, size_t b0, size_t rows, size_t r0) {
  for (size_t i0 = b0; i0 < b0 + rows; i0 += kMaxRows) {
    RowTile<kCols, Kernel>(x, i0, std::min(kMaxRows, b0 + rows - i0), r0);
  }
}

// Blocks of kInt8BlockRows activation rows (their quantized rows stay in L2); within a block, the
// weight rows kCols at a time (the last 1..kCols - 1 one by one), each against the block's row
// tiles (its codes stay in L1 across them): the weights are read from memory once per block.
template <size_t kCols, template <size_t, size_t> class Kernel>
MHA_VNNI_ATTR void AllTiles(const Args& x, size_t rows) {
  for (size_t b0 = 0; b0 < rows; b0 += kInt8BlockRows) {
    const size_t n = std::min(kInt8BlockRows, rows - b0);
    size_t r0 = 0;
    for (; r0 + kCols <= x.w->rows; r0 += kCols) RowBlock<kCols, Kernel>(x, b0, n, r0);
    for (; r0 < x.w->rows; ++r0) RowBlock<1, Kernel>(x, b0, n, r0);
  }
}

}  // namespace
}  // namespace gemv_int8_avx512vnni

// AllTiles' blocking; the weight rows one at a time for decode's few rows where `few_rows`
// says so, else 4 (kI8) or 2 (kI4: two decoded vectors per weight row) at a time.
MHA_VNNI_ATTR void GemvInt8Avx512Vnni(const uint8_t* qa, size_t rows, const QuantMatrix& w,
                                      const MatrixView& c, Int8FewRows few_rows) {
  namespace v = gemv_int8_avx512vnni;
  const Int8ActLayout lay = Int8ActLayoutOf(w.type, w.block, w.cols);
  const Int8Call x{qa, &lay, &w, c.data, c.row_stride, c.col_stride};
  const bool one_row = rows <= kInt8FewRows && few_rows == Int8FewRows::kOneWeightRow;
  if (w.type == DType::kI8) {
    if (one_row) {
      v::AllTiles<1, v::I8Kernel>(x, rows);
    } else {
      v::AllTiles<v::kI8Cols, v::I8Kernel>(x, rows);
    }
  } else if (one_row) {
    v::AllTiles<1, v::I4Kernel>(x, rows);
  } else {
    v::AllTiles<v::kI4Cols, v::I4Kernel>(x, rows);
  }
}

}  // namespace kernels
}  // namespace mha
