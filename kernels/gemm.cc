#include "kernels/gemm.h"

#include <blis.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "kernels/check.h"
#include "kernels/elementwise.h"
#include "kernels/gemm_direct.h"
#include "kernels/gemm_route.h"
#include "kernels/gemv.h"
#include "kernels/gemv_int8.h"
#include "kernels/gemv_quant.h"
#include "kernels/quant.h"
#include "kernels/targets.h"

namespace mha {
namespace kernels {

namespace {

// Upper bound on the packed B panel (KC x NC floats): NC is lowered to fit. Sized to stay in a
// share of L3 with room for the A block; see the blocking note in gemm.h.
constexpr size_t kMaxPackedBBytes = size_t{2} << 20;

// Slack after each packed region, as a precaution: a micro-kernel that loads ahead while
// software-pipelining its k loop may read a little past the last micro-panel, which in BLIS's
// own (pool-allocated, generously sized) pack buffers would go unnoticed.
constexpr size_t kPanelTailBytes = 256;

// KC on AVX-512 targets whose direct kernel runs 6 x 4 tiles (elsewhere the BLIS configuration's,
// 256 on haswell/zen): on an AVX3_DL Xeon, one thread, products of depth 512 1.04-1.10x and of
// depth 1024 1.01x faster than at 256 (1024: slower), forwards of 128+ tokens 2-8% faster; the
// AVX2 tile neutral. Figures and commands: kernels/README.md "Direct micro-kernel tiles".
constexpr size_t kAvx512DirectKc = 512;

size_t RoundUp(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

// Copies `rows` rows of a panel whose source rows are contiguous along k (s_k == 1) into
// dst[p * height + i]: a transpose, done in 4 x 4 (and 2 x 4) register blocks where SSE is
// available, since element-wise it would cost more than the micro-kernel on small products.
// kRows != 0 fixes `rows` at compile time so the loops over i unroll.
template <size_t kRows>
inline void PackTransposed(const float* src, ptrdiff_t s_r, size_t dyn_rows, size_t kc,
                           size_t height, float* dst) {
  const size_t rows = kRows != 0 ? kRows : dyn_rows;
  size_t p = 0;
#if defined(__SSE2__)
  for (; p + 4 <= kc; p += 4) {
    float* d = dst + p * height;
    const float* s = src + p;
    size_t i = 0;
    for (; i + 4 <= rows; i += 4) {
      __m128 r0 = _mm_loadu_ps(s + static_cast<ptrdiff_t>(i) * s_r);
      __m128 r1 = _mm_loadu_ps(s + static_cast<ptrdiff_t>(i + 1) * s_r);
      __m128 r2 = _mm_loadu_ps(s + static_cast<ptrdiff_t>(i + 2) * s_r);
      __m128 r3 = _mm_loadu_ps(s + static_cast<ptrdiff_t>(i + 3) * s_r);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      _mm_storeu_ps(d + i, r0);
      _mm_storeu_ps(d + height + i, r1);
      _mm_storeu_ps(d + 2 * height + i, r2);
      _mm_storeu_ps(d + 3 * height + i, r3);
    }
    for (; i + 2 <= rows; i += 2) {
      const __m128 r0 = _mm_loadu_ps(s + static_cast<ptrdiff_t>(i) * s_r);
      const __m128 r1 = _mm_loadu_ps(s + static_cast<ptrdiff_t>(i + 1) * s_r);
      const __m128 lo = _mm_unpacklo_ps(r0, r1);  // (i, p), (i+1, p), (i, p+1), (i+1, p+1)
      const __m128 hi = _mm_unpackhi_ps(r0, r1);  // the same for p+2, p+3
      _mm_storel_pi(reinterpret_cast<__m64*>(d + i), lo);
      _mm_storeh_pi(reinterpret_cast<__m64*>(d + height + i), lo);
      _mm_storel_pi(reinterpret_cast<__m64*>(d + 2 * height + i), hi);
      _mm_storeh_pi(reinterpret_cast<__m64*>(d + 3 * height + i), hi);
    }
    for (; i < rows; ++i) {
      for (size_t q = 0; q < 4; ++q) d[q * height + i] = s[static_cast<ptrdiff_t>(i) * s_r + q];
    }
  }
#endif
  for (; p < kc; ++p) {
    float* d = dst + p * height;
    for (size_t i = 0; i < rows; ++i) d[i] = src[static_cast<ptrdiff_t>(i) * s_r + p];
  }
}

// Packs one micro-panel: the `rows` x kc block of src with element (i, p) at
// src[i * s_r + p * s_k] (rows <= height) goes to dst[p * height + i], i.e. column p of the
// panel is contiguous, and rows [rows, height) are zero so the micro-kernel can always read
// full panels. A-panels use this directly (rows of A); B-panels use it on B^T (columns of B).
// kHeight != 0 fixes the panel height at compile time so the inner loops unroll.
template <size_t kHeight>
void PackPanel(const float* src, ptrdiff_t s_r, ptrdiff_t s_k, size_t rows, size_t kc,
               size_t dyn_height, float* dst) {
  const size_t height = kHeight != 0 ? kHeight : dyn_height;
  const bool full = rows == height;
  // A partial panel (the edge of A or B) is zeroed first, then its rows are filled in.
  if (!full) std::memset(dst, 0, height * kc * sizeof(float));
  if (s_r == 1) {
    // Each column of the panel is contiguous in src: plain copies (memcpy, since the compiler
    // cannot rule out overlap and would copy element by element; for full panels the size is a
    // compile-time constant and the copy is inlined as vector moves).
    for (size_t p = 0; p < kc; ++p) {
      const float* s = src + static_cast<ptrdiff_t>(p) * s_k;
      float* d = dst + p * height;
      if (full) {
        std::memcpy(d, s, height * sizeof(float));
      } else {
        std::memcpy(d, s, rows * sizeof(float));
      }
    }
  } else if (s_k == 1) {
    // Each row of the panel is contiguous in src: a transpose.
    if (full) {
      PackTransposed<kHeight>(src, s_r, rows, kc, height, dst);
    } else {
      PackTransposed<0>(src, s_r, rows, kc, height, dst);
    }
  } else {
    for (size_t p = 0; p < kc; ++p) {
      const float* s = src + static_cast<ptrdiff_t>(p) * s_k;
      float* d = dst + p * height;
      for (size_t i = 0; i < rows; ++i) d[i] = s[static_cast<ptrdiff_t>(i) * s_r];
    }
  }
}

using PackPanelFn = void (*)(const float*, ptrdiff_t, ptrdiff_t, size_t, size_t, size_t, float*);

// The unrolled packer for the panel heights of BLIS's x86-64 and arm64 sgemm kernels.
PackPanelFn SelectPackPanel(size_t height) {
  switch (height) {
    case 4:
      return &PackPanel<4>;
    case 6:
      return &PackPanel<6>;
    case 8:
      return &PackPanel<8>;
    case 10:
      return &PackPanel<10>;
    case 12:
      return &PackPanel<12>;
    case 16:
      return &PackPanel<16>;
    case 24:
      return &PackPanel<24>;
    case 32:
      return &PackPanel<32>;
    default:
      return &PackPanel<0>;
  }
}

// The micro-kernel and blocking of the BLIS configuration selected at run time. Read once; the
// context is read-only afterwards, so concurrent calls share it without synchronization.
struct Config {
  cntx_t* cntx = nullptr;
  sgemm_ukr_ft kernel = nullptr;
  // True if the kernel is fastest with a row-stored C tile (BLIS "row preference").
  bool prefers_rows = true;
  size_t mr = 0;      // register block: rows of the C tile per kernel call
  size_t nr = 0;      // register block: columns of the C tile
  size_t packmr = 0;  // leading dimension of a packed A micro-panel (>= mr)
  size_t packnr = 0;  // leading dimension of a packed B micro-panel (>= nr)
  size_t mc = 0;      // rows of A packed per ic block (multiple of mr)
  size_t kc = 0;      // depth of one packed A/B block
  size_t nc = 0;      // columns of B packed per jc block (multiple of nr)
  PackPanelFn pack_a = nullptr;
  PackPanelFn pack_b = nullptr;
  size_t b_offset_bytes = 0;      // packed B starts here in the scratch (packed A at 0)
  size_t widen_offset_bytes = 0;  // then one widened 16-bit panel (max(packmr, packnr) x kc)
  size_t scratch_bytes = 0;
};

// Whether the process dispatches to an AVX-512 target whose direct micro-kernel runs 6 x 4 tiles
// (64 columns) over this configuration's row-preferring NR-wide micro-panels. Decided once, at
// the first GEMM call: a target forced later (tests) keeps the blocking.
bool Avx512DirectTiles(const Config& cfg) {
  return ActiveTargetIsAvx512() && cfg.prefers_rows && GemmDirectRunsPanels(cfg.nr);
}

Config MakeConfig() {
  // MHA_TARGETS may ask BLIS for another configuration: before BLIS's first use (targets.h).
  TargetsFromEnvironment();
  bli_init();
  Config cfg;
  cfg.cntx = bli_gks_query_cntx();
  cntx_t* cntx = cfg.cntx;
  cfg.kernel =
      reinterpret_cast<sgemm_ukr_ft>(bli_cntx_get_l3_nat_ukr_dt(BLIS_FLOAT, BLIS_GEMM_UKR, cntx));
  cfg.prefers_rows = bli_cntx_l3_nat_ukr_prefers_rows_dt(BLIS_FLOAT, BLIS_GEMM_UKR, cntx);
  // For the register blocks BLIS keeps the packing dimension (PACKMR/PACKNR) as the "max".
  cfg.mr = static_cast<size_t>(bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_MR, cntx));
  cfg.nr = static_cast<size_t>(bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_NR, cntx));
  cfg.packmr = static_cast<size_t>(bli_cntx_get_blksz_max_dt(BLIS_FLOAT, BLIS_MR, cntx));
  cfg.packnr = static_cast<size_t>(bli_cntx_get_blksz_max_dt(BLIS_FLOAT, BLIS_NR, cntx));
  cfg.packmr = std::max(cfg.packmr, cfg.mr);
  cfg.packnr = std::max(cfg.packnr, cfg.nr);
  cfg.mc =
      RoundUp(static_cast<size_t>(bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_MC, cntx)), cfg.mr);
  cfg.kc = static_cast<size_t>(bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_KC, cntx));
  if (Avx512DirectTiles(cfg)) cfg.kc = kAvx512DirectKc;
  const size_t blis_nc = static_cast<size_t>(bli_cntx_get_blksz_def_dt(BLIS_FLOAT, BLIS_NC, cntx));
  const size_t nc_cap = kMaxPackedBBytes / (cfg.kc * sizeof(float)) / cfg.nr * cfg.nr;
  cfg.nc = RoundUp(std::max(std::min(blis_nc, nc_cap), cfg.nr), cfg.nr);
  cfg.pack_a = SelectPackPanel(cfg.packmr);
  cfg.pack_b = SelectPackPanel(cfg.packnr);

