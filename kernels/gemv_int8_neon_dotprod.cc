// Int8Kernel::kNeonDotProd: the int8-activation products (gemv_int8.h) on Arm's dot-product
// extension (ARMv8.2 FEAT_DotProd, SDOT). aarch64 builds only; every SIMD function carries the
// extension's target attribute (the rest of the library is compiled for baseline armv8-a) and runs
// only after Int8KernelAvailable (cpu_features.h's CpuHasArmDotProd: getauxval(AT_HWCAP) &
// HWCAP_ASIMDDP).
//
// SDOT (vdotq_s32) multiplies 4 signed bytes of one operand by the 4 signed bytes of the other
// in each of its four 32-bit lanes and adds the 4 products to the lane. Both operands are signed,
// so kI8 codes need none of VPDPBUSD's +128 offset nor the row's code-sum correction: each lane
// ends at the exact int sum of code(a) * code(w). kI4 nibbles are used as stored (code + 8, 0..15,
// a valid signed byte: one AND or shift per vector, where signed codes would take two) and the
// integer accumulator starts at the row's precomputed -8 x lane sum, as in the x86 kernels.
//
// Lane order: a q-register holds 4 of a unit's 16 lanes. The kernel uses the j-major order
// (register j of a unit, lane l = the definition's lane 4l + j, all of 32-block j), in which the
// weights need no shuffle: kI8's bytes 32j .. 32j + 15 of a unit are lanes l = 0..3 of block j
// (inputs 32j + 4l + {0..3}), bytes 32j + 16 .. 32j + 31 the high half; kI4's group of 16 words
// (quant.h: byte 4k + j holds elements 32j + k and 32j + 16 + k) is de-interleaved by one LD4
// (vld4q_u8) into register j = block j, element k in the low nibble of byte k, element k + 16 in
// the high one. The activation row stores the l-major order (dword 4l + j, VPDPBUSD's); one
// vld4q_s32 per 64-byte half transposes it into the same j-major registers, and one more the
// lane sums. The f32 epilogue is the definition's lane by lane (vcvtq, vmulq_laneq by the block's
// scale, vaddq: the project compiles with -ffp-contract=off, so nothing is fused into FMLA), and
// the lane tree pairs j-major lanes as the definition pairs lanes L + 8, L + 4, L + 2, L + 1.
//
// Register tiles: one activation row x kI8Cols (2) or kI4Cols (1) weight rows, 4 f32
// accumulators per weight row; the row's 8 j-major activation registers are loaded once per unit
// for the tile's weight rows. Per unit and weight row: 8 SDOT, 4 conversions, 4 multiplications,
// 4 additions (+ 8 nibble extractions for kI4), 8 q loads (kI8) or one LD4 (kI4). Larger tiles
// spill in GCC 12 -O3's unit loop (objdump): it issues a unit's SDOTs before its f32 epilogue, so
// the 4 int sums per weight row live beside the accumulators (kI8 4 weight rows: 12 of 16
// accumulators through the stack per unit; kI4 2: 6 of 8, beside the lane sums' 4 registers); two
// activation rows would take 16 registers before any accumulator.
// Activation rows are blocked for the caches as in the x86 kernels (AllTiles).
#include <cstddef>
#include <cstdint>

#include "kernels/gemv_int8.h"
#include "kernels/gemv_int8_native.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <algorithm>
#include <cstring>

#define MHA_DOTPROD_ATTR __attribute__((target("arch=armv8.2-a+dotprod")))
#define MHA_DOTPROD_INLINE MHA_DOTPROD_ATTR inline __attribute__((always_inline))

