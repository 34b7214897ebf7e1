// The int8 dot-product decode kernels (decode_int8.h): kernel choice, the shared block
// quantization, and the portable kernel, a direct transcription of the definition in integer
// arithmetic (exact), which the VNNI kernel (decode_int8_avx512vnni.cc) must match bit for bit.
#include "kernels/decode_int8.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>

#include "hwy/detect_targets.h"
#include "kernels/cpu_features.h"
#include "kernels/decode.h"
#include "kernels/decode_int8_native.h"
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
  if (ActiveTarget() == HWY_AVX3_DL && DecodeDotKernelAvailable(DecodeDotKernel::kAvx512Vnni)) {
    return DecodeDotKernel::kAvx512Vnni;
  }
#endif
  return DecodeDotKernel::kPortable;
}

void QuantizeWeightsBlock(const float* p, const float* value_scales, size_t count, uint8_t* codes,
                          float* scale) {
  assert(count <= kDotValueBlock);
  float w[kDotValueBlock];
  float m = 0.0f;
  bool finite = true;
  for (size_t i = 0; i < count; ++i) {
    w[i] = p[i] * value_scales[i];
    finite = finite && std::isfinite(w[i]);
    m = std::max(m, w[i]);
  }
  std::memset(codes, 0, kDotValueBlock);
  if (!finite) {
    *scale = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (m < 0x1p-100f) {
    *scale = 0.0f;
    return;
  }
  *scale = m / 255.0f;
  const float inv = 255.0f / m;
  for (size_t i = 0; i < count; ++i) {
    const float c = std::min(std::max(w[i] * inv, 0.0f), 255.0f);
    // nearbyint rounds half to even in the default rounding mode, as VCVTPS2DQ does.
    codes[i] = static_cast<uint8_t>(std::nearbyint(c));
  }
}

namespace {

// Quantized query rows: codes zero-padded to a multiple of 64 (the VNNI kernel reads 64-byte
// chunks), their f32 scales and code sums.
void QuantizeQueryRow(const float* q, size_t hd, int8_t* codes, float* scale, int32_t* sum) {
  QuantizeRowI8(q, hd, codes, scale);
  std::memset(codes + hd, 0, (hd + 63) / 64 * 64 - hd);
  int32_t s = 0;
  for (size_t d = 0; d < hd; ++d) s += codes[d];
  *sum = s;
}

void ScoresPortable(const float* q, size_t rows, ptrdiff_t q_stride, const int8_t* keys,
                    ptrdiff_t key_stride, const float* key_scales, size_t n, size_t hd,
                    float* scores, ptrdiff_t score_stride) {
  alignas(64) int8_t qc[kDotMaxHeadDim];
  for (size_t r = 0; r < rows; ++r) {
    float qs;
    int32_t qsum;
    QuantizeQueryRow(q + static_cast<ptrdiff_t>(r) * q_stride, hd, qc, &qs, &qsum);
    float* out = scores + static_cast<ptrdiff_t>(r) * score_stride;
    for (size_t j = 0; j < n; ++j) {
      const int8_t* k = keys + static_cast<ptrdiff_t>(j) * key_stride;
      int32_t dot = 0;
      for (size_t d = 0; d < hd; ++d) dot += int32_t{qc[d]} * int32_t{k[d]};
      out[j] = static_cast<float>(dot) * (qs * key_scales[j]);
    }
  }
}

void ValuesPortable(const float* p, size_t rows, ptrdiff_t p_stride, const int8_t* values,
                    ptrdiff_t value_stride, const float* value_scales, size_t n, size_t hd,
                    float* acc, ptrdiff_t acc_stride) {
  alignas(64) uint8_t codes[kDotValueBlock];
  int32_t sums[kDotMaxHeadDim];
  for (size_t r = 0; r < rows; ++r) {
    const float* pr = p + static_cast<ptrdiff_t>(r) * p_stride;
    float* ar = acc + static_cast<ptrdiff_t>(r) * acc_stride;
    for (size_t b = 0; b < n; b += kDotValueBlock) {
      const size_t count = std::min(kDotValueBlock, n - b);
      float scale;
      QuantizeWeightsBlock(pr + b, value_scales + b, count, codes, &scale);
      std::fill(sums, sums + hd, 0);
      for (size_t j = 0; j < count; ++j) {
        const int8_t* v = values + static_cast<ptrdiff_t>(b + j) * value_stride;
        const int32_t c = codes[j];
        for (size_t d = 0; d < hd; ++d) sums[d] += c * int32_t{v[d]};
      }
      for (size_t d = 0; d < hd; ++d) ar[d] = ar[d] + static_cast<float>(sums[d]) * scale;
    }
  }
}

}  // namespace

void QuantizeQueryRowForDot(const float* q, size_t hd, int8_t* codes, float* scale, int32_t* sum) {
  QuantizeQueryRow(q, hd, codes, scale, sum);
}

void QueryKeyScoresDot(DecodeDotKernel kernel, const float* q, size_t rows, ptrdiff_t q_stride,
                       const int8_t* keys, ptrdiff_t key_stride, const float* key_scales, size_t n,
                       size_t hd, float* scores, ptrdiff_t score_stride) {
  assert(hd <= kDotMaxHeadDim);
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
  assert(hd <= kDotMaxHeadDim);
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
