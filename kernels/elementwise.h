// Element-wise kernels the operator needs (plain declarations; per-target code in
// elementwise-inl.h, dispatch in elementwise.cc). All lengths are in elements; pointers need no
// alignment. Arguments: inputs first, then the output (an array updated in place counts as
// output), then lengths.
#ifndef MHA_KERNELS_ELEMENTWISE_H_
#define MHA_KERNELS_ELEMENTWISE_H_

#include <cstddef>
#include <cstdint>

namespace mha {
namespace kernels {

// y[r, c] += bias[c] for a block of rows (row stride in elements).
void AddBiasToRows(const float* bias, float* y, size_t rows, size_t cols, ptrdiff_t row_stride);

// Winograd's sums of a [2h, 2k2] (row stride lda) in 2 x 2 blocks of [h, k2], in one pass:
// s1 = A21 + A22, s2 = s1 - A11, s3 = A11 - A21, s4 = A12 - s2 (each one rounded f32 add or
// subtract, the same on every target), into four [h, k2] arrays of row stride lds (not
// overlapping a). kernels/gemm_strassen.h's StrassenSumsOfA.
void WinogradSums(const float* a, ptrdiff_t lda, size_t h, size_t k2, float* s1, float* s2,
                  float* s3, float* s4, ptrdiff_t lds);

// y[i] *= s.
void ScaleBy(float s, float* y, size_t n);

// y[i] += x[i].
void AddInto(const float* x, float* y, size_t n);

// Conversions for 16-bit storage; bit-exact and identical on every target (tested exhaustively
// for the 16 -> 32 bit direction and at every rounding boundary for 32 -> 16 bit).
// bf16: round to nearest even (the largest floats round to +-inf); NaN stays NaN (sign and top
// payload bits kept, quiet bit 0x0040 set). BF16ToF32 is exact (a shift).
void F32ToBF16(const float* x, uint16_t* y, size_t n);
void BF16ToF32(const uint16_t* x, float* y, size_t n);
// IEEE binary16, round to nearest even; |x| >= 65520 gives +-inf; f16 subnormals are produced
// and read exactly (no flush to zero); NaN stays NaN with the quiet bit set and the top payload
// bits kept (as the x86 F16C instructions). F16ToF32 is exact.
void F16ToF32(const uint16_t* x, float* y, size_t n);
void F32ToF16(const float* x, uint16_t* y, size_t n);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_ELEMENTWISE_H_