namespace mha {
namespace kernels {
namespace gemv_int8_neon_dotprod {
namespace {

constexpr size_t kI8Cols = 2;
constexpr size_t kI4Cols = 1;  // no spill with one: see the register tiles above

// The definition's lane tree on j-major accumulators (acc[j] lane l = lane 4l + j).
MHA_DOTPROD_INLINE float LaneTree(const float32x4_t (&acc)[4]) {
  // t8[L] = acc[L] + acc[L + 8] = acc[j][l] + acc[j][l + 2] for l = 0, 1: lanes t8[0], t8[4],
  // t8[1], t8[5], then t8[2], t8[6], t8[3], t8[7].
  const float32x4_t t8_01 = vaddq_f32(vcombine_f32(vget_low_f32(acc[0]), vget_low_f32(acc[1])),
                                      vcombine_f32(vget_high_f32(acc[0]), vget_high_f32(acc[1])));
  const float32x4_t t8_23 = vaddq_f32(vcombine_f32(vget_low_f32(acc[2]), vget_low_f32(acc[3])),
                                      vcombine_f32(vget_high_f32(acc[2]), vget_high_f32(acc[3])));
  // t4[j] = t8[j] + t8[j + 4]: adjacent pairs.
  const float32x4_t t4 = vpaddq_f32(t8_01, t8_23);
  const float32x2_t t2 = vadd_f32(vget_low_f32(t4), vget_high_f32(t4));
  return vget_lane_f32(t2, 0) + vget_lane_f32(t2, 1);
}

// One unit's activations of a row, j-major: lo[j] byte b = input 32j + b of the unit, hi[j] the
// same + 16, as lane j = block j's scale. (Taken out of vld4q's structs at once: GCC 12 keeps a
// struct that is copied whole in memory.)
struct UnitActs {
  int8x16_t lo[4], hi[4];
  float32x4_t as;
};

MHA_DOTPROD_INLINE UnitActs LoadUnit(const Int8ActLayout& lay, const uint8_t* arow, size_t u) {
  UnitActs a;
  const int32x4x4_t lo = vld4q_s32(reinterpret_cast<const int32_t*>(arow + kI4Group * u));
  const int32x4x4_t hi = vld4q_s32(reinterpret_cast<const int32_t*>(arow + kI4Group * u + 64));
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    a.lo[j] = vreinterpretq_s8_s32(lo.val[j]);
    a.hi[j] = vreinterpretq_s8_s32(hi.val[j]);
  }
  a.as = vld1q_f32(reinterpret_cast<const float*>(arow + lay.scales_offset) + 4 * u);
  return a;
}

// Block j of one unit of kI8 weight rows wu[c] (128 bytes each) against a row's activations:
// acc[c][j] = acc[c][j] + float(s) * as[j] (a multiplication by lane: no broadcast register).
template <int kJ, size_t kCols>
MHA_DOTPROD_INLINE void BlockI8(const UnitActs& a, const int8_t* const (&wu)[kCols],
                                float32x4_t (&acc)[kCols][4]) {
#pragma GCC unroll 4
  for (size_t c = 0; c < kCols; ++c) {
    int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8(wu[c] + 32 * kJ), a.lo[kJ]);
    s = vdotq_s32(s, vld1q_s8(wu[c] + 32 * kJ + 16), a.hi[kJ]);
    acc[c][kJ] = vaddq_f32(acc[c][kJ], vmulq_laneq_f32(vcvtq_f32_s32(s), a.as, kJ));
  }
}

template <size_t kCols>
MHA_DOTPROD_INLINE void UnitI8(const UnitActs& a, const int8_t* const (&wu)[kCols],
                               float32x4_t (&acc)[kCols][4]) {
  BlockI8<0>(a, wu, acc);
  BlockI8<1>(a, wu, acc);
  BlockI8<2>(a, wu, acc);
  BlockI8<3>(a, wu, acc);
}

// Activation row i x weight rows [r0, r0 + kCols), kI8.
template <size_t kCols>
MHA_DOTPROD_ATTR __attribute__((noinline)) void TileI8(const Int8Call& x, size_t i, size_t r0) {
  const Int8ActLayout& lay = *x.lay;
  const QuantMatrix& w = *x.w;
  const uint8_t* arow = x.Row(i);
  const int8_t* wrow[kCols];
  float32x4_t acc[kCols][4];
#pragma GCC unroll 4
  for (size_t c = 0; c < kCols; ++c) {
    wrow[c] = reinterpret_cast<const int8_t*>(w.codes + (r0 + c) * w.row_bytes);
#pragma GCC unroll 4
    for (size_t j = 0; j < 4; ++j) acc[c][j] = vdupq_n_f32(0.0f);
  }
  const size_t full = w.cols / kI4Group;
  for (size_t u = 0; u < full; ++u) {
    const int8_t* wu[kCols];
#pragma GCC unroll 4
    for (size_t c = 0; c < kCols; ++c) wu[c] = wrow[c] + kI4Group * u;
    UnitI8<kCols>(LoadUnit(lay, arow, u), wu, acc);
  }
  if (full < lay.units) {
    // A row's codes end at cols: the last unit's valid bytes, zero after (the activation codes
    // past k are 0 anyway; the copy keeps the loads inside the row).
    int8_t tail[kCols][kI4Group] = {};
    const int8_t* wu[kCols];
#pragma GCC unroll 4
    for (size_t c = 0; c < kCols; ++c) {
      std::memcpy(tail[c], wrow[c] + kI4Group * full, w.cols - kI4Group * full);
      wu[c] = tail[c];
    }
    UnitI8<kCols>(LoadUnit(lay, arow, full), wu, acc);
  }
#pragma GCC unroll 4
  for (size_t c = 0; c < kCols; ++c) {
    x.Out(i, r0 + c) = LaneTree(acc[c]) * w.scales[(r0 + c) * w.scales_per_row];
  }
}

// Block j of one kI4 unit: weight groups g[c] (vld4q_u8 of 64 bytes) against a row's
// activations, the integer sums starting at corr (the nibbles' + 8 removed): acc[c][j] =
// acc[c][j] + float(s) * f[c][j].
template <int kJ, size_t kCols>
MHA_DOTPROD_INLINE void BlockI4(const UnitActs& a, const int32x4_t (&corr)[4],
                                const uint8x16_t (&g)[kCols][4], const float32x4_t (&f)[kCols],
                                float32x4_t (&acc)[kCols][4]) {
#pragma GCC unroll 4
  for (size_t c = 0; c < kCols; ++c) {
    const int8x16_t wlo = vreinterpretq_s8_u8(vandq_u8(g[c][kJ], vdupq_n_u8(0x0F)));
    const int8x16_t whi = vreinterpretq_s8_u8(vshrq_n_u8(g[c][kJ], 4));
    int32x4_t s = vdotq_s32(corr[kJ], wlo, a.lo[kJ]);
    s = vdotq_s32(s, whi, a.hi[kJ]);
    acc[c][kJ] = vaddq_f32(acc[c][kJ], vmulq_laneq_f32(vcvtq_f32_s32(s), f[c], kJ));
  }
}

// Unit u of weight rows wrow[c] against activation row arow; ws[c] lane j = the weight scale of
// the unit's block j (0 past the row's last 32-block).
template <size_t kCols>
MHA_DOTPROD_INLINE void UnitI4(const Int8ActLayout& lay, const uint8_t* arow, size_t u,
                               const uint8_t* const (&wrow)[kCols], const float32x4_t (&ws)[kCols],
                               float32x4_t (&acc)[kCols][4]) {
  const UnitActs a = LoadUnit(lay, arow, u);
  // corr[j] lane l: -8 x lane 4l + j's activation code sum.
  int32x4_t corr[4];
  {
    const int32x4x4_t t =
        vld4q_s32(reinterpret_cast<const int32_t*>(arow + lay.sums_offset) + 16 * u);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) corr[j] = t.val[j];
  }
  uint8x16_t g[kCols][4];
  float32x4_t f[kCols];  // lane j: the activation block's scale times the weight block's
#pragma GCC unroll 4
  for (size_t c = 0; c < kCols; ++c) {
    const uint8x16x4_t t = vld4q_u8(wrow[c] + kI4GroupBytes * u);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) g[c][j] = t.val[j];
    f[c] = vmulq_f32(a.as, ws[c]);
  }
  BlockI4<0>(a, corr, g, f, acc);
  BlockI4<1>(a, corr, g, f, acc);
  BlockI4<2>(a, corr, g, f, acc);
  BlockI4<3>(a, corr, g, f, acc);
}

