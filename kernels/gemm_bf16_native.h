// The per-ISA bf16 block kernels behind kernels::GemmBf16PackedB (gemm_bf16.h), one
// translation unit each, compiled with the instruction set's target attribute and called only
// after Bf16KernelAvailable says the CPU runs it. Internal to kernels/.
#ifndef MHA_KERNELS_GEMM_BF16_NATIVE_H_
#define MHA_KERNELS_GEMM_BF16_NATIVE_H_

#include <cstddef>
#include <cstdint>

#include "kernels/gemm_bf16.h"

namespace mha {
namespace kernels {

// One KC block of one GemmBf16PackedB call: c [m, n] (+)= alpha * a_block * b_block.
//   a: [m, depth] bf16, row i at a + i * lda, depth a multiple of kBf16DepthAlign (the rows'
//      padding past the product's k is zero).
//   b: the block's first panel holding column 0 of c (a PackedBf16B's col0 resolved), panels
//      panel_stride elements apart, each depth / 2 pair rows of kBf16PanelCols x 2 bf16 (a
//      Rows view's pair rows already skipped).
//   c: element (i, j) at c + i * c_rs + j * c_cs.
// Epilogue per element, each operation rounded (no FMA): first block: c = alpha * acc (beta
// 0, c not read) or alpha * acc + beta * c; later blocks: c = c + alpha * acc; then, with
// bias (the last block only), c = c + bias[j].
struct Bf16Block {
  const uint16_t* a = nullptr;
  size_t lda = 0;
  size_t m = 0;
  size_t depth = 0;
  const uint16_t* b = nullptr;
  size_t panel_stride = 0;
  size_t n = 0;
  float* c = nullptr;
  ptrdiff_t c_rs = 0, c_cs = 1;
  float alpha = 1.0f;
  float beta = 0.0f;
  bool first = true;
  const float* bias = nullptr;
  // kBf16BlockScratchBytes, 64-byte aligned, the kernel's own (AMX: a row group staged;
  // emulated: a row tile of a widened to f32).
  void* scratch = nullptr;
};

inline constexpr size_t kBf16BlockScratchBytes = 16 * 1024;

// x rounded up to a multiple of `to` (depths to kBf16DepthAlign, byte counts to 64).
constexpr size_t RoundUp(size_t x, size_t to) { return (x + to - 1) / to * to; }

// Rows of a the drivers hold in bf16 (one block deep, at the scratch's start): larger products
// run in chunks of this many rows. A multiple of every kernel's row tile (emulated 4 and 8,
// AVX-512 6, AMX 32), so chunks cut no tile short; 96 KiB.
inline constexpr size_t kBf16ChunkRows = 96;
inline constexpr size_t kBf16ChunkRowsBytes = kBf16ChunkRows * kBf16BlockDepth * sizeof(uint16_t);

// The block kernel of `kernel` (available).
using Bf16BlockFn = void (*)(const Bf16Block&);
Bf16BlockFn Bf16BlockFnOf(Bf16Kernel kernel);

// dst row i (depth elements apart) = bf16(x row i)[0, kc), then zeros up to depth: rows of a as
// `kernel` reads them (x86's kernels: f32 subnormals flushed, RoundRowsToBF16Flushed; others
// RoundRowsToBF16). Element (i, p) of x at x[i * row_stride + p * col_stride]; with col_stride
// != 1, kc <= kBf16BlockDepth.
void RoundRowsForKernel(Bf16Kernel kernel, const float* x, ptrdiff_t row_stride,
                        ptrdiff_t col_stride, size_t rows, size_t kc, size_t depth, uint16_t* dst);

// Defined only where compiled (x86-64: AVX512_BF16 and AMX; aarch64: BFDOT).
void Bf16BlockAvx512(const Bf16Block& blk);
void Bf16BlockAmx(const Bf16Block& blk);
// x86-64 with AVX-512F (gemm_bf16_avx512.cc): the epilogue above for a tile of f32 sums acc
// [rows, cols] (rows acc_stride floats apart) at c's rows [row0, row0 + rows) and columns
// [col0, col0 + cols) (bias from bias[col0] when blk.bias is set). The AMX kernel's stores.
void Bf16StoreTileAvx512(const float* acc, size_t acc_stride, size_t rows, size_t cols, size_t row0,
                         size_t col0, const Bf16Block& blk);
// x86-64 with AVX512_BF16 (pack_bf16_avx512.cc): RoundRowsToBF16 (pack_bf16.h) with f32
// subnormals as zero, for the kernels that read bf16 subnormals as zero (kAvx512Bf16, kAmx).
void RoundRowsToBF16Flushed(const float* a, ptrdiff_t row_stride, size_t rows, size_t cols,
                            size_t padded, uint16_t* dst, size_t dst_stride);
// Linux: asks for the AMX tile data permission once; true if granted.
bool AmxPermitted();
void Bf16BlockNeon(const Bf16Block& blk);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMM_BF16_NATIVE_H_
