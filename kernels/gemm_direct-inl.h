// Per-target micro-kernel over a packed b with a read in place; the contract is in
// kernels/gemm_direct.h. Included once per Highway target by kernels/gemm_direct.cc
// (foreach_target).
//
// Loop order (BLIS's macro-kernel): for each KC block of k, for each group of kCols vectors of
// columns (one or more NR-wide micro-panels, or part of one), for each tile of up to kRows rows:
// a register tile of rows x vectors accumulators over the block's k. The group's micro-panels
// (kCols vectors x kc floats: 16 KiB at kc 256 on AVX2) stay in L1 across the row tiles; the
// tiles' rows of a come from L1/L2.

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_GEMM_DIRECT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_GEMM_DIRECT_INL_H_
#undef MHA_KERNELS_GEMM_DIRECT_INL_H_
#else
#define MHA_KERNELS_GEMM_DIRECT_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include "hwy/highway.h"
#include "kernels/elementwise-inl.h"
#include "kernels/gemm.h"
#include "kernels/gemv-inl.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

namespace gemm_direct_detail {

using gemv_detail::KeepInRegister;

// Register tiles: kRows rows of a x kCols vectors of b. A tile needs kRows * kCols accumulators,
// kCols b vectors and one broadcast. x86 below AVX-512 has 16 vector registers: 6 x 2 (15, the
// shape of BLIS's haswell 6 x 16 kernel on AVX2) and, for products of one or two rows, 2 x 4
// (13) so that even one row has four independent multiply-add chains. Other targets have 32
// registers and take 6 x 4 (29).
constexpr size_t kRows = 6;
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kCols = 2;
#else
constexpr size_t kCols = 4;
#endif
constexpr size_t kFewRows = 2;  // products of at most this many rows take kFewRowsCols
constexpr size_t kFewRowsCols = 4;
constexpr size_t kMaxCols = std::max(kCols, kFewRowsCols);

// Where one tile reads and writes: row 0 of a at `a` (rows a_rs apart, k steps a_cs apart),
// the kC vectors of b at b[0..kC) (each advancing b_step floats per k step), row 0 of c at `c`
// (rows c_rs apart, columns c_cs apart) of which the first `cols` columns are stored; `bias`
// (null, or the bias of the tile's first column, on the last k block only) is added to every
// row after the product. A second destination c2 (rows c2_rs apart, columns c_cs apart; null
// for none) receives, with c2_add false, the value stored to c, or with c2_add true its own
// c2 + alpha * acc (GemmDirectPackedBDual).
struct TileArgs {
  const float* a;
  ptrdiff_t a_rs, a_cs;
  const float* b[kMaxCols];
  size_t b_step, kc;
  float* c;
  ptrdiff_t c_rs, c_cs;
  size_t cols;
  float alpha, beta;  // beta: this k block's (the caller's beta, or 1 after the first block)
  bool read_c;        // false: c = alpha * acc (first block with beta == 0)
  const float* bias;  // [cols] added after the product, or null
  float* c2;
  ptrdiff_t c2_rs;
  bool c2_add;
};

// Stores one accumulator: c[j * c_cs] for j < valid lanes (valid <= Lanes), plus bias[j] if
// bias is not null. Whole vectors with unit column stride go straight to memory; others through
// a lane buffer, with the same vector arithmetic, so an element's bits do not depend on where its
// vector ends.
// c2 (the second destination's element of c's, or null) as TileArgs describes. Not inlined: it
// serves only ragged column groups and strided c (StoreWholeRow takes every other tile), and
// inlined into each of the 24 tile shapes per target its branches doubled the library's code.
template <class DF, class V = hn::Vec<DF>>
HWY_NOINLINE void StoreAcc(DF df, V acc, const TileArgs& t, float* c, float* c2, size_t valid,
                           const float* bias) {
  const size_t N = hn::Lanes(df);
  const V prod = hn::Mul(acc, hn::Set(df, t.alpha));
  if (valid == N && t.c_cs == 1) {
    if (c2 != nullptr && t.c2_add) hn::StoreU(hn::Add(hn::LoadU(df, c2), prod), df, c2);
    V out = prod;
    if (t.read_c) out = hn::MulAdd(hn::LoadU(df, c), hn::Set(df, t.beta), prod);
    if (bias != nullptr) out = hn::Add(out, hn::LoadU(df, bias));
    hn::StoreU(out, df, c);
    if (c2 != nullptr && !t.c2_add) hn::StoreU(out, df, c2);
    return;
  }
  HWY_ALIGN float buf[elementwise_detail::kMaxLanesF32] = {};
  if (c2 != nullptr && t.c2_add) {
    for (size_t j = 0; j < valid; ++j) buf[j] = c2[static_cast<ptrdiff_t>(j) * t.c_cs];
    hn::Store(hn::Add(hn::Load(df, buf), prod), df, buf);
    for (size_t j = 0; j < valid; ++j) c2[static_cast<ptrdiff_t>(j) * t.c_cs] = buf[j];
  }
  V out = prod;
  if (t.read_c) {
    for (size_t j = 0; j < valid; ++j) buf[j] = c[static_cast<ptrdiff_t>(j) * t.c_cs];
    out = hn::MulAdd(hn::Load(df, buf), hn::Set(df, t.beta), prod);
  }
  if (bias != nullptr) {
    for (size_t j = 0; j < valid; ++j) buf[j] = bias[j];
    out = hn::Add(out, hn::Load(df, buf));
  }
  hn::Store(out, df, buf);
  for (size_t j = 0; j < valid; ++j) c[static_cast<ptrdiff_t>(j) * t.c_cs] = buf[j];
  if (c2 != nullptr && !t.c2_add) {
    for (size_t j = 0; j < valid; ++j) c2[static_cast<ptrdiff_t>(j) * t.c_cs] = buf[j];
  }
}

// Stores vector j of row r of a tile if it lies within t.cols.
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE void StoreVec(DF df, V acc, const TileArgs& t, size_t r, size_t j) {
  const size_t N = hn::Lanes(df);
  if (j * N >= t.cols) return;
  const ptrdiff_t col = static_cast<ptrdiff_t>(j * N) * t.c_cs;
  StoreAcc(df, acc, t, t.c + static_cast<ptrdiff_t>(r) * t.c_rs + col,
           t.c2 != nullptr ? t.c2 + static_cast<ptrdiff_t>(r) * t.c2_rs + col : nullptr,
           std::min(N, t.cols - j * N), t.bias != nullptr ? t.bias + j * N : nullptr);
}

// Stores row r of a tile: its first kC accumulators.
template <size_t kC, class DF, class V = hn::Vec<DF>>
HWY_INLINE void StoreRow(DF df, V s0, V s1, V s2, V s3, const TileArgs& t, size_t r) {
  StoreVec(df, s0, t, r, 0);
  if constexpr (kC > 1) StoreVec(df, s1, t, r, 1);
  if constexpr (kC > 2) StoreVec(df, s2, t, r, 2);
  if constexpr (kC > 3) StoreVec(df, s3, t, r, 3);
}

// Stores row `c` of a tile whose kC vectors are all whole and at unit column stride (every
// tile except those of a ragged last column group or a strided c): StoreAcc's arithmetic
// without its per-vector checks and lane buffer, which cost 3-10% of the kernel at k 64-512.
// alpha == 1 skips the multiply, an
// exact one, so the bits are StoreAcc's; so does the bias add. c2: the row of the second
// destination, or null.
template <size_t kC, class DF, class V = hn::Vec<DF>>
HWY_INLINE void StoreWholeRow(DF df, const TileArgs& t, float* HWY_RESTRICT c,
                              float* HWY_RESTRICT c2, V s0, V s1, V s2, V s3) {
  const size_t N = hn::Lanes(df);
  if (t.alpha != 1.0f) {
    const V alpha = hn::Set(df, t.alpha);
    s0 = hn::Mul(s0, alpha);
    if constexpr (kC > 1) s1 = hn::Mul(s1, alpha);
    if constexpr (kC > 2) s2 = hn::Mul(s2, alpha);
    if constexpr (kC > 3) s3 = hn::Mul(s3, alpha);
  }
  if (c2 != nullptr && t.c2_add) {
    hn::StoreU(hn::Add(hn::LoadU(df, c2), s0), df, c2);
    if constexpr (kC > 1) hn::StoreU(hn::Add(hn::LoadU(df, c2 + N), s1), df, c2 + N);
    if constexpr (kC > 2) hn::StoreU(hn::Add(hn::LoadU(df, c2 + 2 * N), s2), df, c2 + 2 * N);
    if constexpr (kC > 3) hn::StoreU(hn::Add(hn::LoadU(df, c2 + 3 * N), s3), df, c2 + 3 * N);
  }
  if (t.read_c) {
    const V beta = hn::Set(df, t.beta);
    s0 = hn::MulAdd(hn::LoadU(df, c), beta, s0);
    if constexpr (kC > 1) s1 = hn::MulAdd(hn::LoadU(df, c + N), beta, s1);
    if constexpr (kC > 2) s2 = hn::MulAdd(hn::LoadU(df, c + 2 * N), beta, s2);
    if constexpr (kC > 3) s3 = hn::MulAdd(hn::LoadU(df, c + 3 * N), beta, s3);
  }
  if (const float* HWY_RESTRICT bias = t.bias) {
    s0 = hn::Add(s0, hn::LoadU(df, bias));
    if constexpr (kC > 1) s1 = hn::Add(s1, hn::LoadU(df, bias + N));
    if constexpr (kC > 2) s2 = hn::Add(s2, hn::LoadU(df, bias + 2 * N));
    if constexpr (kC > 3) s3 = hn::Add(s3, hn::LoadU(df, bias + 3 * N));
  }
  hn::StoreU(s0, df, c);
  if constexpr (kC > 1) hn::StoreU(s1, df, c + N);
  if constexpr (kC > 2) hn::StoreU(s2, df, c + 2 * N);
  if constexpr (kC > 3) hn::StoreU(s3, df, c + 3 * N);
  if (c2 != nullptr && !t.c2_add) {
    hn::StoreU(s0, df, c2);
    if constexpr (kC > 1) hn::StoreU(s1, df, c2 + N);
    if constexpr (kC > 2) hn::StoreU(s2, df, c2 + 2 * N);
    if constexpr (kC > 3) hn::StoreU(s3, df, c2 + 3 * N);
  }
}

// One step of a row of a tile: s_c += x * v_c for the first kC vectors. x is pinned to a
// register (gemv_detail::KeepInRegister): otherwise GCC folds its broadcast into each
// multiply-add as a memory operand, one load per multiply-add.
template <size_t kC, class V>
HWY_INLINE void RowStep(V x, V v0, V v1, V v2, V v3, V& s0, V& s1, V& s2, V& s3) {
  if constexpr (kC > 1) KeepInRegister(x);
  s0 = hn::MulAdd(x, v0, s0);
  if constexpr (kC > 1) s1 = hn::MulAdd(x, v1, s1);
  if constexpr (kC > 2) s2 = hn::MulAdd(x, v2, s2);
  if constexpr (kC > 3) s3 = hn::MulAdd(x, v3, s3);
}

// Row kI of a kR-row tile: its step if the tile has that row. a_row: the row's first element.
template <size_t kI, size_t kR, size_t kC, class DF, class V = hn::Vec<DF>>
HWY_INLINE void StepIf(DF df, const float* HWY_RESTRICT a_row, ptrdiff_t ao, V v0, V v1, V v2, V v3,
                       V& s0, V& s1, V& s2, V& s3) {
  if constexpr (kI < kR) RowStep<kC>(hn::Set(df, a_row[ao]), v0, v1, v2, v3, s0, s1, s2, s3);
}

// Stores row kI of a kR-row tile if the tile has that row (see Tile).
template <size_t kI, size_t kR, size_t kC, class DF, class V = hn::Vec<DF>>
HWY_INLINE void StoreIf(DF df, const TileArgs& t, bool whole, V s0, V s1, V s2, V s3) {
  if constexpr (kI < kR) {
    if (whole) {
      float* HWY_RESTRICT c = t.c + static_cast<ptrdiff_t>(kI) * t.c_rs;
      float* HWY_RESTRICT c2 =
          t.c2 != nullptr ? t.c2 + static_cast<ptrdiff_t>(kI) * t.c2_rs : nullptr;
      StoreWholeRow<kC>(df, t, c, c2, s0, s1, s2, s3);
    } else {
      StoreRow<kC>(df, s0, s1, s2, s3, t, kI);
    }
  }
}

// The kR x kC tile (kR in 1..kRows, kC in 1..4). Not inlined, so that each tile shape gets all
// the registers (as gemv_detail::Tile).
template <size_t kR, size_t kC, class DF>
HWY_NOINLINE void Tile(DF df, const TileArgs& t) {
  static_assert(kR >= 1 && kR <= kRows, "tile rows: 1..6");
  static_assert(kC >= 1 && kC <= 4, "tile vectors: 1..4");
  using V = hn::Vec<DF>;
  // Row i of a at a_i; rows past kR alias row 0 and are never read.
  const ptrdiff_t rs = kR > 1 ? t.a_rs : 0;
  const float* HWY_RESTRICT a0 = t.a;
  const float* HWY_RESTRICT a1 = a0 + rs;
  const float* HWY_RESTRICT a2 = a1 + rs;
  const float* HWY_RESTRICT a3 = a2 + rs;
  const float* HWY_RESTRICT a4 = a3 + rs;
  const float* HWY_RESTRICT a5 = a4 + rs;
  const float* HWY_RESTRICT b0 = t.b[0];
  const float* HWY_RESTRICT b1 = kC > 1 ? t.b[1] : b0;
  const float* HWY_RESTRICT b2 = kC > 2 ? t.b[2] : b0;
  const float* HWY_RESTRICT b3 = kC > 3 ? t.b[3] : b0;
  const ptrdiff_t a_cs = t.a_cs;
  const size_t step = t.b_step;
  // Named accumulators and vectors (no arrays or structs: SVE vectors are sizeless types, and
  // with an array GCC 12 stored every accumulator to the stack on each k step); unused ones are
  // dropped by the compiler.
  V s00 = hn::Zero(df), s01 = s00, s02 = s00, s03 = s00;
  V s10 = s00, s11 = s00, s12 = s00, s13 = s00;
  V s20 = s00, s21 = s00, s22 = s00, s23 = s00;
  V s30 = s00, s31 = s00, s32 = s00, s33 = s00;
  V s40 = s00, s41 = s00, s42 = s00, s43 = s00;
  V s50 = s00, s51 = s00, s52 = s00, s53 = s00;
  // One offset into a's rows and one into b's vectors for all of them (base + index
  // addressing): a pointer per row and per vector advanced separately cost seven more integer
  // adds per k step.
  ptrdiff_t ao = 0;
  size_t bo = 0;
  // Four k steps per iteration on x86 (measured on the AVX-512 and AVX2 tiles: kernels/README,
  // "Direct micro-kernel tiles"); each accumulator's chain of multiply-adds, so every bit, is
  // the same either way. Not measured elsewhere, so left to the compiler there.
#if HWY_ARCH_X86
#pragma GCC unroll 4
#endif
  for (size_t p = 0; p < t.kc; ++p, ao += a_cs, bo += step) {
    V v0 = hn::LoadU(df, b0 + bo);
    V v1 = v0, v2 = v0, v3 = v0;
    if constexpr (kC > 1) v1 = hn::LoadU(df, b1 + bo);
    if constexpr (kC > 2) v2 = hn::LoadU(df, b2 + bo);
    if constexpr (kC > 3) v3 = hn::LoadU(df, b3 + bo);
    if constexpr (kR > 1) {
      KeepInRegister(v0);
      if constexpr (kC > 1) KeepInRegister(v1);
      if constexpr (kC > 2) KeepInRegister(v2);
      if constexpr (kC > 3) KeepInRegister(v3);
    }
    StepIf<0, kR, kC>(df, a0, ao, v0, v1, v2, v3, s00, s01, s02, s03);
    StepIf<1, kR, kC>(df, a1, ao, v0, v1, v2, v3, s10, s11, s12, s13);
    StepIf<2, kR, kC>(df, a2, ao, v0, v1, v2, v3, s20, s21, s22, s23);
    StepIf<3, kR, kC>(df, a3, ao, v0, v1, v2, v3, s30, s31, s32, s33);
    StepIf<4, kR, kC>(df, a4, ao, v0, v1, v2, v3, s40, s41, s42, s43);
    StepIf<5, kR, kC>(df, a5, ao, v0, v1, v2, v3, s50, s51, s52, s53);
  }
  // Whole rows at unit column stride store without StoreAcc's checks and lane buffer.
  const bool whole = t.c_cs == 1 && t.cols == kC * hn::Lanes(df);
  StoreIf<0, kR, kC>(df, t, whole, s00, s01, s02, s03);
  StoreIf<1, kR, kC>(df, t, whole, s10, s11, s12, s13);
  StoreIf<2, kR, kC>(df, t, whole, s20, s21, s22, s23);
  StoreIf<3, kR, kC>(df, t, whole, s30, s31, s32, s33);
  StoreIf<4, kR, kC>(df, t, whole, s40, s41, s42, s43);
  StoreIf<5, kR, kC>(df, t, whole, s50, s51, s52, s53);
}

// Rows of the next tile when `left` rows remain: full tiles while two or more remain, then the
// rest in two near-equal tiles, so no tile drops to few independent chains: 16 rows run as
// 6 + 5 + 5 (12, 10, 10 chains on AVX2), not 6 + 6 + 4 (8 chains: every multiply-add latency
// exposed).
inline size_t TileRowsAt(size_t left) {
  if (left >= 2 * kRows || left <= kRows) return std::min(left, kRows);
  return (left + 1) / 2;
}

// Tile<rows, kC> for a run-time rows in 1..kRows.
template <size_t kC, class DF>
HWY_INLINE void TileRows(DF df, size_t rows, const TileArgs& t) {
  switch (rows) {
    case 1:
      return Tile<1, kC>(df, t);
    case 2:
      return Tile<2, kC>(df, t);
    case 3:
      return Tile<3, kC>(df, t);
    case 4:
      return Tile<4, kC>(df, t);
    case 5:
      return Tile<5, kC>(df, t);
    default:
      return Tile<kRows, kC>(df, t);
  }
}

// Tile<rows, cols> for run-time rows in 1..kRows and cols (vectors) in 1..4.
template <class DF>
HWY_INLINE void TileShape(DF df, size_t rows, size_t cols, const TileArgs& t) {
  switch (cols) {
    case 1:
      return TileRows<1>(df, rows, t);
    case 2:
      return TileRows<2>(df, rows, t);
    case 3:
      return TileRows<3>(df, rows, t);
    default:
      return TileRows<4>(df, rows, t);
  }
}

}  // namespace gemm_direct_detail

