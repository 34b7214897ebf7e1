// What the int8 dot-product decode kernels share (decode_int8.h): the portable kernel's query
// quantization, which the VNNI kernel reuses, and the per-ISA entry points. Internal to kernels/.
#ifndef MHA_KERNELS_DECODE_INT8_NATIVE_H_
#define MHA_KERNELS_DECODE_INT8_NATIVE_H_

#include <cstddef>
#include <cstdint>

namespace mha {
namespace kernels {

// QuantizeRowI8 of q's hd values into codes[0, hd), zeros in codes[hd, round_up(hd, 64)); *sum is
// the codes' sum.
void QuantizeQueryRowForDot(const float* q, size_t hd, int8_t* codes, float* scale, int32_t* sum);

// x86-64 only; run only where DecodeDotKernelAvailable(kAvx512Vnni).
void ScoresDotAvx512Vnni(const float* q, size_t rows, ptrdiff_t q_stride, const int8_t* keys,
                         ptrdiff_t key_stride, const float* key_scales, size_t n, size_t hd,
                         float* scores, ptrdiff_t score_stride);
void ValuesDotAvx512Vnni(const float* p, size_t rows, ptrdiff_t p_stride, const int8_t* values,
                         ptrdiff_t value_stride, const float* value_scales, size_t n, size_t hd,
                         float* acc, ptrdiff_t acc_stride);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_DECODE_INT8_NATIVE_H_
