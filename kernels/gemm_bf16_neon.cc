// Bf16BlockNeon (gemm_bf16_native.h): one KC block of a bf16 product with Arm FEAT_BF16's BFDOT.
// This translation unit alone is compiled with -march=armv8.2-a+bf16 (kernels/meson.build, aarch64
// builds only); callers run it only after getauxval(AT_HWCAP2) & HWCAP2_BF16. It includes no
// header that defines out-of-line code (no standard library templates), so no inline function
// compiled for FEAT_BF16 here can be picked by the linker for baseline code elsewhere.
//
// Register tile: kTileRows rows of a x kTileVecs q-registers of c (4 columns each): 5 x 4 = 20
// accumulators, plus the 5 rows' a registers (8 bf16 = 4 k pairs each, broadcast pair by pair
// with BFDOT's lane form) and one b register: 26 of the 32 vector registers, no spill in the k
// loop (GCC 12 -O3 objdump). A whole panel row (8 vectors) would need 8 accumulators per row of
// a, so 4 rows already take all 32 registers; 6 x 4 (31 registers) made GCC spill 4 accumulators
// per 8 k. A packed pair row of a 32-column panel (gemm_bf16.h: 64 bf16, column j at (j % 32) *
// 2, k even then odd) is 8 q-registers; a tile covers half of it (16 columns), so each panel is
// two column tiles. Per 8 k and tile: 5 a loads + 16 b loads for 80 BFDOTs.
//
// Per element of c, each step of k pairs is one BFDOT: acc = acc + (a[2p] * b[2p] + a[2p+1] *
// b[2p+1]) (Arm's BFDotAdd; without FEAT_EBF16 / FPCR.EBF == 0 the products and both sums are
// rounded to odd, denormal inputs and results flushed to zero), one accumulator per element, pairs
// in increasing k. The epilogue is gemm_bf16_native.h's, with explicit vmulq / vaddq (the project
// compiles with -ffp-contract=off, so neither these nor the scalar tail are fused into FMLA).
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_bf16_native.h"

#if !defined(__aarch64__)
#error "gemm_bf16_neon.cc is built for aarch64 only (kernels/meson.build)"
#endif
#if !defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
#error "gemm_bf16_neon.cc needs FEAT_BF16 code generation (-march=armv8.2-a+bf16)"
#endif

#include <arm_neon.h>