  const size_t a_bytes = (cfg.mc / cfg.mr) * cfg.packmr * cfg.kc * sizeof(float);
  const size_t b_bytes = (cfg.nc / cfg.nr) * cfg.packnr * cfg.kc * sizeof(float);
  cfg.b_offset_bytes = RoundUp(a_bytes + kPanelTailBytes, kGemmScratchAlignment);
  cfg.widen_offset_bytes =
      RoundUp(cfg.b_offset_bytes + b_bytes + kPanelTailBytes, kGemmScratchAlignment);
  const size_t widen_bytes = std::max(cfg.packmr, cfg.packnr) * cfg.kc * sizeof(float);
  cfg.scratch_bytes = RoundUp(cfg.widen_offset_bytes + widen_bytes, kGemmScratchAlignment);
  return cfg;
}

const Config& GetConfig() {
  static const Config config = MakeConfig();
  return config;
}

// Of a block kc deep, how many `unit`-wide panels to pack: `count` (MC rows of A or NC columns
// of B), or in a block deeper than KC as many as the scratch's packed block (count x KC floats)
// holds.
size_t PanelsPerBlock(size_t count, size_t unit, size_t kc_max, size_t kc) {
  if (kc <= kc_max) return count;
  return std::max<size_t>(1, count / unit * kc_max / kc) * unit;
}
size_t RowsPerBlock(const Config& cfg, size_t kc) {
  return PanelsPerBlock(cfg.mc, cfg.mr, cfg.kc, kc);
}
size_t ColumnsPerBlock(const Config& cfg, size_t kc) {
  return PanelsPerBlock(cfg.nc, cfg.nr, cfg.kc, kc);
}

