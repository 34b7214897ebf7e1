// RoundRowsToBF16Flushed (gemm_bf16_native.h): rows of a rounded to bf16 with AVX512_BF16's
// VCVTNE2PS2BF16, 32 values per instruction, for the kernels that read bf16 operands with
// subnormals as zero (VDPBF16PS, AMX's TDPBF16PS). x86-64 only; called only where
// Bf16KernelAvailable says the CPU has AVX512_BF16.
//
// Why: rounding a's rows runs on every product (q and the probabilities of every strip and key
// block), and F32ToBF16's integer rounding is ~11 instructions per 16 values.
//
// The same bits as RoundRowsToBF16 but for f32 subnormals, which the instruction turns into
// zero of their sign (its DAZ) where RoundRowsToBF16 keeps a bf16 subnormal or rounds to zero:
// the kernels that call it treat a bf16 subnormal as zero too, so their products do not
// change. NaN stays NaN (quieted).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/gemm_bf16_native.h"

#define MHA_AVX512BF16_PACK_ATTR \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace mha {
namespace kernels {

MHA_AVX512BF16_PACK_ATTR void RoundRowsToBF16Flushed(const float* a, ptrdiff_t row_stride,
                                                     size_t rows, size_t cols, size_t padded,
                                                     uint16_t* dst, size_t dst_stride) {
  for (size_t i = 0; i < rows; ++i) {
    const float* x = a + static_cast<ptrdiff_t>(i) * row_stride;
    uint16_t* y = dst + i * dst_stride;
    size_t j = 0;
    for (; j + 32 <= cols; j += 32) {
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + j + 16), _mm512_loadu_ps(x + j));
      _mm512_storeu_si512(y + j, reinterpret_cast<__m512i>(h));
    }
    if (j < cols) {
      // The tail through masked loads (zeros past cols): one more pair of 16 at most.
      const size_t left = cols - j;
      const __mmask16 lo = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
      const __mmask16 hi = left <= 16 ? 0 : static_cast<__mmask16>((1u << (left - 16)) - 1);
      const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + j + 16),
                                             _mm512_maskz_loadu_ps(lo, x + j));
      const __mmask32 out = static_cast<__mmask32>((uint64_t{1} << left) - 1);
      _mm512_mask_storeu_epi16(y + j, out, reinterpret_cast<__m512i>(h));
      j = cols;
    }
    std::memset(y + cols, 0, (padded - cols) * sizeof(uint16_t));
  }
}

}  // namespace kernels
}  // namespace mha