// Activation row i x weight rows [r0, r0 + kCols), kI4 with 128-blocks (one weight scale per
// unit) or 32-blocks (four; the row's last unit may have fewer).
template <size_t kCols, bool kBlock32>
MHA_DOTPROD_ATTR __attribute__((noinline)) void TileI4(const Int8Call& x, size_t i, size_t r0) {
  const Int8ActLayout& lay = *x.lay;
  const QuantMatrix& w = *x.w;
  const uint8_t* arow = x.Row(i);
  const uint8_t* wrow[kCols];
  const float* wsrow[kCols];
  float32x4_t acc[kCols][4];
#pragma GCC unroll 4
  for (size_t c = 0; c < kCols; ++c) {
    wrow[c] = w.codes + (r0 + c) * w.row_bytes;
    wsrow[c] = w.scales + (r0 + c) * w.scales_per_row;
#pragma GCC unroll 4
    for (size_t j = 0; j < 4; ++j) acc[c][j] = vdupq_n_f32(0.0f);
  }
  // Units whose weight scales are all present.
  const size_t full = kBlock32 ? w.scales_per_row / 4 : lay.units;
  for (size_t u = 0; u < full; ++u) {
    float32x4_t ws[kCols];
#pragma GCC unroll 4
    for (size_t c = 0; c < kCols; ++c) {
      ws[c] = kBlock32 ? vld1q_f32(wsrow[c] + 4 * u) : vdupq_n_f32(wsrow[c][u]);
    }
    UnitI4<kCols>(lay, arow, u, wrow, ws, acc);
  }
  if (full < lay.units) {
    float32x4_t ws[kCols];
#pragma GCC unroll 4
    for (size_t c = 0; c < kCols; ++c) {
      float last[4] = {};
      std::memcpy(last, wsrow[c] + 4 * full, (w.scales_per_row - 4 * full) * sizeof(float));
      ws[c] = vld1q_f32(last);
    }
    UnitI4<kCols>(lay, arow, full, wrow, ws, acc);
  }
#pragma GCC unroll 4
  for (size_t c = 0; c < kCols; ++c) x.Out(i, r0 + c) = LaneTree(acc[c]);
}

