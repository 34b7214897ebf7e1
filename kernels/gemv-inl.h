// Per-target GEMV kernel; the contract is in kernels/gemv.h. Included once per Highway target by
// kernels/gemv.cc (foreach_target).
//
// Loop order: for each group of a few weight rows (columns of b), for each tile of a few rows of
// a: a register tile of rows x columns accumulators over k. The group's weight rows come from
// memory for the first tile of rows and from L1 for the others (4 rows of k <= 2048 floats = 32
// KiB), so w is read from memory once per call. Every accumulator holds exactly one output element,
// with the same sequence of operations whatever the tile shape: that is what makes results
// independent of how rows and columns are grouped.

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_GEMV_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_GEMV_INL_H_
#undef MHA_KERNELS_GEMV_INL_H_
#else
#define MHA_KERNELS_GEMV_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/elementwise-inl.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {
namespace gemv_detail {

namespace hn = hwy::HWY_NAMESPACE;

// Register tiles (rows of a x weight rows). A tile needs rows x columns accumulators, the
// columns' weight vectors and one row vector. Four weight rows per group give four independent
// accumulator chains per row of a, which hides the multiply-add latency even for one row.
// x86 below AVX-512 has 16 vector registers: 4 rows x 4 columns (21 registers) would spill, so
// those targets take 2 x 4 (13) when a has fewer than kWideRows rows, and 6 x 2 (15: twelve
// accumulator chains instead of eight) otherwise. Eight chains of 4-cycle multiply-adds at two
// per cycle leave no slack, so any stall idles an FMA unit (bench/README.md has the figures).
// Other targets have 32 registers and take 4 x 4.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kTileRows = 2;
constexpr size_t kWideRows = 6;  // 0: no wide tiles
constexpr size_t kWideCols = 2;
#else
constexpr size_t kTileRows = 4;
constexpr size_t kWideRows = 0;
constexpr size_t kWideCols = 4;  // unused
#endif
constexpr size_t kTileCols = 4;

// Makes the compiler materialize v in a register here. The weight vectors of a tile are used
// once per row of a; left alone, GCC folds each use into the multiply-add as a memory operand,
// i.e. loads every weight vector kRows times (AVX2, 2 x 4 tile: 10 loads per 8 multiply-adds,
// which bounds the loop by the load ports instead of the FMA units). An empty asm with the
// vector as an in/out register operand forbids that (x86 GCC/Clang; elsewhere a no-op: Arm
// multiply-adds take no memory operands).
template <class V>
HWY_INLINE void KeepInRegister(V& v) {
#if HWY_ARCH_X86 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG) && HWY_TARGET != HWY_SCALAR && \
    HWY_TARGET != HWY_EMU128
  asm("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

// One step of row r of a tile: s_c += x * v_c for the first kCols columns. x is pinned to a
// register like the weights (see KeepInRegister): GCC otherwise re-loads it from memory as an
// operand of each multiply-add.
template <size_t kCols, class V>
HWY_INLINE void RowStep(V x, V v0, V v1, V v2, V v3, V& s0, V& s1, V& s2, V& s3) {
  if constexpr (kCols > 1) KeepInRegister(x);
  s0 = hn::MulAdd(x, v0, s0);
  if constexpr (kCols > 1) s1 = hn::MulAdd(x, v1, s1);
  if constexpr (kCols > 2) {
    s2 = hn::MulAdd(x, v2, s2);
    s3 = hn::MulAdd(x, v3, s3);
  }
}

// Finishes one element: the sum of the lanes of `acc` (the products over [0, kv)), plus the
// products over [kv, k) in order, then alpha/beta into *c (beta == 0: *c not read).
template <class Row, class DF>
HWY_INLINE void Finish(DF df, hn::Vec<DF> acc, const float* HWY_RESTRICT a,
                       const typename Row::T* HWY_RESTRICT w, size_t kv, size_t k, float alpha,
                       float beta, float* HWY_RESTRICT c) {
  float dot = hn::GetLane(hn::SumOfLanes(df, acc));
  for (size_t p = kv; p < k; ++p) dot += a[p] * Row::Scalar(w[p]);
  *c = beta == 0.0f ? alpha * dot : alpha * dot + beta * *c;
}

// Finishes row r of a tile: its first kCols elements, c_row[j * c_cs].
template <class Row, size_t kCols, class DF, class V = hn::Vec<DF>>
HWY_INLINE void FinishRow(DF df, V s0, V s1, V s2, V s3, const float* HWY_RESTRICT a_row,
                          const typename Row::T* const* w, size_t kv, size_t k, float alpha,
                          float beta, float* HWY_RESTRICT c_row, ptrdiff_t c_cs) {
  Finish<Row>(df, s0, a_row, w[0], kv, k, alpha, beta, c_row);
  if constexpr (kCols > 1) Finish<Row>(df, s1, a_row, w[1], kv, k, alpha, beta, c_row + c_cs);
  if constexpr (kCols > 2) {
    Finish<Row>(df, s2, a_row, w[2], kv, k, alpha, beta, c_row + 2 * c_cs);
    Finish<Row>(df, s3, a_row, w[3], kv, k, alpha, beta, c_row + 3 * c_cs);
  }
}

// The kRows x kCols tile of c at `c`: rows a + r * a_stride (r < kRows), weight rows
// w + j * w_stride (j < kCols), k floats each. kRows in 1..6, kCols 1, 2 or 4. Accumulators of
// rows/columns outside the tile are never used (the compiler drops them).
// Not inlined on purpose: inlined into Rows together with every other tile shape, GCC 12 kept
// one of the eight AVX2 accumulators on the stack across the loop (a store and reload per
// iteration, ~16 cycles per step instead of ~5); as a function of its own each tile gets all the
// registers. The call costs nothing next to a tile's k / Lanes steps.
template <class Row, size_t kRows, size_t kCols, class DF>
HWY_NOINLINE void Tile(DF df, const float* HWY_RESTRICT a, ptrdiff_t a_stride,
                       const typename Row::T* HWY_RESTRICT w, ptrdiff_t w_stride, size_t k,
                       float alpha, float beta, float* HWY_RESTRICT c, ptrdiff_t c_rs,
                       ptrdiff_t c_cs) {
  static_assert(kRows >= 1 && kRows <= 6, "tile rows: 1..6");
  static_assert(kCols == 1 || kCols == 2 || kCols == 4, "tile columns: 1, 2 or 4");
  const size_t N = hn::Lanes(df);
  const size_t kv = k / N * N;
  // Rows and weight rows beyond the tile alias the first one and are never read.
  const float* a0 = a;
  const float* a1 = kRows > 1 ? a0 + a_stride : a0;
  const float* a2 = kRows > 2 ? a1 + a_stride : a0;
  const float* a3 = kRows > 3 ? a2 + a_stride : a0;
  const float* a4 = kRows > 4 ? a3 + a_stride : a0;
  const float* a5 = kRows > 5 ? a4 + a_stride : a0;
  using T = typename Row::T;
  const T* const wr[4] = {w, kCols > 1 ? w + w_stride : w, kCols > 2 ? w + 2 * w_stride : w,
                          kCols > 2 ? w + 3 * w_stride : w};
  const T* HWY_RESTRICT w0 = wr[0];
  const T* HWY_RESTRICT w1 = wr[1];
  const T* HWY_RESTRICT w2 = wr[2];
  const T* HWY_RESTRICT w3 = wr[3];
  auto s00 = hn::Zero(df), s01 = s00, s02 = s00, s03 = s00;
  auto s10 = s00, s11 = s00, s12 = s00, s13 = s00;
  auto s20 = s00, s21 = s00, s22 = s00, s23 = s00;
  auto s30 = s00, s31 = s00, s32 = s00, s33 = s00;
  auto s40 = s00, s41 = s00, s42 = s00, s43 = s00;
  auto s50 = s00, s51 = s00, s52 = s00, s53 = s00;
  for (size_t d = 0; d < kv; d += N) {
    auto v0 = Row::Load(df, w0 + d);
    auto v1 = v0, v2 = v0, v3 = v0;
    if constexpr (kCols > 1) v1 = Row::Load(df, w1 + d);
    if constexpr (kCols > 2) {
      v2 = Row::Load(df, w2 + d);
      v3 = Row::Load(df, w3 + d);
    }
    if constexpr (kRows > 1) {
      KeepInRegister(v0);
      if constexpr (kCols > 1) KeepInRegister(v1);
      if constexpr (kCols > 2) {
        KeepInRegister(v2);
        KeepInRegister(v3);
      }
    }
    RowStep<kCols>(hn::LoadU(df, a0 + d), v0, v1, v2, v3, s00, s01, s02, s03);
    if constexpr (kRows > 1) {
      RowStep<kCols>(hn::LoadU(df, a1 + d), v0, v1, v2, v3, s10, s11, s12, s13);
    }
    if constexpr (kRows > 2) {
      RowStep<kCols>(hn::LoadU(df, a2 + d), v0, v1, v2, v3, s20, s21, s22, s23);
    }
    if constexpr (kRows > 3) {
      RowStep<kCols>(hn::LoadU(df, a3 + d), v0, v1, v2, v3, s30, s31, s32, s33);
    }
    if constexpr (kRows > 4) {
      RowStep<kCols>(hn::LoadU(df, a4 + d), v0, v1, v2, v3, s40, s41, s42, s43);
    }
    if constexpr (kRows > 5) {
      RowStep<kCols>(hn::LoadU(df, a5 + d), v0, v1, v2, v3, s50, s51, s52, s53);
    }
  }
  FinishRow<Row, kCols>(df, s00, s01, s02, s03, a0, wr, kv, k, alpha, beta, c, c_cs);
  if constexpr (kRows > 1) {
    FinishRow<Row, kCols>(df, s10, s11, s12, s13, a1, wr, kv, k, alpha, beta, c + c_rs, c_cs);
  }
  if constexpr (kRows > 2) {
    FinishRow<Row, kCols>(df, s20, s21, s22, s23, a2, wr, kv, k, alpha, beta, c + 2 * c_rs, c_cs);
  }
  if constexpr (kRows > 3) {
    FinishRow<Row, kCols>(df, s30, s31, s32, s33, a3, wr, kv, k, alpha, beta, c + 3 * c_rs, c_cs);
  }
  if constexpr (kRows > 4) {
    FinishRow<Row, kCols>(df, s40, s41, s42, s43, a4, wr, kv, k, alpha, beta, c + 4 * c_rs, c_cs);
  }
  if constexpr (kRows > 5) {
    FinishRow<Row, kCols>(df, s50, s51, s52, s53, a5, wr, kv, k, alpha, beta, c + 5 * c_rs, c_cs);
  }
}

// The tile of `rows` (< 6) rows and kCols columns at a, c.
template <class Row, size_t kCols, class DF>
HWY_INLINE void PartialTile(DF df, size_t rows, const float* a, ptrdiff_t a_stride,
                            const typename Row::T* w, ptrdiff_t w_stride, size_t k, float alpha,
                            float beta, float* c, ptrdiff_t c_rs, ptrdiff_t c_cs) {
  switch (rows) {
    case 1:
      Tile<Row, 1, kCols>(df, a, a_stride, w, w_stride, k, alpha, beta, c, c_rs, c_cs);
      break;
    case 2:
      Tile<Row, 2, kCols>(df, a, a_stride, w, w_stride, k, alpha, beta, c, c_rs, c_cs);
      break;
    case 3:
      Tile<Row, 3, kCols>(df, a, a_stride, w, w_stride, k, alpha, beta, c, c_rs, c_cs);
      break;
    case 4:
      Tile<Row, 4, kCols>(df, a, a_stride, w, w_stride, k, alpha, beta, c, c_rs, c_cs);
      break;
    case 5:
      Tile<Row, 5, kCols>(df, a, a_stride, w, w_stride, k, alpha, beta, c, c_rs, c_cs);
      break;
    default:
      break;
  }
}

// All m rows against kCols weight rows: full tiles of kRows, then one smaller tile.
template <class Row, size_t kRows, size_t kCols, class DF>
HWY_INLINE void Columns(DF df, size_t m, const float* a, ptrdiff_t a_stride,
                        const typename Row::T* w, ptrdiff_t w_stride, size_t k, float alpha,
                        float beta, float* c, ptrdiff_t c_rs, ptrdiff_t c_cs) {
  size_t i = 0;
  for (; i + kRows <= m; i += kRows) {
    Tile<Row, kRows, kCols>(df, a + static_cast<ptrdiff_t>(i) * a_stride, a_stride, w, w_stride,
                            k, alpha, beta, c + static_cast<ptrdiff_t>(i) * c_rs, c_rs, c_cs);
  }
  PartialTile<Row, kCols>(df, m - i, a + static_cast<ptrdiff_t>(i) * a_stride, a_stride, w,
                          w_stride, k, alpha, beta, c + static_cast<ptrdiff_t>(i) * c_rs, c_rs,
                          c_cs);
}

// c[i * c_rs + j * c_cs] = alpha * sum_{p < k} a[i * a_stride + p] * w[j * w_stride + p]
//                          + beta * c[i * c_rs + j * c_cs], for i < m, j < n (see gemv.h),
// with w's elements read through Row (f32, or bf16/f16 widened exactly).
template <class Row>
HWY_INLINE void Rows(size_t m, size_t n, size_t k, float alpha, const float* a, ptrdiff_t a_stride,
                     const typename Row::T* w, ptrdiff_t w_stride, float beta, float* c,
                     ptrdiff_t c_rs, ptrdiff_t c_cs) {
  const hn::ScalableTag<float> df;
  size_t j = 0;
  bool wide = false;
  if constexpr (kWideRows != 0) {
    wide = m >= kWideRows;
    for (; wide && j + kWideCols <= n; j += kWideCols) {
      Columns<Row, kWideRows, kWideCols>(df, m, a, a_stride,
                                         w + static_cast<ptrdiff_t>(j) * w_stride, w_stride, k,
                                         alpha, beta, c + static_cast<ptrdiff_t>(j) * c_cs, c_rs,
                                         c_cs);
    }
  }
  if (!wide) {
    for (; j + kTileCols <= n; j += kTileCols) {
      Columns<Row, kTileRows, kTileCols>(df, m, a, a_stride,
                                         w + static_cast<ptrdiff_t>(j) * w_stride, w_stride, k,
                                         alpha, beta, c + static_cast<ptrdiff_t>(j) * c_cs, c_rs,
                                         c_cs);
    }
  }
  for (; j < n; ++j) {
    Columns<Row, kTileRows, 1>(df, m, a, a_stride, w + static_cast<ptrdiff_t>(j) * w_stride,
                               w_stride, k, alpha, beta, c + static_cast<ptrdiff_t>(j) * c_cs,
                               c_rs, c_cs);
  }
}

}  // namespace gemv_detail

// The dispatched entry points, one per weight type (gemv.h).
inline void GemvRows(size_t m, size_t n, size_t k, float alpha, const float* a, ptrdiff_t a_stride,
                     const float* w, ptrdiff_t w_stride, float beta, float* c, ptrdiff_t c_rs,
                     ptrdiff_t c_cs) {
  gemv_detail::Rows<elementwise_detail::F32Row>(m, n, k, alpha, a, a_stride, w, w_stride, beta, c,
                                                c_rs, c_cs);
}
inline void GemvRowsBF16(size_t m, size_t n, size_t k, float alpha, const float* a,
                         ptrdiff_t a_stride, const uint16_t* w, ptrdiff_t w_stride, float beta,
                         float* c, ptrdiff_t c_rs, ptrdiff_t c_cs) {
  gemv_detail::Rows<elementwise_detail::BF16Row>(m, n, k, alpha, a, a_stride, w, w_stride, beta, c,
                                                 c_rs, c_cs);
}
inline void GemvRowsF16(size_t m, size_t n, size_t k, float alpha, const float* a,
                        ptrdiff_t a_stride, const uint16_t* w, ptrdiff_t w_stride, float beta,
                        float* c, ptrdiff_t c_rs, ptrdiff_t c_cs) {
  gemv_detail::Rows<elementwise_detail::F16Row>(m, n, k, alpha, a, a_stride, w, w_stride, beta, c,
                                                c_rs, c_cs);
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_GEMV_INL_H_