// Whether NR-wide micro-panels are whole vectors of this target.
inline bool PackedBDirectSupported(size_t nr) {
  const hn::ScalableTag<float> df;
  return nr != 0 && nr % hn::Lanes(df) == 0;
}

// c [m, n] = alpha * a [m, k] * b + beta * c for a packing b of packed_n columns of which
// columns [col0, col0 + n) are used (col0 a multiple of nr) and packed_k >= k rows of which the
// first k are used, in the KC blocks KcBlockDepth(kc_max, packed_k, .) gives, micro-panels nr wide
// with packnr floats per k step; then c += bias (a row of n floats) if bias is not null. If c2 is
// not null (rows c2_rs apart, columns c_cs apart), also c2 = c's final value (c2_add false: stored
// with c's last k block) or c2 += alpha * a * b (c2_add true: one rounded add per k block). m, n, k
// > 0, alpha != 0. Returns false without writing if !PackedBDirectSupported(nr).
inline bool PackedBDirect(size_t m, size_t n, size_t k, float alpha, const float* a, ptrdiff_t a_rs,
                          ptrdiff_t a_cs, const float* b, size_t col0, size_t packed_n,
                          size_t packed_k, size_t nr, size_t packnr, size_t kc_max, float beta,
                          float* c, ptrdiff_t c_rs, ptrdiff_t c_cs, const float* bias, float* c2,
                          ptrdiff_t c2_rs, bool c2_add) {
  namespace d = gemm_direct_detail;
  if (!PackedBDirectSupported(nr)) return false;
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const size_t panels = (packed_n + nr - 1) / nr;
  const size_t n_vec = (n + N - 1) / N;
  const size_t group = m <= d::kFewRows ? d::kFewRowsCols : d::kCols;
  d::TileArgs t{};
  t.a_rs = a_rs;
  t.a_cs = a_cs;
  t.b_step = packnr;
  t.c_rs = c_rs;
  t.c_cs = c_cs;
  t.alpha = alpha;
  t.c2_rs = c2_rs;
  t.c2_add = c2_add;
  const float* block = b;  // the current KC block of the packing
  for (size_t pc = 0, kc_packed = 0; pc < k; pc += kc_packed) {
    // The block's depth in the packing (its micro-panels' length), and the steps of it used.
    kc_packed = KcBlockDepth(kc_max, packed_k, pc);
    const size_t kc = std::min(kc_packed, k - pc);
    t.kc = kc;
    t.beta = pc == 0 ? beta : 1.0f;
    t.read_c = pc != 0 || beta != 0.0f;
    const bool last_block = pc + kc == k;
    for (size_t v0 = 0; v0 < n_vec; v0 += group) {
      const size_t vecs = std::min(group, n_vec - v0);
      for (size_t j = 0; j < vecs; ++j) {
        // Vector v0 + j: columns [col, col + N) of the packing, inside one micro-panel.
        const size_t col = col0 + (v0 + j) * N;
        t.b[j] = block + (col / nr) * packnr * kc_packed + col % nr;
      }
      t.cols = std::min(vecs * N, n - v0 * N);
      t.bias = last_block && bias != nullptr ? bias + v0 * N : nullptr;
      // A copy is written once, with c's final value; an add goes with every k block.
      float* const c2_group = c2 != nullptr && (c2_add || last_block)
                                  ? c2 + static_cast<ptrdiff_t>(v0 * N) * c_cs
                                  : nullptr;
      for (size_t i = 0; i < m;) {
        const size_t rows = d::TileRowsAt(m - i);
        t.a = a + static_cast<ptrdiff_t>(i) * a_rs + static_cast<ptrdiff_t>(pc) * a_cs;
        t.c = c + static_cast<ptrdiff_t>(i) * c_rs + static_cast<ptrdiff_t>(v0 * N) * c_cs;
        t.c2 = c2_group != nullptr ? c2_group + static_cast<ptrdiff_t>(i) * c2_rs : nullptr;
        d::TileShape(df, rows, vecs, t);
        i += rows;
      }
    }
    block += panels * packnr * kc_packed;
  }
  return true;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_GEMM_DIRECT_INL_H_