// The depth of the deepest KC block of a depth k > 0: the last one (KcBlockDepth).
size_t DeepestKcBlock(const Config& cfg, size_t k) {
  return k < 2 * cfg.kc ? k : cfg.kc + k % cfg.kc;
}

// One operand of the driver: f32 elements, 16-bit ones (GemmHalfB's weights) that are widened
// exactly to f32 as they are packed, or quantized ones (GemmQuantB's weights) that are
// dequantized as they are packed. Element (i, p) at data[i * row_stride + p * col_stride]; a
// quantized operand is w's elements from (quant_row, quant_col) on, as they lie (weight rows as
// rows, quant_rows true) or transposed (b = w^T: rows along w's columns).
struct Operand {
  const float* f32 = nullptr;
  const uint16_t* half = nullptr;  // used when f32 is null
  DType type = DType::kBF16;
  ptrdiff_t row_stride = 0;
  ptrdiff_t col_stride = 1;
  const QuantMatrix* quant = nullptr;  // used when f32 and half are null
  size_t quant_row = 0, quant_col = 0;
  bool quant_rows = false;

  Operand Transposed() const {
    Operand t = *this;
    t.row_stride = col_stride;
    t.col_stride = row_stride;
    t.quant_rows = !quant_rows;
    return t;
  }
  Operand At(size_t r, size_t c) const {
    const ptrdiff_t off =
        static_cast<ptrdiff_t>(r) * row_stride + static_cast<ptrdiff_t>(c) * col_stride;
    Operand o = *this;
    o.f32 = f32 ? f32 + off : nullptr;
    o.half = half ? half + off : nullptr;
    o.quant_row += quant_rows ? r : c;
    o.quant_col += quant_rows ? c : r;
    return o;
  }
};

