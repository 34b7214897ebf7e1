// bf16 compute products (AttentionConfig::compute = kBF16): c = alpha * bf16(a) * b + beta * c,
// b packed as bf16 pairs, a f32 rounded to bf16 (nearest even) as the call reads it, products
// accumulated in f32. Plain declarations; the kernels are per-ISA:
//   - kAmx: Intel AMX-BF16 tiles (TDPBF16PS), gemm_bf16_amx.cc, after the OS grants the tile
//     data permission (Linux arch_prctl ARCH_REQ_XCOMP_PERM);
//   - kAvx512Bf16: AVX512_BF16 (VDPBF16PS), gemm_bf16_avx512.cc;
//   - kNeonBf16: Arm FEAT_BF16 (BFDOT), gemm_bf16_neon.cc;
//   - kEmulated: every Highway target (gemm_bf16-inl.h): each bf16 pair widened exactly to two
//     f32 and multiplied with f32 FMAs (the odd element first, as VDPBF16PS), same layout.
// Highway 1.0.3 has no bf16 dot product nor AMX, so the native kernels are written with the
// compiler's intrinsics in their own translation units (compiled with the matching target
// attribute) and called only after a CPU check (Bf16KernelAvailable).
//
// Layout of a packed b [k, n] (PackedBf16B): k in blocks of kBf16BlockDepth, each block's depth
// rounded up to kBf16DepthAlign with zero rows; each block holds ceil(packed_n /
// kBf16PanelCols) panels of kBf16PanelCols columns, zero-padded to whole panels; a panel is
// depth / 2 pair rows, each pair row kBf16PanelCols columns x 2 bf16 (k even, then k odd):
// element (kk, j) of a block at panel (j / 32), pair row kk / 2, offset (j % 32) * 2 + kk % 2.
// This is the VNNI layout AMX's B tiles read (16 columns x 2 per tile row, rows 128 bytes
// apart) and the layout VDPBF16PS and BFDOT read as whole vectors.
//
// a [m, k] f32 (any strides): each call rounds a block of rows x kBf16BlockDepth into the
// caller's scratch as bf16 rows, zero-padded to the block's aligned depth, so the padding of b
// multiplies zeros. b's rows past k inside a panel's aligned depth must be finite (zeros, or
// real rows of a packing that a Rows / LeadingRows view cut short).
//
// Numerics: every product of two bf16 values is exact in f32. Per block of k and element of c,
// acc = the block's products summed in f32 from zero (the order is the kernel's: pairs in
// increasing k, odd then even element, one rounding per add for kAvx512Bf16 and kEmulated,
// which therefore agree bitwise but for subnormals, which VDPBF16PS flushes; AMX and BFDOT sum
// in an order and with intermediate roundings of their own), then c = alpha * acc + beta * c
// (first block; beta == 0 does not read c), c += alpha * acc (later blocks), and bias[j] added
// after the last block: each multiply and add rounded separately (no FMA), the same in every
// kernel. One exception, AMX with alpha 1, c's columns contiguous and beta 0 or 1: its tiles
// start from c (beta 1, or a later block), from the bias (beta 0: bias first, then the
// products) or from zero and are stored to c as they are, the adds onto c being the tiles' own
// (no epilogue pass). The kernel is the caller's (a context's, ContextOptions::bf16_kernel),
// and a row of c depends only on the same row of a, so results do not depend on threads or on how
// callers split rows. Error against exact arithmetic on the f32 inputs: the bf16 rounding of both
// operands (relative 2^-9 each) dominates the f32 accumulation.
#ifndef MHA_KERNELS_GEMM_BF16_H_
#define MHA_KERNELS_GEMM_BF16_H_

#include <cstddef>
#include <cstdint>

#include "kernels/gemm.h"

