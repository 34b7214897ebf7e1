// Per-target emulated bf16 block kernel (Bf16Kernel::kEmulated); the contract is in
// kernels/gemm_bf16.h and kernels/gemm_bf16_native.h (Bf16Block). Included once per Highway
// target by kernels/gemm_bf16.cc (foreach_target).
//
// Each packed pair row of a panel is read as u32 lanes, one per column (low half: the even k
// element, high half: the odd one); both halves widen to f32 exactly (a shift or a mask), and
// each accumulator takes acc = fma(a_odd, b_odd, acc), then fma(a_even, b_even, acc): the
// products of two bf16 values are exact in f32, so each fma rounds once as VDPBF16PS's add does
// and the two kernels agree bitwise (VDPBF16PS flushes subnormals; this does not).
//
// Vectors are CappedTag<float, 16>: at most 16 lanes, so a 32-column panel is whole vectors on
// every target (Highway's SVE vectors are powers of two). A register tile is kRows rows of a x
// two vectors of columns inside one panel (a whole panel on AVX-512), over the block's depth.
// Loop order: row tiles outer, each tile's rows of a widened once to f32 into the block's
// scratch (kRows x depth floats: at most 16 KiB), so the inner loop broadcasts a's elements
// from memory (a load, no shuffle or integer op) and spends its vector ALU slots on the fused
// multiply-adds and b's widening (amortized over the tile's rows); b's column groups stream from
// L1/L2 for each row tile. Widening a inside the inner loop instead (broadcast, mask, shift per
// row and pair) measured 134 GFLOP/s against this form's 171 (AVX3_DL, [128, 1024] x
// [1024, 1024], kernels/README.md).

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_GEMM_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_GEMM_BF16_INL_H_
#undef MHA_KERNELS_GEMM_BF16_INL_H_
#else
#define MHA_KERNELS_GEMM_BF16_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_bf16_native.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