// Packs one micro-panel of `rows` rows (rows <= height) and kc columns of `src` into dst (the
// layout of PackPanel). A 16-bit or quantized source must be contiguous along kc (col_stride 1,
// or quant_rows: rows of an nn.Linear weight): its rows are widened or dequantized into `widen`
// (rows x at most cfg.kc floats: a block deeper than KC goes in pieces) and packed from there,
// so the packed panel holds exactly the values a widened (dequantized) f32 matrix would give.
void PackOperandPanel(PackPanelFn pack, const Operand& src, size_t rows, size_t kc, size_t height,
                      float* widen, float* dst) {
  if (src.f32 != nullptr) {
    pack(src.f32, src.row_stride, src.col_stride, rows, kc, height, dst);
    return;
  }
  assert((src.half != nullptr ? src.col_stride == 1 : src.quant_rows) &&
         "GemmHalfB / GemmQuantB: weight operands must be contiguous along k");
  const size_t piece_max = GetConfig().kc;
  for (size_t p0 = 0; p0 < kc; p0 += piece_max) {
    const size_t piece = std::min(piece_max, kc - p0);
    if (src.half == nullptr) {
      DequantizeRows(*src.quant, src.quant_row, rows, src.quant_col + p0, piece, widen, piece);
    }
    for (size_t i = 0; i < rows && src.half != nullptr; ++i) {
      const uint16_t* row = src.half + static_cast<ptrdiff_t>(i) * src.row_stride + p0;
      if (src.type == DType::kBF16) {
        BF16ToF32(row, widen + i * piece, piece);
      } else {
        F16ToF32(row, widen + i * piece, piece);
      }
    }
    // Steps [p0, p0 + piece) of the panel: element (i, p) lies at p * height + i.
    pack(widen, static_cast<ptrdiff_t>(piece), 1, rows, piece, height, dst + p0 * height);
  }
}

// Packs the len x kc block `src` into ceil(len / r) micro-panels of r rows, panel q at
// dst + q * height * kc.
void PackBlock(PackPanelFn pack, const Operand& src, size_t len, size_t kc, size_t r, size_t height,
               float* widen, float* dst) {
  for (size_t i = 0; i < len; i += r) {
    PackOperandPanel(pack, src.At(i, 0), std::min(r, len - i), kc, height, widen, dst);
    dst += height * kc;
  }
}

// |stride| == 1, i.e. the view's elements along that dimension are contiguous.
bool IsUnit(ptrdiff_t stride) { return stride == 1 || stride == -1; }

}  // namespace

size_t GemmScratchBytes() { return GetConfig().scratch_bytes; }

void ScaleC(float beta, const MatrixView& c) {
  for (size_t i = 0; i < c.rows; ++i) {
    float* row = c.data + static_cast<ptrdiff_t>(i) * c.row_stride;
    for (size_t j = 0; j < c.cols; ++j) {
      float& x = row[static_cast<ptrdiff_t>(j) * c.col_stride];
      x = beta == 0.0f ? 0.0f : beta * x;
    }
  }
}

// The two inner loops (BLIS's macro-kernel) over one packed A block [mc, kc] and the first kc
// steps of one packed B block [kc_b, nc] (kc_b >= kc: the B micro-panels' length): MR x NR
// tiles of c, whose (0, 0) is c (strides rs, cs), B panel by B panel. before_panel(j, b1) runs
// before the first tile of B panel j (the driver packs it there, so it is still in L1 when the
// kernel first reads it).
template <class BeforePanel>
void MacroKernel(const Config& cfg, float* a_pack, size_t mc, float* b_pack, size_t kc_b, size_t nc,
                 size_t kc, float* alpha, float* beta, float* c, ptrdiff_t rs, ptrdiff_t cs,
                 const BeforePanel& before_panel) {
  const size_t mr = cfg.mr, nr = cfg.nr;
  const ptrdiff_t ps_a = static_cast<ptrdiff_t>(cfg.packmr * kc);
  const ptrdiff_t ps_b = static_cast<ptrdiff_t>(cfg.packnr * kc_b);
  // Kernel hints, as BLIS's own macro-kernel fills them: panel layouts and strides, and the
  // next micro-panels to prefetch.
  auxinfo_t aux{};
  bli_auxinfo_set_schema_a(BLIS_PACKED_ROW_PANELS, &aux);
  bli_auxinfo_set_schema_b(BLIS_PACKED_COL_PANELS, &aux);
  bli_auxinfo_set_is_a(1, &aux);
  bli_auxinfo_set_is_b(1, &aux);
  bli_auxinfo_set_ps_a(ps_a, &aux);
  bli_auxinfo_set_ps_b(ps_b, &aux);
  const size_t n_iter = (nc + nr - 1) / nr;
  const size_t m_iter = (mc + mr - 1) / mr;
  for (size_t j = 0; j < n_iter; ++j) {
    float* const b1 = b_pack + static_cast<ptrdiff_t>(j) * ps_b;
    float* const c_col = c + static_cast<ptrdiff_t>(j * nr) * cs;
    const dim_t n_cur = static_cast<dim_t>(std::min(nr, nc - j * nr));
    before_panel(j, b1);
    for (size_t i = 0; i < m_iter; ++i) {
      float* const a1 = a_pack + static_cast<ptrdiff_t>(i) * ps_a;
      // Prefetch hints: the next A panel, or at the end of the column of tiles the first A
      // panel again with the next B panel.
      float* a_next = a1 + ps_a;
      float* b_next = b1;
      if (i + 1 == m_iter) {
        a_next = a_pack;
        b_next = j + 1 == n_iter ? b_pack : b1 + ps_b;
      }
      bli_auxinfo_set_next_a(a_next, &aux);
      bli_auxinfo_set_next_b(b_next, &aux);
      const dim_t m_cur = static_cast<dim_t>(std::min(mr, mc - i * mr));
      cfg.kernel(m_cur, n_cur, static_cast<dim_t>(kc), alpha, a1, b1, beta,
                 c_col + static_cast<ptrdiff_t>(i * mr) * rs, rs, cs, &aux, cfg.cntx);
    }
  }
}

