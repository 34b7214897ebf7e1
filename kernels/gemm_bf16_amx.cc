// Bf16Kernel::kAmx: the bf16 block kernel on Intel AMX-BF16 tiles (TDPBF16PS), with the
// AVX-512 epilogue of gemm_bf16_avx512.cc. The contract is Bf16Block's (gemm_bf16_native.h).
// x86-64 only; the tile functions carry the instruction sets' target attribute and run only
// after Bf16KernelAvailable (CPUID, XCR0 and AmxPermitted).
//
// Tiles (palette 1, every tile 16 rows x 64 bytes): tmm0..3 the f32 sums of a 32 x 32 block of
// c (rows 0-15 / 16-31 x columns 0-15 / 16-31 of a panel), tmm4..5 two A tiles (16 rows of a x
// 32 bf16 of k, rows lda * 2 bytes apart), tmm6..7 two B tiles (16 pair rows x 16 columns x 2
// bf16 of the panel, 128 bytes apart: the packing's VNNI layout read as it lies). A 16-row group
// of a that the block's m cuts short is staged into the scratch, zero-padded to 16 rows, so no
// tile reads past a's rows; c's tiles go through a 32 x 32 f32 buffer into the epilogue, which
// stores only the block's rows and columns.
//
// Tile configuration is per thread: each block call loads it and releases the tiles before
// returning, so nothing tile-related outlives a call (the OS saves tile state per thread only
// while it is in use).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kernels/gemm_bf16.h"
#include "kernels/gemm_bf16_native.h"