namespace gemm_bf16_detail {

// Rows of a register tile. A tile holds 2 * kRows accumulators, 4 widened b vectors (odd and
// even halves of two vectors) and the two broadcasts of a's pair: x86 below AVX-512 has
// 16 vector registers (4 rows: 14; 5 rows measured 6-8% slower on AVX2), the other targets 32
// (8 rows: 22).
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kRows = 4;
#else
constexpr size_t kRows = 8;
#endif

using DF = hn::CappedTag<float, 16>;
using DU = hn::RebindToUnsigned<DF>;

// Upper bound on Lanes(DF()): the lane buffers of the partial stores.
constexpr size_t kMaxLanes = 16;

// One tile: rows [0, rows) of a widened to f32 at `a` (rows lda floats apart: element kk of a
// row at a[kk]), `pairs` pair rows; the tile's two
// vectors of b at b0 and b1 (u32 lanes, one per column; pair rows kBf16PanelCols u32 apart);
// c of the tile's first row and column at `c`, `cols` (<= 2 Lanes) valid columns.
struct TileArgs {
  const float* a;
  size_t lda;
  size_t pairs;
  const uint32_t* b0;
  const uint32_t* b1;
  float* c;
  ptrdiff_t c_rs, c_cs;
  size_t cols;
  float alpha, beta;
  bool first;         // the product's first k block: c = alpha * acc (+ beta * c)
  bool read_c;        // c is read: a later block, or the first with beta != 0
  const float* bias;  // the tile's first column's bias (last block only), or null
};

// The epilogue of one accumulator (gemm_bf16_native.h): `valid` <= Lanes columns of c from
// `c` (columns c_cs apart). Each operation rounded separately; whole vectors at unit stride go
// straight to memory, others through a lane buffer with the same arithmetic.
HWY_NOINLINE void StoreAcc(hn::Vec<DF> acc, const TileArgs& t, float* c, size_t valid,
                           const float* bias) {
  const DF df;
  const size_t N = hn::Lanes(df);
  using V = hn::Vec<DF>;
  const bool whole = valid == N && t.c_cs == 1;
  HWY_ALIGN float buf[kMaxLanes] = {};
  V out = hn::Mul(acc, hn::Set(df, t.alpha));
  if (t.read_c) {
    V old;
    if (whole) {
      old = hn::LoadU(df, c);
    } else {
      for (size_t j = 0; j < valid; ++j) buf[j] = c[static_cast<ptrdiff_t>(j) * t.c_cs];
      old = hn::Load(df, buf);
    }
    out = t.first ? hn::Add(out, hn::Mul(old, hn::Set(df, t.beta))) : hn::Add(old, out);
  }
  if (bias != nullptr) {
    if (valid == N) {
      out = hn::Add(out, hn::LoadU(df, bias));
    } else {
      for (size_t j = 0; j < valid; ++j) buf[j] = bias[j];
      out = hn::Add(out, hn::Load(df, buf));
    }
  }
  if (whole) {
    hn::StoreU(out, df, c);
    return;
  }
  hn::Store(out, df, buf);
  for (size_t j = 0; j < valid; ++j) c[static_cast<ptrdiff_t>(j) * t.c_cs] = buf[j];
}

// Stores row r of a tile (its two accumulators), the columns within t.cols.
HWY_INLINE void StoreRow(hn::Vec<DF> s0, hn::Vec<DF> s1, const TileArgs& t, size_t r) {
  const size_t N = hn::Lanes(DF());
  float* c = t.c + static_cast<ptrdiff_t>(r) * t.c_rs;
  StoreAcc(s0, t, c, std::min(N, t.cols), t.bias);
  if (t.cols > N) {
    StoreAcc(s1, t, c + static_cast<ptrdiff_t>(N) * t.c_cs, t.cols - N,
             t.bias != nullptr ? t.bias + N : nullptr);
  }
}

// One pair row of row kI of a kR-row tile (if the tile has that row): a's odd and even
// elements broadcast, the odd products first into both accumulators.
template <size_t kI, size_t kR, class V = hn::Vec<DF>>
HWY_INLINE void RowStep(const float* HWY_RESTRICT a_row, size_t p, V b0o, V b0e, V b1o, V b1e,
                        V& s0, V& s1) {
  if constexpr (kI < kR) {
    const DF df;
    const V ao = hn::Set(df, a_row[2 * p + 1]);
    const V ae = hn::Set(df, a_row[2 * p]);
    s0 = hn::MulAdd(ao, b0o, s0);
    s0 = hn::MulAdd(ae, b0e, s0);
    s1 = hn::MulAdd(ao, b1o, s1);
    s1 = hn::MulAdd(ae, b1e, s1);
  }
}

template <size_t kI, size_t kR, class V = hn::Vec<DF>>
HWY_INLINE void StoreIf(const TileArgs& t, V s0, V s1) {
  if constexpr (kI < kR) StoreRow(s0, s1, t, kI);
}

// The kR x 2-vector tile (kR in 1..kRows). Named accumulators (SVE vectors are sizeless: no
// arrays); the unused ones are dropped by the compiler. Not inlined, so that each tile shape
// gets all the registers.
template <size_t kR>
HWY_NOINLINE void Tile(const TileArgs& t) {
  static_assert(kR >= 1 && kR <= 8, "tile rows: 1..8");
  const DF df;
  const DU du;
  using V = hn::Vec<DF>;
  const size_t lda = kR > 1 ? t.lda : 0;
  const float* HWY_RESTRICT a0 = t.a;
  const float* HWY_RESTRICT a1 = a0 + lda;
  const float* HWY_RESTRICT a2 = a1 + lda;
  const float* HWY_RESTRICT a3 = a2 + lda;
  const float* HWY_RESTRICT a4 = a3 + lda;
  const float* HWY_RESTRICT a5 = a4 + lda;
  const float* HWY_RESTRICT a6 = a5 + lda;
  const float* HWY_RESTRICT a7 = a6 + lda;
  V s00 = hn::Zero(df), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00, s30 = s00, s31 = s00,
    s40 = s00, s41 = s00, s50 = s00, s51 = s00, s60 = s00, s61 = s00, s70 = s00, s71 = s00;
  const auto hi_mask = hn::Set(du, 0xFFFF0000u);
  size_t bo = 0;
  for (size_t p = 0; p < t.pairs; ++p, bo += kBf16PanelCols) {
    const auto u0 = hn::LoadU(du, t.b0 + bo);
    const auto u1 = hn::LoadU(du, t.b1 + bo);
    const V b0o = hn::BitCast(df, hn::And(u0, hi_mask));
    const V b0e = hn::BitCast(df, hn::ShiftLeft<16>(u0));
    const V b1o = hn::BitCast(df, hn::And(u1, hi_mask));
    const V b1e = hn::BitCast(df, hn::ShiftLeft<16>(u1));
    RowStep<0, kR>(a0, p, b0o, b0e, b1o, b1e, s00, s01);
    RowStep<1, kR>(a1, p, b0o, b0e, b1o, b1e, s10, s11);
    RowStep<2, kR>(a2, p, b0o, b0e, b1o, b1e, s20, s21);
    RowStep<3, kR>(a3, p, b0o, b0e, b1o, b1e, s30, s31);
    RowStep<4, kR>(a4, p, b0o, b0e, b1o, b1e, s40, s41);
    RowStep<5, kR>(a5, p, b0o, b0e, b1o, b1e, s50, s51);
    RowStep<6, kR>(a6, p, b0o, b0e, b1o, b1e, s60, s61);
    RowStep<7, kR>(a7, p, b0o, b0e, b1o, b1e, s70, s71);
  }
  StoreIf<0, kR>(t, s00, s01);
  StoreIf<1, kR>(t, s10, s11);
  StoreIf<2, kR>(t, s20, s21);
  StoreIf<3, kR>(t, s30, s31);
  StoreIf<4, kR>(t, s40, s41);
  StoreIf<5, kR>(t, s50, s51);
  StoreIf<6, kR>(t, s60, s61);
  StoreIf<7, kR>(t, s70, s71);
}

// Tile<rows> for a run-time rows in 1..kRows.
template <size_t kR = 1>
HWY_INLINE void TileRows(size_t rows, const TileArgs& t) {
  if constexpr (kR == kRows) {
    Tile<kR>(t);
  } else {
    if (rows == kR) return Tile<kR>(t);
    TileRows<kR + 1>(rows, t);
  }
}

// Rows of the next tile when `left` rows remain: whole tiles while two or more remain, then the
// rest in two near-equal tiles (as gemm_direct-inl.h), so no tile drops to few chains.
inline size_t TileRowsAt(size_t left) {
  if (left >= 2 * kRows || left <= kRows) return std::min(left, kRows);
  return (left + 1) / 2;
}

// Widens rows [0, rows) of a (bf16, rows lda apart) to f32 at wa (rows depth apart): exact.
HWY_INLINE void WidenRows(const uint16_t* HWY_RESTRICT a, size_t lda, size_t rows, size_t depth,
                          float* HWY_RESTRICT wa) {
  const DF df;
  const DU du;
  const hn::Rebind<uint16_t, DF> du16;
  const size_t N = hn::Lanes(df);
  for (size_t r = 0; r < rows; ++r) {
    // depth is a multiple of kBf16DepthAlign (32), hence of N.
    for (size_t kk = 0; kk < depth; kk += N) {
      const auto wide = hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, a + r * lda + kk)));
      hn::Store(hn::BitCast(df, wide), df, wa + r * depth + kk);
    }
  }
}

}  // namespace gemm_bf16_detail