// The five loops (see gemm.h) for c [m, n] = alpha * a [m, k] * b [k, n] + beta * c, with
// m, n, k > 0 and alpha != 0, on `route`: kBlisPackAB or kDirectPackB.
void Driver(GemmRoute route, float alpha, const Operand& a, const Operand& b, size_t k, float beta,
            const MatrixView& c, void* scratch) {
  const Config& cfg = GetConfig();

  // The kernel writes its MR x NR tile fastest when C's storage matches its preference; for the
  // other storage it goes through a temporary tile. C^T = B^T A^T turns a column-stored C into
  // a row-stored one (and back), at no cost: only strides and roles swap.
  Operand op_a = a, op_b = b;
  MatrixView op_c = c;
  const bool c_row_stored = IsUnit(c.col_stride) && !IsUnit(c.row_stride);
  const bool c_col_stored = IsUnit(c.row_stride) && !IsUnit(c.col_stride);
  if ((cfg.prefers_rows && c_col_stored) || (!cfg.prefers_rows && c_row_stored)) {
    op_a = b.Transposed();
    op_b = a.Transposed();
    op_c = c.Transposed();
  }
  const size_t m = op_c.rows, n = op_c.cols;
  // NC columns of B per packed block when no block is deeper than KC; fewer when the last one
  // is, so that the packed block stays within the scratch (the columns' bits do not depend on
  // it: each column of c is its own column of b's product).
  const size_t nc_max = ColumnsPerBlock(cfg, DeepestKcBlock(cfg, k));

  float* const a_pack = static_cast<float*>(scratch);
  float* const b_pack = reinterpret_cast<float*>(static_cast<char*>(scratch) + cfg.b_offset_bytes);
  float* const widen =
      reinterpret_cast<float*>(static_cast<char*>(scratch) + cfg.widen_offset_bytes);
  // kDirectPackB: each packed B block is multiplied by a read in place instead of packed A
  // panels through BLIS's kernel. Same arithmetic (the direct kernel's is the 6 x 16 kernel's,
  // and the k blocks accumulate the same way), so the same bits. It reads a in f32 only: a
  // 16-bit a (16-bit weights swapped into a's place for a column-stored c) takes BLIS's.
  if (route == GemmRoute::kDirectPackB && op_a.f32 != nullptr) {
    for (size_t jc = 0; jc < n; jc += nc_max) {
      const size_t nc = std::min(nc_max, n - jc);
      for (size_t pc = 0, kc = 0; pc < k; pc += kc) {
        kc = KcBlockDepth(cfg.kc, k, pc);
        PackBlock(cfg.pack_b, op_b.At(pc, jc).Transposed(), nc, kc, cfg.nr, cfg.packnr, widen,
                  b_pack);
        const ConstMatrixView a_blk{op_a.At(0, pc).f32, m, kc, op_a.row_stride, op_a.col_stride};
        const bool ran = GemmDirectPackedB(alpha, a_blk, PackedB{b_pack, kc, nc, nc, 0, kc},
                                           pc == 0 ? beta : 1.0f, op_c.Block(0, jc, m, nc));
        MHA_CHECK(ran, "kDirectPackB: the direct kernel did not run where the route chose it");
      }
    }
    return;
  }
  float alpha_v = alpha;
  float one = 1.0f;
  for (size_t jc = 0; jc < n; jc += nc_max) {
    const size_t nc = std::min(nc_max, n - jc);
    for (size_t pc = 0, kc = 0; pc < k; pc += kc) {
      kc = KcBlockDepth(cfg.kc, k, pc);
      const size_t mc_max = RowsPerBlock(cfg, kc);
      // B[pc:pc+kc, jc:jc+nc], packed as NR-wide panels (rows of its transpose) by the first
      // ic block, each panel right before the kernel first reads it (so it is still in L1),
      // and reused by the later ic blocks.
      const Operand b_t = op_b.At(pc, jc).Transposed();
      // Later k blocks accumulate onto the first block's result.
      float* beta_p = pc == 0 ? &beta : &one;
      for (size_t ic = 0; ic < m; ic += mc_max) {
        const size_t mc = std::min(mc_max, m - ic);
        PackBlock(cfg.pack_a, op_a.At(ic, pc), mc, kc, cfg.mr, cfg.packmr, widen, a_pack);
        float* const c_blk = op_c.data + static_cast<ptrdiff_t>(ic) * op_c.row_stride +
                             static_cast<ptrdiff_t>(jc) * op_c.col_stride;
        MacroKernel(cfg, a_pack, mc, b_pack, kc, nc, kc, &alpha_v, beta_p, c_blk, op_c.row_stride,
                    op_c.col_stride, [&](size_t jp, float* b1) {
                      if (ic == 0) {
                        const size_t cols = std::min(cfg.nr, nc - jp * cfg.nr);
                        PackOperandPanel(cfg.pack_b, b_t.At(jp * cfg.nr, 0), cols, kc, cfg.packnr,
                                         widen, b1);
                      }
                    });
      }
    }
  }
}

