// Products by quantized weights with dynamically quantized int8 activations (Compute::kInt8,
// README "Quantized weights"): c = a * w^T for w [n, k] in quant.h's layout (kI8 / kI4), every
// row of a quantized to int8 per block as the call starts, integer dot products summed exactly
// in int32 per block, then scaled and summed in f32. Plain declarations; the activation
// quantization and the portable kernel are per-target code in gemv_int8-inl.h (dispatched in
// gemv_int8.cc), the x86 kernels gemv_int8_avx512vnni.cc (AVX512_VNNI) and gemv_int8_avx2.cc,
// the Arm one gemv_int8_neon_dotprod.cc (FEAT_DotProd).
//
// Why: with f32 activations a quantized weight costs a widening, a conversion and an FMA per
// multiply-add (GemvQuant), which one core cannot feed at memory speed; VPDPBUSD multiplies 64
// byte pairs and sums them in four per 32-bit lane in one instruction (Arm's SDOT: 16 pairs).
//
// Arithmetic (the definition every target reproduces bitwise; kernels/README.md "int8
// activations" shows the lane layout):
// - Activation blocks: B = 32 for kI8 weights, B = w.block (32 or 128) for kI4. Per block of a
//   row, amax = max |a| (over the block's elements, zero-padded past k); scale = amax / 127 and
//   inv = 127 / amax (each one f32 division); code = round-to-nearest-even(a * inv) (f32
//   product), clamped to [-127, 127]. A block with amax < kInt8MinAmax (1e-30) has scale 0 and
//   codes 0; a block holding an infinity or NaN has scale NaN (its outputs are NaN).
// - Units of 128 inputs (a kI4 code group), each of 16 lanes: lane L = 4l + j (l, j in 0..3)
//   of unit u holds the exact int sum s[u][L] of code(a) * code(w) over inputs
//   128u + 32j + 4l + {0..3} and the same + 16 (all in 32-block 4u + j, and 128-block u); inputs
//   past k count as code 0.
// - f32 epilogue, each operation rounded (no FMA): acc[L] = 0; for u = 0, 1, ...:
//   acc[L] = acc[L] + float(s[u][L]) * f[u][L], with f = the lane's activation block's scale
//   (kI8), or its f32 product with the lane's weight block's scale (kI4; 0 for a 32-block past
//   the row's last). Then
//   t8[L] = acc[L] + acc[L + 8], t4[L] = t8[L] + t8[L + 4], t2[L] = t4[L] + t4[L + 2],
//   y = t2[0] + t2[1]; kI8: y = y * (the row's weight scale).
// So a row of a gives the same bits whichever rows accompany it, however c is split and on
// every target (the int sums are exact, the f32 operations the same lane by lane).
// Error: the weights' quantization (quant.h) plus the activations': |a - code * scale| is at
// most scale / 2 (plus the f32 rounding of inv and a * inv) per element; README "Quantized
// weights" states the measured error.
#ifndef MHA_KERNELS_GEMV_INT8_H_
#define MHA_KERNELS_GEMV_INT8_H_

#include <cstddef>
#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/quant.h"

namespace mha {
namespace kernels {

// Activation blocks whose largest magnitude is below this quantize to zero (avoids 127 / amax
// overflowing).
inline constexpr float kInt8MinAmax = 1e-30f;

// One row of quantized activations for weights of `type` / `block` and depth k, as the kernels
// read it (internal; row_bytes bytes, 64-byte aligned sections, n_units = ceil(k / 128)):
//   codes  n_units * 128 int8, per unit two 64-byte halves: byte 16l + 4j + i of the first is
//          input 32j + 4l + i of the unit, of the second the same + 16 (the lanes of s above in
//          VPDPBUSD's byte order: dword L of each half feeds lane L); zero past k;
//   scales n_units * 4 f32: block j's scale (the 128-block's repeated four times);
//   sums   n_units * 16 int32: lane L's sum of activation codes times -128 (kI8) or -8 (kI4),
//          the correction of VPDPBUSD's unsigned operand (w + 128, or the kI4 nibble code + 8).
struct Int8ActLayout {
  size_t unit = 0;             // inputs per unit: 128
  size_t units = 0;            // ceil(k / unit)
  size_t block = 0;            // activation block: 32 or 128
  size_t scales_per_unit = 0;  // 4
  size_t scales_offset = 0;    // bytes from the row's start
  size_t sums_offset = 0;
  size_t row_bytes = 0;  // a multiple of 64
};
Int8ActLayout Int8ActLayoutOf(DType type, size_t block, size_t k);

// Quantizes rows [0, rows) of a (row i at a + i * lda, k contiguous floats) into dst (row i at
// dst + i * layout.row_bytes, 64-byte aligned). Bitwise the same on every target.
void QuantizeActivationsInt8(const float* a, size_t lda, size_t rows, size_t k, DType type,
                             size_t block, uint8_t* dst);

// c = a * w^T (c overwritten) by the arithmetic above: a's rows are quantized into scratch in
// row blocks (GemmScratchBytes() bytes, 64-byte aligned), then multiplied. a [m, k] contiguous
// rows, w [n, k], c [m, n] any strides. Single-threaded, no allocation.
void GemmInt8(const ConstMatrixView& a, const QuantMatrix& w, const MatrixView& c, void* scratch);

// The kernels behind GemmInt8, on rows of quantized activations (QuantizeActivationsInt8's
// layout for w): c row i = qa row i times w^T. Int8Kernel names which; kAuto is the VNNI kernel
// where the CPU has AVX512_VNNI and the dispatched Highway target is AVX3_DL, the AVX2 kernel
// where the dispatched target is AVX3 or AVX2 (so MHA_TARGETS=AVX2 times it on any AVX-512 CPU),
// on aarch64 the SDOT kernel where the CPU has FEAT_DotProd (whichever Highway target runs: NEON,
// SVE, or SCALAR on a core without AES), else the portable kernel on the dispatched target. All
// give the same bits.
enum class Int8Kernel { kAuto, kPortable, kAvx2, kAvx512Vnni, kNeonDotProd };
bool Int8KernelAvailable(Int8Kernel kernel);
const char* Int8KernelName(Int8Kernel kernel);
// The kernel kAuto runs on this CPU and dispatched target (never kAuto).
Int8Kernel Int8ActiveKernel();
// How the VNNI kernel streams the weights for a decode product's few rows (at most
// kInt8FewRows): one weight row at a time, or in its tiles of 4 (kI8) / 2 (kI4) rows read in
// lock-step, as it always does for more rows. The same bits either way; only the speed of
// reading the weights from memory differs by CPU (gemv_int8_avx512vnni.cc). kAuto: this CPU's
// (Int8FewRowsOnThisCpu). The other kernels take no such choice.
enum class Int8FewRows { kAuto, kOneWeightRow, kTiled };
inline constexpr size_t kInt8FewRows = 2;
// kAuto's choice: kTiled where the CPU has AMX (Intel's server cores from Sapphire Rapids on),
// else kOneWeightRow.
Int8FewRows Int8FewRowsOnThisCpu();
void GemvInt8Rows(Int8Kernel kernel, const uint8_t* qa, size_t rows, const QuantMatrix& w,
                  const MatrixView& c, Int8FewRows few_rows = Int8FewRows::kAuto);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMV_INT8_H_