namespace mha {
namespace kernels {

// Columns of one packed panel (two AMX B tiles, two AVX-512 vectors of f32 accumulators).
inline constexpr size_t kBf16PanelCols = 32;
// k (elements) per packed block: a panel's block is 32 KiB, in L1 across a tile's rows.
inline constexpr size_t kBf16BlockDepth = 512;
// A block's depth is rounded up to this (one AMX A tile row: 32 bf16); callers that view rows
// of a packing from r0 (Rows) take r0 a multiple of it.
inline constexpr size_t kBf16DepthAlign = 32;

// A b [k, n] packed in the layout above, possibly a column range [col0, col0 + n) of a wider
// packing (col0 a multiple of kBf16PanelCols) and/or rows [row0, row0 + k) of a packing one block
// deep. packed_k sets each block's depth (min(kBf16BlockDepth, packed_k - block start), rounded
// up to kBf16DepthAlign).
struct PackedBf16B {
  const uint16_t* data = nullptr;
  size_t k = 0;
  size_t n = 0;
  size_t packed_n = 0;  // columns of the whole packing; >= col0 + n
  size_t col0 = 0;      // first column in the packing, a multiple of kBf16PanelCols
  size_t packed_k = 0;  // rows of the whole packing; >= k (+ the Rows offset)

  PackedBf16B Columns(size_t c0, size_t nc) const {
    return {data, k, nc, packed_n, col0 + c0, packed_k};
  }
  PackedBf16B LeadingRows(size_t kk) const { return {data, kk, n, packed_n, col0, packed_k}; }
  // Rows [r0, r0 + kk) of a packing one block deep (packed_k <= kBf16BlockDepth); r0 a multiple
  // of kBf16DepthAlign: the panels' pair rows start r0 / 2 rows in.
  PackedBf16B Rows(size_t r0, size_t kk) const {
    return {data + r0 * kBf16PanelCols, kk, n, packed_n, col0, packed_k};
  }
};

// bf16 elements PackBf16B writes for a [k, n] b (a multiple of 32: consecutive packings keep a
// 64-byte alignment).
size_t PackedBf16Elements(size_t k, size_t n);

// Packs b [k, n] (f32, any strides), each element rounded to bf16 (nearest even), into dst
// (PackedBf16Elements(k, n) elements, 64-byte aligned). Returns the packed operand.
PackedBf16B PackBf16B(const ConstMatrixView& b, uint16_t* dst);
// The same for a b of 16-bit elements (bf16: copied exactly; f16: widened exactly, rounded to
// bf16 once).
PackedBf16B PackBf16BHalf(const HalfMatrixView& b, uint16_t* dst);

// The native kernels, and the emulation on whatever Highway target dispatch selects.
enum class Bf16Kernel : uint8_t { kEmulated, kAvx512Bf16, kAmx, kNeonBf16 };
const char* Bf16KernelName(Bf16Kernel kernel);  // "emulated", "avx512_bf16", "amx", "neon_bf16"
// Whether this CPU (and OS, for AMX) runs the kernel. kEmulated always.
bool Bf16KernelAvailable(Bf16Kernel kernel);
// The kernel GemmBf16PackedB runs: the fastest available (kAmx, then kAvx512Bf16, kNeonBf16,
// kEmulated), or MHA_BF16_KERNEL=<name> from the environment when that one is available.
Bf16Kernel Bf16ActiveKernel();
// Restricts to `kernel` (must be available); for tests and benchmarks (process-wide, not for
// concurrent use). ForceBf16Kernel(Bf16DefaultKernel()) restores the default.
void ForceBf16Kernel(Bf16Kernel kernel);
Bf16Kernel Bf16DefaultKernel();

// Bytes of scratch one GemmBf16PackedB call needs (a block of a's rows in bf16 and the AMX
// kernel's tile buffers), 64-byte aligned.
size_t GemmBf16ScratchBytes();

// c = alpha * bf16(a) * b + beta * c, then c[i, j] += bias[j] when bias is not null (bias
// [b.n]). Shapes: a [m, b.k], c [m, b.n], any strides (c must not overlap a or b). beta == 0
// does not read c; b.k == 0 or alpha == 0 gives c = beta * c (+ bias). Single-threaded, no
// allocation; scratch: GemmBf16ScratchBytes() bytes, 64-byte aligned, this call's only. Runs on
// `kernel` (which must be available: Bf16KernelAvailable), by default Bf16ActiveKernel().
void GemmBf16PackedB(Bf16Kernel kernel, float alpha, const ConstMatrixView& a, const PackedBf16B& b,
                     float beta, const float* bias, const MatrixView& c, void* scratch);
inline void GemmBf16PackedB(float alpha, const ConstMatrixView& a, const PackedBf16B& b, float beta,
                            const float* bias, const MatrixView& c, void* scratch) {
  GemmBf16PackedB(Bf16ActiveKernel(), alpha, a, b, beta, bias, c, scratch);
}

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMM_BF16_H_