namespace {

// Floats of one packed KC-deep block of a [k, n] operand (all of its NR-wide micro-panels).
size_t PackedBlockFloats(const Config& cfg, size_t kc, size_t n) {
  return (n + cfg.nr - 1) / cfg.nr * cfg.packnr * kc;
}

}  // namespace

size_t PackedBFloats(size_t k, size_t n) {
  const Config& cfg = GetConfig();
  return RoundUp(PackedBlockFloats(cfg, k, n) + kPanelTailBytes / sizeof(float),
                 kGemmScratchAlignment / sizeof(float));
}

PackedB PackBColumns(const ConstMatrixView& b, size_t c0, size_t nc, float* dst) {
  assert(reinterpret_cast<uintptr_t>(dst) % kGemmScratchAlignment == 0 &&
         "PackBColumns: dst must be 64-byte aligned");
  const Config& cfg = GetConfig();
  assert(c0 % cfg.nr == 0 && "PackBColumns: c0 must be a multiple of NR");
  assert(c0 + nc <= b.cols && "PackBColumns: columns out of range");
  const Operand op{b.data, nullptr, DType::kBF16, b.row_stride, b.col_stride};
  float* block = dst;
  for (size_t pc = 0, kc = 0; pc < b.rows; pc += kc) {
    kc = KcBlockDepth(cfg.kc, b.rows, pc);
    // NR-wide panels of B[pc:pc+kc, c0:c0+nc] are rows of its transpose.
    PackBlock(cfg.pack_b, op.At(pc, c0).Transposed(), nc, kc, cfg.nr, cfg.packnr, nullptr,
              block + c0 / cfg.nr * cfg.packnr * kc);
    block += PackedBlockFloats(cfg, kc, b.cols);
  }
  return {dst, b.rows, nc, b.cols, c0, b.rows};
}

PackedB PackB(const ConstMatrixView& b, float* dst) { return PackBColumns(b, 0, b.cols, dst); }

const GemmBlocks& GemmBlocking() {
  static const GemmBlocks blocks = [] {
    const Config& cfg = GetConfig();
    return GemmBlocks{cfg.mr, cfg.nr, cfg.packnr, cfg.mc, cfg.kc, cfg.prefers_rows};
  }();
  return blocks;
}

namespace {

// Floats of one packed KC-deep block of an [m, k] a operand (all of its MR-tall micro-panels).
size_t PackedABlockFloats(const Config& cfg, size_t kc, size_t m) {
  return (m + cfg.mr - 1) / cfg.mr * cfg.packmr * kc;
}

// The k-block and row-block loops of GemmBlisPackedB and GemmBlisPackedAB over a packed b, for
// c.rows, c.cols, b.k > 0 and alpha != 0: a_block(pc, kc, ic, mc) returns a's packed block
// [ic, ic + mc) x [pc, pc + kc) (MR-tall micro-panels).
template <class ABlock>
void PackedBDriver(const Config& cfg, float alpha, const PackedB& b, float beta,
                   const MatrixView& c, const ABlock& a_block) {
  assert(b.col0 % cfg.nr == 0 && "packed b: col0 must be a multiple of NR");
  assert(b.k <= b.packed_k && "packed b: rows past the packing");
  float alpha_v = alpha;
  float one = 1.0f;
  const float* b_block = b.data;
  for (size_t pc = 0, kc_packed = 0; pc < b.k; pc += kc_packed) {
    // The block's depth in the packing (its micro-panels' length), and the steps of it used:
    // fewer when b is the leading rows of a deeper packing.
    kc_packed = KcBlockDepth(cfg.kc, b.packed_k, pc);
    const size_t kc = std::min(kc_packed, b.k - pc);
    float* beta_p = pc == 0 ? &beta : &one;
    // The micro-kernel only reads the packed panels; BLIS's signature takes them non-const.
    float* const b_pack = const_cast<float*>(b_block) + b.col0 / cfg.nr * cfg.packnr * kc_packed;
    // Row blocks of MC (fewer rows in a block deeper than KC), so each packed A block fits the
    // scratch and stays in L2 across the B panels.
    const size_t mc_max = RowsPerBlock(cfg, kc);
    for (size_t ic = 0; ic < c.rows; ic += mc_max) {
      const size_t mc = std::min(mc_max, c.rows - ic);
      MacroKernel(cfg, a_block(pc, kc, ic, mc), mc, b_pack, kc_packed, c.cols, kc, &alpha_v, beta_p,
                  c.data + static_cast<ptrdiff_t>(ic) * c.row_stride, c.row_stride, c.col_stride,
                  [](size_t, float*) {});
    }
    b_block += PackedBlockFloats(cfg, kc_packed, b.packed_n);
  }
}

}  // namespace

