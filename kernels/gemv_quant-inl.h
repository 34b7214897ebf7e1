// Per-target GEMV over quantized weights; the contract is in kernels/gemv_quant.h. Included once
// per Highway target by kernels/gemv_quant.cc (foreach_target).
//
// Loop order as gemv-inl.h's: for each group of kTileCols weight rows, for each tile of
// kTileRows rows of a, a register tile of accumulators over k (the group's codes come from
// memory for the first tile and from L1 for the others). Along k a tile walks runs of vectors
// that share one scale and one kind of code (kI8: the row's vectors; kI4: each nibble of a
// group's 16 words, 16 consecutive elements): the run's scales are broadcast once, and each
// weight vector is loaded, decoded, multiplied by its scale and then multiplied into every row of
// the tile. Every accumulator holds one output
// element with Gemv's sequence of operations, whatever the tile shape.

// Toggle guard: compiled once per target by foreach_target.
#if defined(MHA_KERNELS_GEMV_QUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MHA_KERNELS_GEMV_QUANT_INL_H_
#undef MHA_KERNELS_GEMV_QUANT_INL_H_
#else
#define MHA_KERNELS_GEMV_QUANT_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"
#include "kernels/gemv-inl.h"
#include "kernels/quant-inl.h"
#include "kernels/quant.h"

