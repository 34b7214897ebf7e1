// Bf16Kernel::kAvx512Bf16: the bf16 block kernel on AVX512_BF16 (VDPBF16PS), and the AVX-512
// epilogue it shares with the AMX kernel. The contract is Bf16Block's (gemm_bf16_native.h).
// x86-64 only; every function carries the instruction set's target attribute (the rest of the
// library is compiled for baseline x86-64) and runs only after Bf16KernelAvailable.
//
// VDPBF16PS takes one u32 lane per column holding a's or b's (even k, odd k) pair: a's pair is
// broadcast to all lanes, b's pair row of a panel (32 columns x 2 bf16, 128 bytes) is two zmm.
// Per lane: acc += a_odd * b_odd, then acc += a_even * b_even, each add rounded (nearest even)
// and subnormal inputs and results flushed to zero.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/gemm_bf16.h"
#include "kernels/gemm_bf16_native.h"

#define MHA_AVX512BF16_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define MHA_AVX512BF16_INLINE MHA_AVX512BF16_ATTR inline __attribute__((always_inline))

namespace mha {
namespace kernels {
// Above-baseline code lives in this namespace and the block entry points only
// (tools/cross/check-x86-baseline allows exactly those).
namespace gemm_bf16_avx512 {
namespace {

// Register tile: kRows rows x kPanels panels (2 kPanels zmm accumulators per row): 6 x 2
// panels holds 24 accumulators, 4 b vectors and a broadcast. VDPBF16PS's throughput bounds the
// kernel, not the tile: on the AMX Xeon VM of kernels/README.md (bench/kernels_bench
// BM_GemmBf16/1) 6 x 2, 4 x 2, 12 x 1 and 14 x 1 all measured 101-115 GFLOP/s, at the
// instruction's rate there (a quarter of VFMADD231PS's).
constexpr size_t kRows = 6;
constexpr size_t kPanels = 2;

// The epilogue of one accumulator (16 columns): `valid` (1..16) columns of c from `c` (columns
// c_cs apart); bias: the accumulator's first column's bias, or null. Each operation rounded
// separately, as the emulated kernel's StoreAcc.
MHA_AVX512BF16_INLINE void StoreAcc(__m512 acc, const Bf16Block& blk, float* c, size_t valid,
                                    const float* bias) {
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
  __m512 out = _mm512_mul_ps(acc, _mm512_set1_ps(blk.alpha));
  const bool read_c = !blk.first || blk.beta != 0.0f;
  if (blk.c_cs == 1) {
    if (read_c) {
      const __m512 old = _mm512_maskz_loadu_ps(mask, c);
      out = blk.first ? _mm512_add_ps(out, _mm512_mul_ps(old, _mm512_set1_ps(blk.beta)))
                      : _mm512_add_ps(old, out);
    }
    if (bias != nullptr) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mask, bias));
    _mm512_mask_storeu_ps(c, mask, out);
    return;
  }
  alignas(64) float buf[16] = {};
  if (read_c) {
    for (size_t j = 0; j < valid; ++j) buf[j] = c[static_cast<ptrdiff_t>(j) * blk.c_cs];
    const __m512 old = _mm512_load_ps(buf);
    out = blk.first ? _mm512_add_ps(out, _mm512_mul_ps(old, _mm512_set1_ps(blk.beta)))
                    : _mm512_add_ps(old, out);
  }
  if (bias != nullptr) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(mask, bias));
  _mm512_store_ps(buf, out);
  for (size_t j = 0; j < valid; ++j) c[static_cast<ptrdiff_t>(j) * blk.c_cs] = buf[j];
}

// Stores the accumulators of one row (row `r` of c from column col) that lie within blk.n.
template <size_t kV>
MHA_AVX512BF16_INLINE void StoreRow(const __m512 (&acc)[kV], const Bf16Block& blk, size_t r,
                                    size_t col) {
  float* c = blk.c + static_cast<ptrdiff_t>(r) * blk.c_rs;
#pragma GCC unroll 4
  for (size_t v = 0; v < kV; ++v) {
    const size_t j = col + 16 * v;
    if (j >= blk.n) break;
    StoreAcc(acc[v], blk, c + static_cast<ptrdiff_t>(j) * blk.c_cs, std::min<size_t>(16, blk.n - j),
             blk.bias != nullptr ? blk.bias + j : nullptr);
  }
}

// The kR x kP-panel tile at rows [row, row + kR), panels from the one holding column col.
template <size_t kR, size_t kP>
MHA_AVX512BF16_ATTR __attribute__((noinline)) void Tile(const Bf16Block& blk, size_t row,
                                                        size_t col) {
  constexpr size_t kV = 2 * kP;
  __m512 acc[kR][kV];
#pragma GCC unroll 16
  for (size_t r = 0; r < kR; ++r) {
#pragma GCC unroll 4
    for (size_t v = 0; v < kV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  const uint16_t* a = blk.a + row * blk.lda;
  const uint16_t* b = blk.b + (col / kBf16PanelCols) * blk.panel_stride;
  const size_t pairs = blk.depth / 2;
  for (size_t p = 0; p < pairs; ++p) {
    __m512bh bv[kV];
#pragma GCC unroll 4
    for (size_t v = 0; v < kV; ++v) {
      bv[v] = (__m512bh)_mm512_loadu_si512(b + (v / 2) * blk.panel_stride + p * 2 * kBf16PanelCols +
                                           (v % 2) * 32);
    }
#pragma GCC unroll 16
    for (size_t r = 0; r < kR; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * blk.lda + 2 * p, sizeof(pair));
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (size_t v = 0; v < kV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 16
  for (size_t r = 0; r < kR; ++r) StoreRow<kV>(acc[r], blk, row + r, col);
}

// Tile<rows, kP> for a run-time rows in 1..kRows.
template <size_t kP, size_t kR = 1>
MHA_AVX512BF16_ATTR void TileRows(size_t rows, const Bf16Block& blk, size_t row, size_t col) {
  if constexpr (kR == kRows) {
    Tile<kR, kP>(blk, row, col);
  } else {
    if (rows == kR) return Tile<kR, kP>(blk, row, col);
    TileRows<kP, kR + 1>(rows, blk, row, col);
  }
}

// Rows of the next tile when `left` rows remain (as gemm_direct-inl.h's TileRowsAt).
size_t TileRowsAt(size_t left) {
  if (left >= 2 * kRows || left <= kRows) return std::min(left, kRows);
  return (left + 1) / 2;
}

// Rows of whole 32-column tiles at unit column stride (AMX's usual case): StoreAcc's
// arithmetic with the case's branches taken once per tile, not per vector. kMode: 0 c =
// alpha * acc, 1 c = alpha * acc + beta * c, 2 c = c + alpha * acc; then + bias if kBias.
template <int kMode, bool kBias>
MHA_AVX512BF16_ATTR void StoreWholeTile(const float* acc, size_t acc_stride, size_t rows, float* c,
                                        ptrdiff_t c_rs, const float* bias, const Bf16Block& blk) {
  const __m512 alpha = _mm512_set1_ps(blk.alpha), beta = _mm512_set1_ps(blk.beta);
  __m512 bias0 = _mm512_setzero_ps(), bias1 = bias0;
  if constexpr (kBias) {
    bias0 = _mm512_loadu_ps(bias);
    bias1 = _mm512_loadu_ps(bias + 16);
  }
  for (size_t r = 0; r < rows; ++r, acc += acc_stride, c += c_rs) {
    __m512 o0 = _mm512_mul_ps(_mm512_loadu_ps(acc), alpha);
    __m512 o1 = _mm512_mul_ps(_mm512_loadu_ps(acc + 16), alpha);
    if constexpr (kMode == 1) {
      o0 = _mm512_add_ps(o0, _mm512_mul_ps(_mm512_loadu_ps(c), beta));
      o1 = _mm512_add_ps(o1, _mm512_mul_ps(_mm512_loadu_ps(c + 16), beta));
    } else if constexpr (kMode == 2) {
      o0 = _mm512_add_ps(_mm512_loadu_ps(c), o0);
      o1 = _mm512_add_ps(_mm512_loadu_ps(c + 16), o1);
    }
    if constexpr (kBias) {
      o0 = _mm512_add_ps(o0, bias0);
      o1 = _mm512_add_ps(o1, bias1);
    }
    _mm512_storeu_ps(c, o0);
    _mm512_storeu_ps(c + 16, o1);
  }
}

template <int kMode>
MHA_AVX512BF16_ATTR void StoreWholeTileMode(const float* acc, size_t acc_stride, size_t rows,
                                            float* c, ptrdiff_t c_rs, const float* bias,
                                            const Bf16Block& blk) {
  if (bias != nullptr)
    return StoreWholeTile<kMode, true>(acc, acc_stride, rows, c, c_rs, bias, blk);
  StoreWholeTile<kMode, false>(acc, acc_stride, rows, c, c_rs, nullptr, blk);
}

}  // namespace
}  // namespace gemm_bf16_avx512

MHA_AVX512BF16_ATTR void Bf16StoreTileAvx512(const float* acc, size_t acc_stride, size_t rows,
                                             size_t cols, size_t row0, size_t col0,
                                             const Bf16Block& blk) {
  using namespace gemm_bf16_avx512;  // NOLINT(google-build-using-namespace): this file's helpers
  if (cols == 32 && blk.c_cs == 1) {
    float* c = blk.c + static_cast<ptrdiff_t>(row0) * blk.c_rs + static_cast<ptrdiff_t>(col0);
    const float* bias = blk.bias != nullptr ? blk.bias + col0 : nullptr;
    if (!blk.first) return StoreWholeTileMode<2>(acc, acc_stride, rows, c, blk.c_rs, bias, blk);
    if (blk.beta != 0.0f) {
      return StoreWholeTileMode<1>(acc, acc_stride, rows, c, blk.c_rs, bias, blk);
    }
    return StoreWholeTileMode<0>(acc, acc_stride, rows, c, blk.c_rs, bias, blk);
  }
  for (size_t r = 0; r < rows; ++r) {
    float* c = blk.c + static_cast<ptrdiff_t>(row0 + r) * blk.c_rs;
    for (size_t j = 0; j < cols; j += 16) {
      const size_t col = col0 + j;
      StoreAcc(_mm512_loadu_ps(acc + r * acc_stride + j), blk,
               c + static_cast<ptrdiff_t>(col) * blk.c_cs, std::min<size_t>(16, cols - j),
               blk.bias != nullptr ? blk.bias + col : nullptr);
    }
  }
}

MHA_AVX512BF16_ATTR void Bf16BlockAvx512(const Bf16Block& blk) {
  using namespace gemm_bf16_avx512;  // NOLINT(google-build-using-namespace): this file's helpers
  constexpr size_t kGroup = kPanels * kBf16PanelCols;
  for (size_t col = 0; col < blk.n; col += kGroup) {
    const bool two = kPanels == 2 && blk.n - col > kBf16PanelCols;
    for (size_t i = 0; i < blk.m;) {
      const size_t rows = TileRowsAt(blk.m - i);
      if (two) {
        TileRows<kPanels>(rows, blk, i, col);
      } else {
        TileRows<1>(rows, blk, i, col);
      }
      i += rows;
    }
  }
}

}  // namespace kernels
}  // namespace mha
