// bf16 compute products by quantized weights (AttentionConfig::compute kBF16 with weight_dtype
// kI8 / kI4, many rows): c [m, n] = bf16(a) * bf16(w)^T (+ bias), where w [n, k] is a
// QuantMatrix (quant.h) and bf16(w) its dequantized weights (DequantizedWeight) rounded to
// bf16 (nearest even), on the bf16 block kernels of gemm_bf16.h.
//
// Why transposed: w's codes are its rows (an output's weights, k contiguous), which is the
// layout a block kernel reads its a operand in, while its b operand needs pairs of k
// interleaved across 32 columns. So the product runs as c^T = bf16(w) * bf16(a)^T: each k block
// of w's rows is dequantized straight into the kernel's a rows, once per call whatever m is,
// and a is packed transposed (PackBf16Transposed) as the kernel's b, once per group of rows
// (a's rows are the fewer: a prefill's tokens against thousands of outputs).
//
// Numerics: the products and sums of GemmBf16PackedB(a, PackBf16B(bf16(w)^T)) element by
// element (a pair's two products are the same two exact products with the operands swapped,
// summed in the same k order by every kernel), so bitwise that product's c without a bias; the
// bias is added last, after all of k (GemmBf16PackedB's order on every kernel but AMX, which
// starts its tiles from the bias). a rounds as the kernel's own rows do (x86: f32 subnormals to
// zero, as those kernels read bf16 subnormals).
#ifndef MHA_KERNELS_GEMM_BF16_QUANT_H_
#define MHA_KERNELS_GEMM_BF16_QUANT_H_

#include <cstddef>
#include <cstdint>

#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"
#include "kernels/quant.h"

namespace mha {
namespace kernels {

// Packs a^T [a.cols, a.rows] for `kernel` (a [m, k] f32, any strides), each element rounded as
// the kernel rounds its a rows, into dst (PackedBf16Elements(a.cols, a.rows) elements, 64-byte
// aligned): the b operand of GemmBf16QuantB.
PackedBf16B PackBf16Transposed(Bf16Kernel kernel, const ConstMatrixView& a, uint16_t* dst);

// Bytes of scratch GemmBf16QuantB needs for m rows of c (GemmBf16ScratchBytes and a chunk of
// c^T [96, m] f32): a multiple of 64, so a buffer placed after it stays 64-byte aligned.
size_t GemmBf16QuantScratchBytes(size_t m);

// c = bf16(a) * bf16(w)^T, then c[i, j] += bias[j] when bias is not null (bias [n]), with a
// given as at = PackBf16Transposed(kernel, a) (at.k = w.cols, at.n = c.rows, a whole packing:
// col0 0) and w [c.cols, k] quantized (kI8 or kI4). c any strides. Single-threaded, no
// allocation; scratch: GemmBf16QuantScratchBytes(c.rows) bytes, 64-byte aligned, this call's
// only. `kernel` must be available (Bf16KernelAvailable) and the one at was packed for.
void GemmBf16QuantB(Bf16Kernel kernel, const PackedBf16B& at, const QuantMatrix& w,
                    const float* bias, const MatrixView& c, void* scratch);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMM_BF16_QUANT_H_