HWY_BEFORE_NAMESPACE();
namespace mha {
namespace kernels {
namespace HWY_NAMESPACE {
namespace gemv_quant_detail {

namespace hn = hwy::HWY_NAMESPACE;
namespace qd = quant_detail;

// Register tiles (rows of a x weight rows). Four weight rows per group give four independent
// accumulator chains per row of a. x86 below AVX-512 has 16 vector registers: 2 x 4 (8
// accumulators, 4 weight vectors, 4 scales, a row) is the largest tile that does not spill
// there; other targets have 32 and take 4 x 4.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr size_t kTileRows = 2;
#else
constexpr size_t kTileRows = 4;
#endif
constexpr size_t kTileCols = 4;

// Gemv's register pinning and row step (gemv-inl.h), so that the operations per element are
// Gemv's.
using gemv_detail::KeepInRegister;
using gemv_detail::RowStep;

// The rows of a and weight rows of one tile, and where the run starts.
template <size_t kRows, size_t kCols>
struct TileRows {
  const float* a[4];
  const uint8_t* w[4];  // the run's first byte of each weight row
};

// Weight decoders: Weights(df, p, sc) is the vector of dequantized weights whose codes start at
// byte p, kStride bytes per lane (sc: the scale broadcast, or the block's table).
// kI8: bytes widened, converted, multiplied by the row's scale.
struct ScaledI8 {
  static constexpr size_t kStride = 1;
  template <class DF, class V = hn::Vec<DF>>
  static HWY_INLINE V Weights(DF df, const uint8_t* p, V sc) {
    return hn::Mul(qd::I8Codes::Load(df, p), sc);
  }
};

// kI4: nibble kShift / 4 of consecutive words (kShift a constant: an immediate shift), or of
// `shift` (ScaledI4Dyn), turned into codes without a shuffle and multiplied by the block's scale.
template <int kShift>
struct ScaledI4 {
  static constexpr size_t kStride = 4;
  template <class DF, class V = hn::Vec<DF>>
  static HWY_INLINE V Weights(DF df, const uint8_t* p, V sc) {
    return hn::Mul(qd::I4CodesOf(df, hn::ShiftRight<kShift>(qd::I4Words(df, p))), sc);
  }
};
struct ScaledI4Dyn {
  static constexpr size_t kStride = 4;
  int shift;
  template <class DF, class V = hn::Vec<DF>>
  HWY_INLINE V Weights(DF df, const uint8_t* p, V sc) const {
    return hn::Mul(qd::I4CodesOf(df, hn::ShiftRightSame(qd::I4Words(df, p), shift)), sc);
  }
};

// The kI4 decoder of whole groups: the scale broadcast per block (Scale) and ScaledI4 per nibble.
struct ScaledGroups {
  template <int kShift>
  using Nibble = ScaledI4<kShift>;
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Scale(DF df, float scale) {
    return hn::Set(df, scale);
  }
};

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// AVX-512 (16 lanes: one vector per nibble of a group): the 16 dequantized weights of a block,
// (c - 8) * scale for nibble c, in one register (Scale), and each vector of weights looked up
// by its nibbles (vpermps, which reads only the low 4 bits of each index: no mask) after the
// shift: the same values (each entry is that product, rounded once), one shuffle per 16 weights.
template <int kShift>
struct LookedUpI4 {
  static constexpr size_t kStride = 4;
  template <class DF, class V = hn::Vec<DF>>
  static HWY_INLINE V Weights(DF df, const uint8_t* p, V table) {
    const auto idx = hn::ShiftRight<kShift>(qd::I4Words(df, p));
    // Indices built directly: IndicesFromVec's debug check wants indices below 16.
    return hn::TableLookupLanes(table, hn::Indices512<float>{idx.raw});
  }
};
struct LookedUpGroups {
  template <int kShift>
  using Nibble = LookedUpI4<kShift>;
  template <class DF>
  static HWY_INLINE hn::Vec<DF> Scale(DF df, float scale) {
    return hn::Mul(hn::Set(df, scale), hn::Iota(df, -8.0f));
  }
};
// The whole groups' decoder per target. On Zen 4 the lookup's shift, vpermps and FMA per 16
// weights beat ScaledGroups' shift, ternary logic, subtraction, multiplication and FMA
// (kernels/README.md "Quantized weights").
using I4Groups = LookedUpGroups;
#else
// Without 16-entry in-register tables (AVX2 and below: 8 lanes; NEON, SVE), the shuffle-free
// decoding.
using I4Groups = ScaledGroups;
#endif

// One run of `n` elements (a multiple of Lanes(df)) from element `d0` of k, whose codes lie at
// rows.w[j] + i * kStride (i the element's index in the run) and whose weights codes.Weights
// makes from them and sc0..sc3 (the scales broadcast, or the block's tables): s_rj += a_r[d0 +
// i] * weight for every vector of the run.
template <class Codes, size_t kRows, size_t kCols, class DF, class V = hn::Vec<DF>>
HWY_INLINE void Run(DF df, const Codes& codes, const TileRows<kRows, kCols>& t, size_t d0, size_t n,
                    V sc0, V sc1, V sc2, V sc3, V& s00, V& s01, V& s02, V& s03, V& s10, V& s11,
                    V& s12, V& s13, V& s20, V& s21, V& s22, V& s23, V& s30, V& s31, V& s32,
                    V& s33) {
  const size_t N = hn::Lanes(df);
  constexpr size_t kStride = Codes::kStride;
  const float* HWY_RESTRICT a0 = t.a[0] + d0;
  const float* HWY_RESTRICT a1 = t.a[1] + d0;
  const float* HWY_RESTRICT a2 = t.a[2] + d0;
  const float* HWY_RESTRICT a3 = t.a[3] + d0;
  for (size_t i = 0; i < n; i += N) {
    V v0 = codes.Weights(df, t.w[0] + i * kStride, sc0);
    V v1 = v0, v2 = v0, v3 = v0;
    if constexpr (kCols > 1) {
      v1 = codes.Weights(df, t.w[1] + i * kStride, sc1);
      v2 = codes.Weights(df, t.w[2] + i * kStride, sc2);
      v3 = codes.Weights(df, t.w[3] + i * kStride, sc3);
    }
    if constexpr (kRows > 1) {
      KeepInRegister(v0);
      if constexpr (kCols > 1) {
        KeepInRegister(v1);
        KeepInRegister(v2);
        KeepInRegister(v3);
      }
    }
    RowStep<kCols>(hn::LoadU(df, a0 + i), v0, v1, v2, v3, s00, s01, s02, s03);
    if constexpr (kRows > 1)
      RowStep<kCols>(hn::LoadU(df, a1 + i), v0, v1, v2, v3, s10, s11, s12, s13);
    if constexpr (kRows > 2)
      RowStep<kCols>(hn::LoadU(df, a2 + i), v0, v1, v2, v3, s20, s21, s22, s23);
    if constexpr (kRows > 3)
      RowStep<kCols>(hn::LoadU(df, a3 + i), v0, v1, v2, v3, s30, s31, s32, s33);
  }
}

// Nibbles kS..7 of one whole kI4 group (elements d0 + 16 kS .. d0 + 127; t.w at the group's
// words, gs[j] at its first block's scale in weight row j), Groups' decoder: each nibble is 16
// consecutive elements (16 / Lanes(df) vectors), a new block's scales (or tables) at every
// kBlock / 16 nibbles.
template <class Groups, size_t kBlock, int kS, size_t kRows, size_t kCols, class DF,
          class V = hn::Vec<DF>>
HWY_INLINE void GroupNibbles(DF df, const TileRows<kRows, kCols>& t, const float* const* gs,
                             size_t d0, V sc0, V sc1, V sc2, V sc3, V& s00, V& s01, V& s02, V& s03,
                             V& s10, V& s11, V& s12, V& s13, V& s20, V& s21, V& s22, V& s23, V& s30,
                             V& s31, V& s32, V& s33) {
  if constexpr (kS * 16 % kBlock == 0) {
    constexpr size_t b = kS * 16 / kBlock;
    sc0 = Groups::Scale(df, gs[0][b]);
    if constexpr (kCols > 1) {
      sc1 = Groups::Scale(df, gs[1][b]);
      sc2 = Groups::Scale(df, gs[2][b]);
      sc3 = Groups::Scale(df, gs[3][b]);
    }
  }
  Run(df, typename Groups::template Nibble<4 * kS>(), t, d0 + 16 * kS, 16, sc0, sc1, sc2, sc3, s00,
      s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33);
  if constexpr (kS < 7) {
    GroupNibbles<Groups, kBlock, kS + 1>(df, t, gs, d0, sc0, sc1, sc2, sc3, s00, s01, s02, s03, s10,
                                         s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33);
  }
}

// Finishes element (r, j) from `dot`, the lane sum of its accumulator: plus the products over
// [kv, k) in order (each weight dequantized alone), into *c: Gemv's Finish with alpha 1 and
// beta 0.
HWY_INLINE void Finish(float dot, const float* HWY_RESTRICT a, const QuantMatrix& w, size_t j,
                       size_t kv, float* HWY_RESTRICT c) {
  for (size_t p = kv; p < w.cols; ++p) dot += a[p] * DequantizedWeight(w, j, p);
  *c = dot;
}

// The lane sums of row r's first kCols accumulators, into dots[0..kCols).
template <size_t kCols, class DF, class V = hn::Vec<DF>>
HWY_INLINE void LaneSums(DF df, V s0, V s1, V s2, V s3, float* dots) {
  dots[0] = hn::GetLane(hn::SumOfLanes(df, s0));
  if constexpr (kCols > 1) {
    dots[1] = hn::GetLane(hn::SumOfLanes(df, s1));
    dots[2] = hn::GetLane(hn::SumOfLanes(df, s2));
    dots[3] = hn::GetLane(hn::SumOfLanes(df, s3));
  }
}

// The kRows x kCols tile of c at `c`: rows a + r * a_stride, weight rows j0 + j of w, whose
// format is kBlock's: 0 for kI8, else kI4 with blocks of kBlock (a compile-time constant, so a
// whole group's nibbles, shifts and scales are constants: each vector is an immediate shift of a
// load) decoded by Groups (ScaledGroups, or LookedUpGroups on AVX-512). Not inlined, as
// gemv-inl.h's tiles: each gets all the registers.
template <size_t kBlock, class Groups, size_t kRows, size_t kCols, class DF>
HWY_NOINLINE void Tile(DF df, const float* HWY_RESTRICT a, ptrdiff_t a_stride, const QuantMatrix& w,
                       size_t j0, float* HWY_RESTRICT c, ptrdiff_t c_rs, ptrdiff_t c_cs) {
  static_assert(kRows >= 1 && kRows <= 4, "tile rows: 1..4");
  static_assert(kCols == 1 || kCols == 4, "tile columns: 1 or 4");
  using V = hn::Vec<DF>;
  const size_t N = hn::Lanes(df);
  const size_t k = w.cols;
  const size_t kv = k / N * N;
  // Rows and weight rows beyond the tile alias the first one and are never read.
  TileRows<kRows, kCols> t;
  const uint8_t* rows[4];
  const float* scales[4];
  for (size_t r = 0; r < 4; ++r) t.a[r] = a + static_cast<ptrdiff_t>(r < kRows ? r : 0) * a_stride;
  for (size_t j = 0; j < 4; ++j) {
    const size_t row = j0 + (j < kCols ? j : 0);
    rows[j] = w.codes + row * w.row_bytes;
    scales[j] = w.scales + row * w.scales_per_row;
  }
  V s00 = hn::Zero(df), s01 = s00, s02 = s00, s03 = s00;
  V s10 = s00, s11 = s00, s12 = s00, s13 = s00;
  V s20 = s00, s21 = s00, s22 = s00, s23 = s00;
  V s30 = s00, s31 = s00, s32 = s00, s33 = s00;
  if constexpr (kBlock == 0) {
    for (size_t j = 0; j < 4; ++j) t.w[j] = rows[j];
    Run(df, ScaledI8(), t, 0, kv, hn::Set(df, scales[0][0]), hn::Set(df, scales[1][0]),
        hn::Set(df, scales[2][0]), hn::Set(df, scales[3][0]), s00, s01, s02, s03, s10, s11, s12,
        s13, s20, s21, s22, s23, s30, s31, s32, s33);
  } else {
    constexpr size_t kBlocksPerGroup = kI4Group / kBlock;
    const V zero = hn::Zero(df);
    const float* gs[4];
    // The groups under kv whole, nibble by nibble (every vector's elements consecutive, in
    // increasing order).
    const size_t whole = kv / kI4Group;
    for (size_t g = 0; g < whole; ++g) {
      for (size_t j = 0; j < 4; ++j) {
        t.w[j] = rows[j] + g * kI4GroupBytes;
        gs[j] = scales[j] + g * kBlocksPerGroup;
      }
      GroupNibbles<Groups, kBlock, 0>(df, t, gs, g * kI4Group, zero, zero, zero, zero, s00, s01,
                                      s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31,
                                      s32, s33);
    }
    // The rest of the vectors, in the row's last, partial group: its nibbles as far as kv (a
    // multiple of Lanes(df), as 16 and each nibble's start are).
    const size_t d0 = whole * kI4Group, rest = kv - d0;
    for (size_t j = 0; j < 4; ++j) {
      t.w[j] = rows[j] + whole * kI4GroupBytes;
      gs[j] = scales[j] + whole * kBlocksPerGroup;
    }
    V sc0 = zero, sc1 = zero, sc2 = zero, sc3 = zero;
    for (size_t s = 0; 16 * s < rest; ++s) {
      if (16 * s % kBlock == 0) {
        sc0 = hn::Set(df, gs[0][16 * s / kBlock]);
        sc1 = hn::Set(df, gs[1][16 * s / kBlock]);
        sc2 = hn::Set(df, gs[2][16 * s / kBlock]);
        sc3 = hn::Set(df, gs[3][16 * s / kBlock]);
      }
      const size_t len = rest - 16 * s < 16 ? rest - 16 * s : 16;
      Run(df, ScaledI4Dyn{static_cast<int>(4 * s)}, t, d0 + 16 * s, len, sc0, sc1, sc2, sc3, s00,
          s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33);
    }
  }
  // Every lane sum before the first tail's calls (DequantizedWeight is out of line): a vector
  // live across a call lives in memory, and GCC 12 then kept it there through the loops above
  // too (on AVX2 a store-to-load chain per vector: bench/README.md "AMD EPYC Zen 3",
  // "Quantized weights").
  float dots[kRows][kCols];
  LaneSums<kCols>(df, s00, s01, s02, s03, dots[0]);
  if constexpr (kRows > 1) LaneSums<kCols>(df, s10, s11, s12, s13, dots[1]);
  if constexpr (kRows > 2) LaneSums<kCols>(df, s20, s21, s22, s23, dots[2]);
  if constexpr (kRows > 3) LaneSums<kCols>(df, s30, s31, s32, s33, dots[3]);
  for (size_t r = 0; r < kRows; ++r) {
    for (size_t j = 0; j < kCols; ++j) {
      Finish(dots[r][j], t.a[r], w, j0 + j, kv,
             c + static_cast<ptrdiff_t>(r) * c_rs + static_cast<ptrdiff_t>(j) * c_cs);
    }
  }
}

// All m rows against kCols weight rows from j0: full tiles of kTileRows, then one smaller tile.
template <size_t kBlock, class Groups, size_t kCols, class DF>
HWY_INLINE void Columns(DF df, size_t m, const float* a, ptrdiff_t a_stride, const QuantMatrix& w,
                        size_t j0, float* c, ptrdiff_t c_rs, ptrdiff_t c_cs) {
  size_t i = 0;
  for (; i + kTileRows <= m; i += kTileRows) {
    Tile<kBlock, Groups, kTileRows, kCols>(df, a + static_cast<ptrdiff_t>(i) * a_stride, a_stride,
                                           w, j0, c + static_cast<ptrdiff_t>(i) * c_rs, c_rs, c_cs);
  }
  const float* a_rest = a + static_cast<ptrdiff_t>(i) * a_stride;
  float* c_rest = c + static_cast<ptrdiff_t>(i) * c_rs;
  switch (m - i) {
    case 1:
      Tile<kBlock, Groups, 1, kCols>(df, a_rest, a_stride, w, j0, c_rest, c_rs, c_cs);
      break;
    case 2:
      Tile<kBlock, Groups, 2 < kTileRows ? 2 : 1, kCols>(df, a_rest, a_stride, w, j0, c_rest, c_rs,
                                                         c_cs);
      break;
    case 3:
      Tile<kBlock, Groups, 3 < kTileRows ? 3 : 1, kCols>(df, a_rest, a_stride, w, j0, c_rest, c_rs,
                                                         c_cs);
      break;
    default:
      break;
  }
}

// c [m, w.rows] = a [m, w.cols] * w^T for w of kBlock's format (Tile).
template <size_t kBlock, class Groups>
HWY_INLINE void Rows(size_t m, const float* a, ptrdiff_t a_stride, const QuantMatrix& w, float* c,
                     ptrdiff_t c_rs, ptrdiff_t c_cs) {
  const qd::QuantTag df;
  size_t j = 0;
  for (; j + kTileCols <= w.rows; j += kTileCols) {
    Columns<kBlock, Groups, kTileCols>(df, m, a, a_stride, w, j,
                                       c + static_cast<ptrdiff_t>(j) * c_cs, c_rs, c_cs);
  }
  for (; j < w.rows; ++j) {
    Columns<kBlock, Groups, 1>(df, m, a, a_stride, w, j, c + static_cast<ptrdiff_t>(j) * c_cs, c_rs,
                               c_cs);
  }
}

}  // namespace gemv_quant_detail

// The dispatched entry point (gemv_quant.h): c [m, w.rows] = a [m, w.cols] * w^T.
inline void GemvQuantRows(size_t m, const float* a, ptrdiff_t a_stride, const QuantMatrix& w,
                          float* c, ptrdiff_t c_rs, ptrdiff_t c_cs) {
  namespace gq = gemv_quant_detail;
  if (w.type == DType::kI8) {
    gq::Rows<0, gq::I4Groups>(m, a, a_stride, w, c, c_rs, c_cs);
  } else if (w.block == kI4Block) {
    gq::Rows<kI4Block, gq::I4Groups>(m, a, a_stride, w, c, c_rs, c_cs);
  } else {
    gq::Rows<kI4LargeBlock, gq::I4Groups>(m, a, a_stride, w, c, c_rs, c_cs);
  }
}

// Whether this target's f32 vectors have at most gemv_quant's lanes (GemvQuantOrdersAsGemv).
inline bool OrdersAsGemv() {
  return hwy::HWY_NAMESPACE::Lanes(hwy::HWY_NAMESPACE::ScalableTag<float>()) <=
         quant_detail::kMaxQuantLanes;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace mha
HWY_AFTER_NAMESPACE();

#endif  // MHA_KERNELS_GEMV_QUANT_INL_H_