// One block of GemmBf16PackedB (Bf16Block, gemm_bf16_native.h) with exact widening and f32
// fused multiply-adds: row tiles outer (their rows widened into blk.scratch), then column
// groups of two vectors inside one panel.
inline void Bf16BlockEmulated(const Bf16Block& blk) {
  namespace d = gemm_bf16_detail;
  static_assert(d::kRows * kBf16BlockDepth * sizeof(float) <= kBf16BlockScratchBytes,
                "the block scratch holds a row tile widened");
  const d::DF df;
  const size_t N = hn::Lanes(df);
  float* widened = static_cast<float*>(blk.scratch);
  d::TileArgs t{};
  t.a = widened;
  t.lda = blk.depth;
  t.pairs = blk.depth / 2;
  t.c_rs = blk.c_rs;
  t.c_cs = blk.c_cs;
  t.alpha = blk.alpha;
  t.beta = blk.beta;
  t.first = blk.first;
  t.read_c = !blk.first || blk.beta != 0.0f;
  for (size_t i = 0; i < blk.m;) {
    const size_t rows = d::TileRowsAt(blk.m - i);
    d::WidenRows(blk.a + i * blk.lda, blk.lda, rows, blk.depth, widened);
    for (size_t col = 0; col < blk.n; col += 2 * N) {
      // Both vectors lie in the panel of `col` (2 N divides kBf16PanelCols), which the packing
      // holds whole, so the second is readable even past n.
      const uint16_t* panel = blk.b + (col / kBf16PanelCols) * blk.panel_stride;
      t.b0 = reinterpret_cast<const uint32_t*>(panel) + col % kBf16PanelCols;
      t.b1 = t.b0 + N;
      t.cols = std::min(2 * N, blk.n - col);
      t.bias = blk.bias != nullptr ? blk.bias + col : nullptr;
      t.c = blk.c + static_cast<ptrdiff_t>(i) * blk.c_rs + static_cast<ptrdiff_t>(col) * blk.c_cs;
      d::TileRows(rows, t);
    }
    i += rows;
  }
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_GEMM_BF16_INL_H_