template <size_t kCols>
struct I8Kernel {
  MHA_DOTPROD_INLINE static void Run(const Int8Call& x, size_t i, size_t r0) {
    TileI8<kCols>(x, i, r0);
  }
};
template <size_t kCols>
struct I4Kernel {
  MHA_DOTPROD_INLINE static void Run(const Int8Call& x, size_t i, size_t r0) {
    if (x.w->block == kI4Block) {
      TileI4<kCols, true>(x, i, r0);
    } else {
      TileI4<kCols, false>(x, i, r0);
    }
  }
};

// Blocks of kInt8BlockRows activation rows (their quantized rows stay in L2); within a block, the
// weight rows kCols at a time (the last 1..kCols - 1 one by one), each against the block's rows
// (its codes stay in L1 across them): the weights are read from memory once per block.
template <size_t kCols, template <size_t> class Kernel>
MHA_DOTPROD_ATTR void AllTiles(const Int8Call& x, size_t rows) {
  for (size_t b0 = 0; b0 < rows; b0 += kInt8BlockRows) {
    const size_t end = std::min(rows, b0 + kInt8BlockRows);
    size_t r0 = 0;
    for (; r0 + kCols <= x.w->rows; r0 += kCols) {
      for (size_t i = b0; i < end; ++i) Kernel<kCols>::Run(x, i, r0);
    }
    for (; r0 < x.w->rows; ++r0) {
      for (size_t i = b0; i < end; ++i) Kernel<1>::Run(x, i, r0);
    }
  }
}

}  // namespace
}  // namespace gemv_int8_neon_dotprod

MHA_DOTPROD_ATTR void GemvInt8NeonDotProd(const uint8_t* qa, size_t rows, const QuantMatrix& w,
                                          const MatrixView& c) {
  namespace v = gemv_int8_neon_dotprod;
  const Int8ActLayout lay = Int8ActLayoutOf(w.type, w.block, w.cols);
  const Int8Call x{qa, &lay, &w, c.data, c.row_stride, c.col_stride};
  if (w.type == DType::kI8) {
    v::AllTiles<v::kI8Cols, v::I8Kernel>(x, rows);
  } else {
    v::AllTiles<v::kI4Cols, v::I4Kernel>(x, rows);
  }
}

}  // namespace kernels
}  // namespace mha

#endif  // defined(__aarch64__)