#define MHA_AMX_ATTR                                                 \
  __attribute__((                                                    \
      target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq," \
             "avx512bf16")))

namespace mha {
namespace kernels {
// Above-baseline code lives in this namespace and the block entry points only
// (tools/cross/check-x86-baseline allows exactly those).
namespace gemm_bf16_amx {
namespace {

// LDTILECFG's 64-byte operand.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of tile i
  uint8_t rows[16];    // rows of tile i
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

// Tiles 0..7 all 16 rows x 64 bytes. A constant: GCC 12's _tile_loadconfig tells the compiler
// it reads only a pointer's worth of its operand, so a configuration built on the stack could
// lose its other stores.
constexpr TileConfig kTileConfig = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

constexpr size_t kTileRows = 16;
constexpr size_t kBlockRows = 32;  // two A tiles
// Bytes between a panel's pair rows: kBf16PanelCols columns x 2 bf16.
constexpr long kPairRowBytes = kBf16PanelCols * 2 * sizeof(uint16_t);

// Rows [row, row + 16) of a (16 * lda bf16 readable from `a16`, rows lda apart), the block's
// 32 x 32 c sums for one panel (tiles 0-1: rows 0-15; with `two`, tiles 2-3 from a16_hi: rows
// 16-31), accumulated onto start [32][32] f32 (rows start_stride bytes apart; 0: one row for
// all, a bias) when it is not null, else from zero, and stored to out (rows out_stride bytes
// apart).
MHA_AMX_ATTR void PanelBlock(const uint16_t* a16, const uint16_t* a16_hi, long a_stride,
                             const uint16_t* panel, size_t depth, bool two, const float* start,
                             long start_stride, float* out, long out_stride) {
  const long half = 16 * out_stride / static_cast<long>(sizeof(float));  // 16 rows down
  const long start_half = 16 * start_stride / static_cast<long>(sizeof(float));
  // GCC 12's tile intrinsics are asm naming no memory operand: barriers order the plain stores
  // and loads of out (and of a's staged rows) around the tile loads and stores.
  __asm__ volatile("" ::: "memory");
  if (start != nullptr) {
    _tile_loadd(0, start, start_stride);
    _tile_loadd(1, start + 16, start_stride);
    if (two) {
      _tile_loadd(2, start + start_half, start_stride);
      _tile_loadd(3, start + start_half + 16, start_stride);
    }
  } else {
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  for (size_t kk = 0; kk < depth; kk += 32) {
    const uint16_t* b = panel + (kk / 2) * 2 * kBf16PanelCols;
    _tile_loadd(6, b, kPairRowBytes);
    _tile_loadd(7, b + 32, kPairRowBytes);
    _tile_loadd(4, a16 + kk, a_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, a16_hi + kk, a_stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, out, out_stride);
  _tile_stored(1, out + 16, out_stride);
  if (two) {
    _tile_stored(2, out + half, out_stride);
    _tile_stored(3, out + half + 16, out_stride);
  }
  __asm__ volatile("" ::: "memory");
}

constexpr long kBufStride = 32 * sizeof(float);

}  // namespace
}  // namespace gemm_bf16_amx

bool AmxPermitted() {
#if defined(__linux__)
  // Linux: ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, once per process (the permission is
  // per process; a function-local static initializes once and thread-safely).
  static const bool permitted = [] {
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtileData = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
  }();
  return permitted;
#else
  return false;
#endif
}

MHA_AMX_ATTR void Bf16BlockAmx(const Bf16Block& blk) {
  using namespace gemm_bf16_amx;  // NOLINT(google-build-using-namespace): this file's helpers
  // A last 16-row group cut short by m: staged, zero-padded, into the scratch (16 rows of at
  // most kBf16BlockDepth bf16: 16 KiB).
  static_assert(kTileRows * kBf16BlockDepth * sizeof(uint16_t) <= kBf16BlockScratchBytes,
                "scratch holds one 16-row group");
  const size_t full_rows = blk.m / kTileRows * kTileRows;
  uint16_t* staged = static_cast<uint16_t*>(blk.scratch);
  if (full_rows < blk.m) {
    const size_t tail = blk.m - full_rows;
    for (size_t r = 0; r < tail; ++r) {
      std::memcpy(staged + r * blk.depth, blk.a + (full_rows + r) * blk.lda,
                  blk.depth * sizeof(uint16_t));
    }
    std::memset(staged + tail * blk.depth, 0, (kTileRows - tail) * blk.depth * sizeof(uint16_t));
  }
  // tileloadd's asm names no memory operand: a compiler barrier orders the writes of the a rows
  // (the caller's and the staging above) before the tile loads.
  __asm__ volatile("" ::: "memory");
  // Row group starting at `row`: its first row and the stride of its rows (bytes).
  const auto group = [&](size_t row, long* stride) -> const uint16_t* {
    if (row < full_rows) {
      *stride = static_cast<long>(blk.lda * sizeof(uint16_t));
      return blk.a + row * blk.lda;
    }
    *stride = static_cast<long>(blk.depth * sizeof(uint16_t));
    return staged;
  };
  // Zeroed once: its rows past a block's are loaded into the tiles but never stored back.
  alignas(64) float buf[kBlockRows * 32] = {};
  // alpha 1, unit column stride and beta 0 or 1 (the attention core's scores and P V, the
  // projections): the tiles start from c (beta 1, or a later k block), from the bias (the first
  // block: GemmBf16PackedB gives this kernel the bias there) or from zero, and are stored to c
  // as they are, with no epilogue; a block that c's edge cuts short goes through buf with the
  // same tile arithmetic, so every element of c is computed alike.
  const bool zero_start = blk.first && blk.beta == 0.0f;
  const bool in_place = blk.alpha == 1.0f && blk.c_cs == 1 &&
                        (zero_start || (blk.beta == 1.0f && blk.bias == nullptr));
  const bool load = in_place && !zero_start;
  const float* const bias_start = in_place ? blk.bias : nullptr;
  const long c_stride = static_cast<long>(blk.c_rs * static_cast<ptrdiff_t>(sizeof(float)));
  _tile_loadconfig(&kTileConfig);
  // Panels outer (a panel's block, 32 KiB, stays in L1 across the row blocks); rows outer
  // measured the same.
  for (size_t col = 0; col < blk.n; col += kBf16PanelCols) {
    for (size_t row = 0; row < blk.m; row += kBlockRows) {
      const uint16_t* panel = blk.b + (col / kBf16PanelCols) * blk.panel_stride;
      const size_t cols = std::min(kBf16PanelCols, blk.n - col);
      const size_t rows = std::min(kBlockRows, blk.m - row);
      const bool two = rows > kTileRows;
      long stride_lo = 0, stride_hi = 0;
      const uint16_t* lo = group(row, &stride_lo);
      const uint16_t* hi = two ? group(row + kTileRows, &stride_hi) : lo;
      float* const c = blk.c + static_cast<ptrdiff_t>(row) * blk.c_rs + static_cast<ptrdiff_t>(col);
      const bool whole =
          in_place && cols == kBf16PanelCols && (rows == kTileRows || rows == kBlockRows);
      float* const out = whole ? c : buf;
      const long out_stride = whole ? c_stride : kBufStride;
      // Where the tiles start: c (out), the bias (every row from bias[col]: stride 0), or zero.
      const float* start = load ? out : nullptr;
      long start_stride = out_stride;
      if (bias_start != nullptr) {
        start = bias_start + col;
        start_stride = 0;
      }
      if (in_place && !whole && start != nullptr) {
        // c's part of the block (or the bias in every row) into buf's first `rows` rows, zeros
        // in the columns past c's edge. A tile row's sums depend on that row alone, and only
        // the first `rows` rows are stored back, so the rows below keep whatever finite values
        // buf holds (zeros, or an earlier block's sums): filling all 32 x 32 for a decode
        // step's single row cost more than its tile products.
        for (size_t r = 0; r < rows; ++r) {
          for (size_t j = 0; j < 32; ++j) {
            buf[r * 32 + j] = j >= cols               ? 0.0f
                              : bias_start != nullptr ? bias_start[col + j]
                                                      : c[static_cast<ptrdiff_t>(r) * blk.c_rs + j];
          }
        }
        start = buf;
        start_stride = kBufStride;
      }
      // Both A tiles take one stride: a staged group has its own, so such a block runs as
      // two single-group passes.
      if (two && stride_hi != stride_lo) {
        const long down = 16 * start_stride / static_cast<long>(sizeof(float));
        PanelBlock(lo, lo, stride_lo, panel, blk.depth, false, start, start_stride, out,
                   out_stride);
        PanelBlock(hi, hi, stride_hi, panel, blk.depth, false,
                   start != nullptr ? start + down : nullptr, start_stride,
                   out + 16 * out_stride / static_cast<long>(sizeof(float)), out_stride);
      } else {
        PanelBlock(lo, hi, stride_lo, panel, blk.depth, two, start, start_stride, out, out_stride);
      }
      if (whole) continue;
      if (in_place) {
        for (size_t r = 0; r < rows; ++r) {
          std::memcpy(c + static_cast<ptrdiff_t>(r) * blk.c_rs, buf + r * 32, cols * sizeof(float));
        }
      } else {
        Bf16StoreTileAvx512(buf, 32, rows, cols, row, col, blk);
      }
    }
  }
  _tile_release();
}

}  // namespace kernels
}  // namespace mha