void GemmBlisPackedB(float alpha, const ConstMatrixView& a, const PackedB& b, float beta,
                     const MatrixView& c, void* scratch) {
  assert(a.rows == c.rows && "GemmBlisPackedB: a.rows must equal c.rows");
  assert(b.n == c.cols && "GemmBlisPackedB: b.n must equal c.cols");
  assert(a.cols == b.k && "GemmBlisPackedB: a.cols must equal b.k");
  assert(b.col0 + b.n <= b.packed_n && "GemmBlisPackedB: columns past the packing");
  assert(reinterpret_cast<uintptr_t>(scratch) % kGemmScratchAlignment == 0 &&
         "GemmBlisPackedB: scratch must be 64-byte aligned");
  if (c.rows == 0 || c.cols == 0) return;
  if (b.k == 0 || alpha == 0.0f) {
    ScaleC(beta, c);
    return;
  }
  const Config& cfg = GetConfig();
  const Operand op_a{a.data, nullptr, DType::kBF16, a.row_stride, a.col_stride};
  float* const a_pack = static_cast<float*>(scratch);
  PackedBDriver(cfg, alpha, b, beta, c, [&](size_t pc, size_t kc, size_t ic, size_t mc) {
    PackBlock(cfg.pack_a, op_a.At(ic, pc), mc, kc, cfg.mr, cfg.packmr, nullptr, a_pack);
    return a_pack;
  });
}

size_t PackedAFloats(size_t m, size_t k) {
  const Config& cfg = GetConfig();
  size_t floats = 0;
  for (size_t pc = 0, kc = 0; pc < k; pc += kc) {
    kc = KcBlockDepth(cfg.kc, k, pc);
    floats += PackedABlockFloats(cfg, kc, m);
  }
  return RoundUp(floats + kPanelTailBytes / sizeof(float), kGemmScratchAlignment / sizeof(float));
}

PackedA PackA(const ConstMatrixView& a, float* dst) {
  assert(reinterpret_cast<uintptr_t>(dst) % kGemmScratchAlignment == 0 &&
         "PackA: dst must be 64-byte aligned");
  const Config& cfg = GetConfig();
  const Operand op{a.data, nullptr, DType::kBF16, a.row_stride, a.col_stride};
  float* block = dst;
  for (size_t pc = 0, kc = 0; pc < a.cols; pc += kc) {
    kc = KcBlockDepth(cfg.kc, a.cols, pc);
    PackBlock(cfg.pack_a, op.At(0, pc), a.rows, kc, cfg.mr, cfg.packmr, nullptr, block);
    block += PackedABlockFloats(cfg, kc, a.rows);
  }
  return {dst, a.rows, a.cols, a.rows, 0};
}

void GemmBlisPackedAB(float alpha, const PackedA& a, const PackedB& b, float beta,
                      const MatrixView& c) {
  assert(a.m == c.rows && "GemmBlisPackedAB: a.m must equal c.rows");
  assert(b.n == c.cols && "GemmBlisPackedAB: b.n must equal c.cols");
  assert(a.k == b.k && "GemmBlisPackedAB: a.k must equal b.k");
  assert(a.row0 + a.m <= a.packed_m && "GemmBlisPackedAB: rows past the packing");
  assert(b.col0 + b.n <= b.packed_n && "GemmBlisPackedAB: columns past the packing");
  if (c.rows == 0 || c.cols == 0) return;
  if (b.k == 0 || alpha == 0.0f) {
    ScaleC(beta, c);
    return;
  }
  const Config& cfg = GetConfig();
  assert(a.row0 % cfg.mr == 0 && "GemmBlisPackedAB: row0 must be a multiple of MR");
  assert(LeadingKcBlocksAreOwn(cfg.kc, b.packed_k, b.k) &&
         "GemmBlisPackedAB: b's KC blocks must be those of a packing of a.k steps, as a's are");
  // Every k block but the last is KC deep, so block pc / KC starts after pc / KC full blocks.
  const size_t full_block = PackedABlockFloats(cfg, cfg.kc, a.packed_m);
  PackedBDriver(cfg, alpha, b, beta, c, [&](size_t pc, size_t kc, size_t ic, size_t) {
    return const_cast<float*>(a.data) + pc / cfg.kc * full_block +
           (a.row0 + ic) / cfg.mr * cfg.packmr * kc;
  });
}