namespace mha {
namespace kernels {
namespace {

constexpr size_t kTileRows = 5;
constexpr size_t kTileVecs = 4;
constexpr size_t kTileCols = kTileVecs * 4;      // 16: half a panel
constexpr size_t kPairRow = kBf16PanelCols * 2;  // bf16 elements of one pair row
static_assert(kBf16PanelCols % kTileCols == 0, "a column tile must not straddle panels");
static_assert(kBf16DepthAlign % 8 == 0, "the k loop steps 8 (four pairs per a register)");

inline bfloat16x8_t Load8(const uint16_t* p) { return vreinterpretq_bf16_u16(vld1q_u16(p)); }

// One pair row (lane L of the a registers: k pair L of the current 8 k) of one column tile.
template <size_t R, int L>
inline __attribute__((always_inline)) void PairRow(const uint16_t* b_row, const bfloat16x8_t* av,
                                                   float32x4_t (*acc)[kTileVecs]) {
  for (size_t v = 0; v < kTileVecs; ++v) {
    const bfloat16x8_t bv = Load8(b_row + v * 8);
    for (size_t r = 0; r < R; ++r) acc[r][v] = vbfdotq_laneq_f32(acc[r][v], bv, av[r], L);
  }
}

// acc[r][v] = the block's products of rows r < R of a (a + r * lda) with the 4 columns of vector
// v of the column tile whose first pair row is b.
template <size_t R>
inline __attribute__((always_inline)) void Accumulate(const uint16_t* a, size_t lda, size_t depth,
                                                      const uint16_t* b,
                                                      float32x4_t (*acc)[kTileVecs]) {
  for (size_t r = 0; r < R; ++r) {
    for (size_t v = 0; v < kTileVecs; ++v) acc[r][v] = vdupq_n_f32(0.0f);
  }
  for (size_t k = 0; k < depth; k += 8) {
    bfloat16x8_t av[R];
    for (size_t r = 0; r < R; ++r) av[r] = Load8(a + r * lda + k);
    const uint16_t* b_row = b + (k / 2) * kPairRow;
    PairRow<R, 0>(b_row, av, acc);
    PairRow<R, 1>(b_row + kPairRow, av, acc);
    PairRow<R, 2>(b_row + 2 * kPairRow, av, acc);
    PairRow<R, 3>(b_row + 3 * kPairRow, av, acc);
  }
}

// The epilogue of gemm_bf16_native.h for one element (the scalar path: partial vectors, column
// strides other than 1). Each operation rounded on its own (-ffp-contract=off).
inline float Epilogue(const Bf16Block& blk, float acc, const float* c, size_t j) {
  float x = blk.alpha * acc;
  if (blk.first) {
    if (blk.beta != 0.0f) x = x + blk.beta * *c;
  } else {
    x = *c + x;
  }
  if (blk.bias != nullptr) x = x + blk.bias[j];
  return x;
}

// Writes rows [i0, i0 + R) x columns [j0, j0 + min(kTileCols, n - j0)) of c.
template <size_t R>
void Store(const Bf16Block& blk, size_t i0, size_t j0, float32x4_t (*acc)[kTileVecs]) {
  const size_t cols = blk.n - j0 < kTileCols ? blk.n - j0 : kTileCols;
  const float32x4_t alpha = vdupq_n_f32(blk.alpha);
  const float32x4_t beta = vdupq_n_f32(blk.beta);
  const bool read_c_first = blk.beta != 0.0f;
  for (size_t r = 0; r < R; ++r) {
    float* c_row = blk.c + static_cast<ptrdiff_t>(i0 + r) * blk.c_rs;
    for (size_t v = 0; v < kTileVecs && v * 4 < cols; ++v) {
      const size_t j = j0 + v * 4;
      if (blk.c_cs == 1 && cols - v * 4 >= 4) {
        float* c = c_row + j;
        float32x4_t x = vmulq_f32(alpha, acc[r][v]);
        if (blk.first) {
          if (read_c_first) x = vaddq_f32(x, vmulq_f32(beta, vld1q_f32(c)));
        } else {
          x = vaddq_f32(vld1q_f32(c), x);
        }
        if (blk.bias != nullptr) x = vaddq_f32(x, vld1q_f32(blk.bias + j));
        vst1q_f32(c, x);
      } else {
        float lanes[4];
        vst1q_f32(lanes, acc[r][v]);
        const size_t w = cols - v * 4 < 4 ? cols - v * 4 : 4;
        for (size_t e = 0; e < w; ++e) {
          float* c = c_row + static_cast<ptrdiff_t>(j + e) * blk.c_cs;
          *c = Epilogue(blk, lanes[e], c, j + e);
        }
      }
    }
  }
}

template <size_t R>
void Tile(const Bf16Block& blk, size_t i0, size_t j0, const uint16_t* b) {
  float32x4_t acc[R][kTileVecs];
  Accumulate<R>(blk.a + i0 * blk.lda, blk.lda, blk.depth, b, acc);
  Store<R>(blk, i0, j0, acc);
}

}  // namespace

void Bf16BlockNeon(const Bf16Block& blk) {
  // Columns outer (a column tile's block of b, depth / 2 x 64 bytes, stays in L1 across the
  // rows), rows inner, as BLIS's jr / ir loops.
  for (size_t j0 = 0; j0 < blk.n; j0 += kTileCols) {
    const uint16_t* b =
        blk.b + (j0 / kBf16PanelCols) * blk.panel_stride + (j0 % kBf16PanelCols) * 2;
    size_t i0 = 0;
    for (; i0 + kTileRows <= blk.m; i0 += kTileRows) Tile<kTileRows>(blk, i0, j0, b);
    switch (blk.m - i0) {
      case 4:
        Tile<4>(blk, i0, j0, b);
        break;
      case 3:
        Tile<3>(blk, i0, j0, b);
        break;
      case 2:
        Tile<2>(blk, i0, j0, b);
        break;
      case 1:
        Tile<1>(blk, i0, j0, b);
        break;
      default:
        break;
    }
  }
}

}  // namespace kernels
}  // namespace mha
