// The int8 dot-product decode kernels (decode_int8.h): kernel choice, the dispatch of the block
// quantization (decode_int8-inl.h, per Highway target), and the portable kernel: decode.h's f32
// kernels on the codes, exact, which the VNNI kernel (decode_int8_avx512vnni.cc) matches bit for
// bit.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/decode_int8.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/decode_int8-inl.h"

#if HWY_ONCE
#include <algorithm>
#include <cassert>
#include <cstring>

#include "kernels/check.h"
#include "kernels/cpu_features.h"
#include "kernels/decode.h"
#include "kernels/decode_int8.h"
#include "kernels/decode_int8_native.h"
#include "kernels/elementwise.h"
#include "kernels/targets.h"

namespace mha {
namespace kernels {

bool DecodeDotKernelAvailable(DecodeDotKernel kernel) {
  switch (kernel) {
    case DecodeDotKernel::kAuto:
    case DecodeDotKernel::kPortable:
      return true;
    case DecodeDotKernel::kAvx512Vnni: {
#if defined(__x86_64__)
      static const bool has = CpuHasAvx512Vnni();
      return has;
#else
      return false;
#endif
    }
  }
  return false;
}

const char* DecodeDotKernelName(DecodeDotKernel kernel) {
  switch (kernel) {
    case DecodeDotKernel::kAuto:
      return "auto";
    case DecodeDotKernel::kPortable:
      return "portable";
    case DecodeDotKernel::kAvx512Vnni:
      return "avx512_vnni";
  }
  return "?";
}

DecodeDotKernel DecodeDotActiveKernel() {
#if defined(__x86_64__)
  // The target Highway dispatches to (MHA_TARGETS narrows it), as Int8ActiveKernel decides.
  if (ActiveTargetIsAvx512() && DecodeDotKernelAvailable(DecodeDotKernel::kAvx512Vnni)) {
    return DecodeDotKernel::kAvx512Vnni;
  }
#endif
  return DecodeDotKernel::kPortable;
}

HWY_EXPORT(QuantizeWeightsBlockHwy);

void QuantizeWeightsBlock(const float* p, const float* value_scales, size_t count, float* codes,
                          float* scale) {
  assert(count <= kDotValueBlock);
  HWY_DYNAMIC_DISPATCH(QuantizeWeightsBlockHwy)(p, value_scales, count, codes, scale);
}

namespace {

// Rows per pass of the portable kernels, whose codes (widened to f32) and sums sit on the stack.
constexpr size_t kPortableRows = 4;

// The definition's scores by decode.h's f32 kernel on the query codes: every product and partial
// sum of codes is an integer below 2^24, so its dot products are exact, and it multiplies each by
// the key's scale (the definition's first rounding); then the query's scale.
void ScoresPortable(const float* q, size_t rows, ptrdiff_t q_stride, const int8_t* keys,
                    ptrdiff_t key_stride, const float* key_scales, size_t n, size_t hd,
                    float* scores, ptrdiff_t score_stride) {
  alignas(64) int8_t qc[kDotMaxHeadDim];
  alignas(64) float qf[kPortableRows][kDotMaxHeadDim];
  float qs[kPortableRows];
  for (size_t r0 = 0; r0 < rows; r0 += kPortableRows) {
    const size_t nr = std::min(kPortableRows, rows - r0);
    for (size_t r = 0; r < nr; ++r) {
      QuantizeRowI8(q + static_cast<ptrdiff_t>(r0 + r) * q_stride, hd, qc, &qs[r]);
      std::copy(qc, qc + hd, qf[r]);
    }
    float* out = scores + static_cast<ptrdiff_t>(r0) * score_stride;
    QueryKeyScores(qf[0], nr, kDotMaxHeadDim, keys, DType::kI8, key_stride, key_scales, n, hd, out,
                   score_stride);
    for (size_t r = 0; r < nr; ++r)
      ScaleBy(qs[r], out + static_cast<ptrdiff_t>(r) * score_stride, n);
  }
}

// The definition's sums by decode.h's f32 kernel per block: the weights' codes as the
// probabilities, scales of 1 (exact products and sums, as above) into a zeroed block sum, which
// is then scaled (ScaleBy) and added (AddInto): the definition's multiplication, then addition.
void ValuesPortable(const float* p, size_t rows, ptrdiff_t p_stride, const int8_t* values,
                    ptrdiff_t value_stride, const float* value_scales, size_t n, size_t hd,
                    float* acc, ptrdiff_t acc_stride) {
  float ones[kDotValueBlock];
  std::fill(ones, ones + kDotValueBlock, 1.0f);
  alignas(64) float cf[kPortableRows][kDotValueBlock];
  alignas(64) float sums[kPortableRows][kDotMaxHeadDim];
  float scale[kPortableRows];
  for (size_t r0 = 0; r0 < rows; r0 += kPortableRows) {
    const size_t nr = std::min(kPortableRows, rows - r0);
    for (size_t b = 0; b < n; b += kDotValueBlock) {
      const size_t count = std::min(kDotValueBlock, n - b);
      for (size_t r = 0; r < nr; ++r) {
        QuantizeWeightsBlock(p + static_cast<ptrdiff_t>(r0 + r) * p_stride + b, value_scales + b,
                             count, cf[r], &scale[r]);
        std::memset(sums[r], 0, hd * sizeof(float));
      }
      AccumulateWeightedValues(cf[0], nr, kDotValueBlock,
                               values + static_cast<ptrdiff_t>(b) * value_stride, DType::kI8,
                               value_stride, ones, count, hd, sums[0], kDotMaxHeadDim);
      for (size_t r = 0; r < nr; ++r) {
        ScaleBy(scale[r], sums[r], hd);
        AddInto(sums[r], acc + static_cast<ptrdiff_t>(r0 + r) * acc_stride, hd);
      }
    }
  }
}

}  // namespace

void QuantizeQueryRowForDot(const float* q, size_t hd, int8_t* codes, float* scale, int32_t* sum) {
  QuantizeRowI8(q, hd, codes, scale);
  // Zeros to a multiple of 64: the VNNI kernel reads 64-byte chunks.
  std::memset(codes + hd, 0, (hd + 63) / 64 * 64 - hd);
  int32_t s = 0;
  for (size_t d = 0; d < hd; ++d) s += codes[d];
  *sum = s;
}

void QueryKeyScoresDot(DecodeDotKernel kernel, const float* q, size_t rows, ptrdiff_t q_stride,
                       const int8_t* keys, ptrdiff_t key_stride, const float* key_scales, size_t n,
                       size_t hd, float* scores, ptrdiff_t score_stride) {
  // The kernels' stack buffers hold kDotMaxHeadDim codes a row (the cache checks at creation).
  MHA_CHECK(hd <= kDotMaxHeadDim, "QueryKeyScoresDot: hd must be <= kDotMaxHeadDim");
  if (rows == 0 || n == 0) return;
  if (kernel == DecodeDotKernel::kAuto) kernel = DecodeDotActiveKernel();
#if defined(__x86_64__)
  if (kernel == DecodeDotKernel::kAvx512Vnni) {
    ScoresDotAvx512Vnni(q, rows, q_stride, keys, key_stride, key_scales, n, hd, scores,
                        score_stride);
    return;
  }
#endif
  ScoresPortable(q, rows, q_stride, keys, key_stride, key_scales, n, hd, scores, score_stride);
}

void AccumulateWeightedValuesDot(DecodeDotKernel kernel, const float* p, size_t rows,
                                 ptrdiff_t p_stride, const int8_t* values, ptrdiff_t value_stride,
                                 const float* value_scales, size_t n, size_t hd, float* acc,
                                 ptrdiff_t acc_stride) {
  MHA_CHECK(hd <= kDotMaxHeadDim, "AccumulateWeightedValuesDot: hd must be <= kDotMaxHeadDim");
  if (rows == 0 || n == 0 || hd == 0) return;
  if (kernel == DecodeDotKernel::kAuto) kernel = DecodeDotActiveKernel();
#if defined(__x86_64__)
  if (kernel == DecodeDotKernel::kAvx512Vnni) {
    ValuesDotAvx512Vnni(p, rows, p_stride, values, value_stride, value_scales, n, hd, acc,
                        acc_stride);
    return;
  }
#endif
  ValuesPortable(p, rows, p_stride, values, value_stride, value_scales, n, hd, acc, acc_stride);
}

}  // namespace kernels
}  // namespace mha
#endif  // HWY_ONCE