void Gemm(float alpha, const ConstMatrixView& a, const ConstMatrixView& b, float beta,
          const MatrixView& c, void* scratch) {
  assert(a.rows == c.rows && "Gemm: a.rows must equal c.rows");
  assert(b.cols == c.cols && "Gemm: b.cols must equal c.cols");
  assert(a.cols == b.rows && "Gemm: a.cols must equal b.rows");
  assert(scratch != nullptr && "Gemm: scratch is required");
  assert(reinterpret_cast<uintptr_t>(scratch) % kGemmScratchAlignment == 0 &&
         "Gemm: scratch must be 64-byte aligned");
  if (c.rows == 0 || c.cols == 0) return;
  if (a.cols == 0 || alpha == 0.0f) {
    ScaleC(beta, c);
    return;
  }
  const GemmRoute route = ChooseGemmRoute(
      {c.rows, c.cols, a.cols, DType::kF32, BPacking::kNone, GemvLayoutMatches(a, b)});
  if (route == GemmRoute::kGemv) {
    Gemv(alpha, a, b, beta, c);
    return;
  }
  Driver(route, alpha, {a.data, nullptr, DType::kBF16, a.row_stride, a.col_stride},
         {b.data, nullptr, DType::kBF16, b.row_stride, b.col_stride}, a.cols, beta, c, scratch);
}

void GemmHalfB(float alpha, const ConstMatrixView& a, const HalfMatrixView& b, float beta,
               const MatrixView& c, void* scratch) {
  assert(a.rows == c.rows && "GemmHalfB: a.rows must equal c.rows");
  assert(b.cols == c.cols && "GemmHalfB: b.cols must equal c.cols");
  assert(a.cols == b.rows && "GemmHalfB: a.cols must equal b.rows");
  assert(b.row_stride == 1 && "GemmHalfB: b must be w^T of a row-major weight (row_stride 1)");
  assert(scratch != nullptr && "GemmHalfB: scratch is required");
  assert(reinterpret_cast<uintptr_t>(scratch) % kGemmScratchAlignment == 0 &&
         "GemmHalfB: scratch must be 64-byte aligned");
  if (c.rows == 0 || c.cols == 0) return;
  if (a.cols == 0 || alpha == 0.0f) {
    ScaleC(beta, c);
    return;
  }
  const GemmRoute route =
      ChooseGemmRoute({c.rows, c.cols, a.cols, b.type, BPacking::kNone, a.col_stride == 1});
  if (route == GemmRoute::kGemv) {
    GemvHalf(alpha, a, b, beta, c);
    return;
  }
  Driver(route, alpha, {a.data, nullptr, DType::kBF16, a.row_stride, a.col_stride},
         {nullptr, b.data, b.type, b.row_stride, b.col_stride}, a.cols, beta, c, scratch);
}

void GemmQuantB(const ConstMatrixView& a, const QuantMatrix& w, const MatrixView& c,
                void* scratch) {
  assert(a.rows == c.rows && "GemmQuantB: a.rows must equal c.rows");
  assert(w.rows == c.cols && "GemmQuantB: w.rows must equal c.cols");
  assert(a.cols == w.cols && "GemmQuantB: a.cols must equal w.cols");
  assert(scratch != nullptr && "GemmQuantB: scratch is required");
  assert(reinterpret_cast<uintptr_t>(scratch) % kGemmScratchAlignment == 0 &&
         "GemmQuantB: scratch must be 64-byte aligned");
  if (c.rows == 0 || c.cols == 0) return;
  if (a.cols == 0) {
    ScaleC(0.0f, c);
    return;
  }
  if (w.int8_activations) {
    GemmInt8(a, w, c, scratch);
    return;
  }
  const GemmRoute route =
      ChooseGemmRoute({c.rows, c.cols, a.cols, w.type, BPacking::kNone, a.col_stride == 1});
  if (route == GemmRoute::kGemv) {
    GemvQuant(a, w, c);
    return;
  }
  Operand b;  // w^T: rows along w's columns
  b.half = nullptr;
  b.quant = &w;
  Driver(route, 1.0f, {a.data, nullptr, DType::kBF16, a.row_stride, a.col_stride}, b, a.cols, 0.0f,
         c, scratch);
}

void GemmInit() { GetConfig(); }

const char* GemmArchName() {
  GetConfig();
  return bli_arch_string(bli_arch_query_id());
}

}  // namespace kernels
}  // namespace mha
